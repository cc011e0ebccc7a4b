"""`octodsl models SPEC`: bytes per parameter, selective recompute's drop and static bytes,
sharded by --zero over --dp."""

from __future__ import annotations

import json

import pytest

from octodsl.cli import main
from octodsl.costs.analytical import analytical_costs
from octodsl.costs.devices import get_device
from octodsl.models import load_model


def _json(capsys, *argv):
    assert main(["models", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_bytes_per_parameter_and_sharded_static(capsys):
    params = load_model("nemotron-h-8b").params()
    # DeepSpeed's BF16 optimizer at zero 0: a bf16 flat accumulator beside each bf16 .grad
    base = _json(capsys, "nemotron-h-8b")
    assert base["runtime"] == "deepspeed"
    assert base["param_bytes"] == {"weights": 2.0, "grads": 4.0, "optimizer": 12.0, "total": 18.0}
    assert base["static"] == base["static_per_device"] == 18 * params
    one = _json(capsys, "nemotron-h-8b", "--zero", "1", "--dp", "8")
    assert (one["zero"], one["dp"]) == (1, 8)
    assert one["param_bytes"]["total"] == 16.0  # its ZeRO optimizer: no flat accumulator
    assert one["param_bytes_per_device"] == {
        "weights": 2.0,
        "grads": 2.0,
        "optimizer": 1.5,
        "total": 5.5,
    }
    assert one["static_per_device"] == pytest.approx(5.5 * params)
    # Megatron's distributed optimizer: 6 + 12/d, at zero 2 too (the fp32 buffer stays whole)
    megatron = _json(capsys, "nemotron-h-8b", "--zero", "1", "--dp", "8", "--target", "megatron")
    assert megatron["param_bytes_per_device"]["total"] == 6 + 12 / 8
    two = _json(capsys, "nemotron-h-8b", "--zero", "2", "--dp", "8")
    assert two["runtime"] == "megatron"
    assert two["param_bytes_per_device"] == megatron["param_bytes_per_device"]
    kinds = {k["kind"]: k for k in two["kinds"]}
    layers = analytical_costs(load_model("nemotron-h-8b"), get_device("H800")).layers
    mamba = next(layer for layer in layers if layer.kind == "mamba2")
    assert kinds["mamba2"]["static"] == pytest.approx(mamba.params * 7.5)
    assert kinds["mamba2"]["sel_act"] == mamba.sel_act > 0


def test_table_shows_the_bytes_per_parameter(capsys):
    assert main(["models", "nemotron-h-8b", "--zero", "1"]) == 0
    out = capsys.readouterr().out
    assert "as DeepSpeed holds them" in out and "2 + 2 + 12 = 16 bytes" in out
    assert "copies" not in out
    assert main(["models", "jamba-tiny"]) == 0
    assert "4 + 4 + 8 = 16 bytes" in capsys.readouterr().out  # an fp32 model
    assert main(["models", "nemotron-h-8b", "--zero", "1", "--dp", "8"]) == 0
    out = capsys.readouterr().out
    assert (
        "on one of 8 copies with ZeRO 1: 2 + 2 + 1.5 = 5.5 bytes" in out
        and "static MiB / copy" in out
    )
    # DeepSpeed's BF16 optimizer shards the optimizer state over the copies at zero 0 too
    assert main(["models", "nemotron-h-8b", "--dp", "8"]) == 0
    assert "on one of 8 copies with ZeRO 0: 2 + 4 + 1.5 = 7.5 bytes" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--zero", "3"], "--zero: must be at most 2"),
        (["--dp", "0"], "--dp: must be at least 1"),
        (["--zero", "2", "--dp", "2", "--target", "deepspeed"], "takes ZeRO 0 to 1 only"),
        (["--target", "jax"], "invalid choice"),
    ],
)
def test_bad_levers_are_messages(capsys, argv, message):
    assert main(["models", "nemotron-h-8b", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
