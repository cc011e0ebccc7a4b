"""The header's `grad_accum_dtype`: written by gen, read by the parser, kept by fmt, checked by
lint (E408; an unknown name's E111 beside the runtime's, test_runtime_fields.py) and by
simulate and tune, written into the ds_config by convert, and what it changes in the costs
(octodsl.costs.param_bytes)."""

from __future__ import annotations

import json

import pytest

from octodsl.cli import main
from octodsl.cli.fmt import format_source
from octodsl.gen import generate_text
from octodsl.interop.deepspeed_out import deepspeed_snippet
from octodsl.lang import parse_plan
from octodsl.lint import lint_source

BLOOM_LIKE = {"dp": 2, "zero": 1, "reduce_scatter": False}
"""DeepSpeed's BF16 optimizer: where DeepSpeed accumulates a bf16 model's gradients in fp32."""


def _plan(**mesh) -> str:
    return generate_text("1f1b", 2, 4, model="llama3-8b", partition="megatron", mesh=mesh)


def _codes(text: str) -> list[str]:
    return [d.code for d in lint_source(text, "p.octo")[1]]


def test_the_field_round_trips_through_gen_parse_and_fmt():
    text = _plan(**BLOOM_LIKE, grad_accum_dtype="fp32")
    assert "  grad_accum_dtype fp32\n" in text
    assert parse_plan(text, path="p").header.grad_accum_dtype == "fp32"
    assert format_source(text) == text
    assert _codes(text) == []
    assert "grad_accum_dtype" not in _plan()  # none written: the runtime's own


@pytest.mark.parametrize(
    "mesh,ok",
    [
        ({**BLOOM_LIKE, "grad_accum_dtype": "fp32"}, True),
        ({"grad_accum_dtype": "bf16"}, True),  # DeepSpeed's own: the model's dtype
        ({"runtime": "megatron", "grad_accum_dtype": "fp32"}, True),  # Megatron's own for bf16
        ({"grad_accum_dtype": "fp32"}, False),  # zero 0: DeepSpeed refuses the mix
        ({"dp": 2, "zero": 1, "grad_accum_dtype": "fp32"}, False),  # its BF16 optimizer all-reduces
        ({"runtime": "megatron", "grad_accum_dtype": "bf16"}, False),  # validate_args forces fp32
        ({"grad_accum_dtype": "fp16"}, False),
    ],
)
def test_a_dtype_the_runtime_does_not_accumulate_in_is_an_error(mesh, ok):
    diags = [d for d in lint_source(_plan(**mesh), "p.octo")[1] if d.code == "E408"]
    assert (not diags) == ok
    if not ok:
        assert (
            len(diags) == 1 and f"grad_accum_dtype {mesh['grad_accum_dtype']}" in diags[0].message
        )
        assert diags[0].span is not None  # points at the field


def _simulated(capsys, path, *options) -> dict:
    assert main(["simulate", str(path), "--json", *options]) == 0
    return json.loads(capsys.readouterr().out)


def test_fp32_accumulation_holds_a_buffer_and_moves_more_bytes(tmp_path, capsys):
    plan = tmp_path / "p.octo"
    plan.write_text(_plan(**BLOOM_LIKE))
    bf16 = _simulated(capsys, plan)
    fp32 = _simulated(capsys, plan, "--grad-accum-dtype", "fp32")
    # DeepSpeed's BF16 optimizer: the bf16 .grad and the fp32 buffer beside it
    assert (bf16["param_bytes"]["grads"], fp32["param_bytes"]["grads"]) == (2.0, 6.0)
    # each W's accumulation pass reads and writes fp32 (2 + 4 + 4 bytes, not 2 + 2 + 2): slower
    assert fp32["iteration_time"] > bf16["iteration_time"]
    # the reduction moves the model's dtype either way (DeepSpeed's communication_data_type)
    assert fp32["allreduce_time"] == pytest.approx(bf16["allreduce_time"])
    assert (bf16["param_bytes"]["grad_accum_dtype"], fp32["param_bytes"]["grad_accum_dtype"]) == (
        "bf16",
        "fp32",
    )
    assert fp32["param_bytes"]["grad_reduce_bytes"] == 2.0
    megatron = _simulated(capsys, plan, "--target", "megatron")
    assert megatron["param_bytes"]["grad_reduce_bytes"] == 4.0  # Megatron's fp32 main_grad
    assert megatron["param_bytes"]["grad_accum_dtype"] == "fp32"


def test_simulate_and_tune_refuse_a_dtype_the_runtime_does_not_run(tmp_path, capsys):
    plan = tmp_path / "p.octo"
    plan.write_text(_plan(dp=2))
    assert main(["simulate", str(plan), "--grad-accum-dtype", "fp32"]) == 2
    err = capsys.readouterr().err
    assert "grad_accum_dtype fp32 with zero 0" in err and len(err.splitlines()) == 1
    out = tmp_path / "t.octo"
    assert main(["tune", "--from", str(plan), "--grad-accum-dtype", "fp16", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "in bf16 (or fp32 at zero 1), not fp16" in err and len(err.splitlines()) == 1
    assert not out.exists()
    assert main(["tune", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "32",
                 "--grad-accum-dtype", "fp32", "-o", str(out)]) == 2  # fmt: skip
    assert "--grad-accum-dtype" in capsys.readouterr().err


def test_tune_keeps_the_from_plans_dtype(tmp_path, capsys):
    plan = tmp_path / "p.octo"
    plan.write_text(_plan(**BLOOM_LIKE, grad_accum_dtype="fp32"))
    out = tmp_path / "t.octo"
    assert main(["tune", "--from", str(plan), "--evaluations", "20", "-o", str(out)]) == 0
    assert parse_plan(out.read_text(), path="t").header.grad_accum_dtype == "fp32"


def test_convert_writes_it_into_the_ds_config():
    text = _plan(**BLOOM_LIKE, grad_accum_dtype="fp32")
    snippet = deepspeed_snippet(parse_plan(text, path="p")).text
    assert '"data_types": {\n        "grad_accum_dtype": "fp32"' in snippet
    assert "data_types" not in deepspeed_snippet(parse_plan(_plan(**BLOOM_LIKE), path="p")).text
