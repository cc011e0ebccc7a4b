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
    base = _json(capsys, "nemotron-h-8b")
    assert base["param_bytes"] == {"weights": 2.0, "grads": 2.0, "optimizer": 12.0, "total": 16.0}
    assert base["static"] == base["static_per_device"] == 16 * load_model("nemotron-h-8b").params()
    one = _json(capsys, "nemotron-h-8b", "--zero", "1", "--dp", "8")
    assert (one["zero"], one["dp"]) == (1, 8)
    assert one["param_bytes_per_device"] == {
        "weights": 2.0,
        "grads": 2.0,
        "optimizer": 1.5,
        "total": 5.5,
    }
    assert one["static_per_device"] == pytest.approx(base["static"] * 5.5 / 16)
    two = _json(capsys, "nemotron-h-8b", "--zero", "2", "--dp", "8")
    assert two["param_bytes_per_device"]["grads"] == 0.25
    kinds = {k["kind"]: k for k in two["kinds"]}
    layers = analytical_costs(load_model("nemotron-h-8b"), get_device("H800")).layers
    mamba = next(layer for layer in layers if layer.kind == "mamba2")
    assert kinds["mamba2"]["static"] == pytest.approx(mamba.static * 3.75 / 16)
    assert kinds["mamba2"]["sel_act"] == mamba.sel_act > 0


def test_table_shows_the_bytes_per_parameter(capsys):
    assert main(["models", "nemotron-h-8b"]) == 0
    out = capsys.readouterr().out
    assert "2 + 2 + 12 = 16 bytes" in out and "copies" not in out
    assert main(["models", "jamba-tiny"]) == 0
    assert "4 + 4 + 8 = 16 bytes" in capsys.readouterr().out  # an fp32 model
    assert main(["models", "nemotron-h-8b", "--zero", "1", "--dp", "8"]) == 0
    out = capsys.readouterr().out
    assert (
        "on one of 8 copies with ZeRO 1: 2 + 2 + 1.5 = 5.5 bytes" in out
        and "static MiB / copy" in out
    )


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--zero", "3"], "--zero: must be at most 2"),
        (["--dp", "0"], "--dp: must be at least 1"),
    ],
)
def test_bad_levers_are_messages(capsys, argv, message):
    assert main(["models", "nemotron-h-8b", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
