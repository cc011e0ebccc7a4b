"""The header's runtime fields: written by gen, read by the parser, kept by fmt, checked by
lint (E405, W405, W406, W703, E704), turned into Megatron's flags by convert."""

from __future__ import annotations

import pytest

from octodsl.cli import main
from octodsl.cli.fmt import format_source
from octodsl.gen import generate_text
from octodsl.interop.export import ExportError
from octodsl.interop.megatron import megatron_args
from octodsl.lang import parse_plan
from octodsl.lint import lint_source
from octodsl.partition import megatron_layers
from octodsl.plan import RUNTIME_FIELDS, Header


def _plan(**mesh) -> str:
    return generate_text("1f1b", 2, 4, model="llama3-8b", partition="megatron", mesh=mesh)


def _codes(text: str) -> list[str]:
    return [d.code for d in lint_source(text, "p.octo")[1]]


def test_every_runtime_field_round_trips_through_gen_parse_and_fmt():
    mesh = {name: not Header.model_fields[name].default for name in RUNTIME_FIELDS}
    text = generate_text("1f1b", 2, 4, model="llama3-8b", mesh={"tp": 2, **mesh})
    h = parse_plan(text, path="p").header
    assert {name: getattr(h, name) for name in RUNTIME_FIELDS} == mesh
    assert format_source(text) == text  # gen writes the canonical form
    # the defaults that are true, written as set
    assert "overlap_p2p_comm false" in text and "reduce_scatter false" in text


@pytest.mark.parametrize(
    "field,code",
    [
        ("overlap_param_gather true", "E405"),
        ("overlap_grad_reduce true", "W405"),
        ("overlap_tp_comm true", "W703"),
    ],
)
def test_an_overlap_with_nothing_to_overlap_is_reported(field, code):
    text = _plan().replace("  microbatches 4\n", f"  microbatches 4\n  {field}\n")
    assert code in _codes(text)


def test_reduce_scatter_false_needs_zero():
    text = _plan().replace("  microbatches 4\n", "  microbatches 4\n  reduce_scatter false\n")
    assert "W406" in _codes(text)
    assert "W406" not in _codes(
        text.replace("  microbatches 4\n", "  microbatches 4\n  dp 2\n  zero 1\n")
    )


def test_tp_overlap_needs_sequence_parallelism():
    text = _plan(tp=2, sequence_parallel=False, overlap_tp_comm=True)
    assert "E704" in _codes(text)
    assert "E704" not in _codes(_plan(tp=2, overlap_tp_comm=True))


def test_a_runtime_field_must_be_true_or_false():
    text = _plan().replace("  microbatches 4\n", "  microbatches 4\n  overlap_p2p_comm 1\n")
    assert "E111" in _codes(text)


def test_convert_to_megatron_emits_the_overlap_flags():
    text = generate_text(
        "1f1b",
        2,
        4,
        model="llama3-8b",
        partition="megatron",
        mesh={
            "tp": 2,
            "overlap_tp_comm": True,
            "overlap_grad_reduce": True,
            "overlap_param_gather": True,
            "overlap_p2p_comm": False,
            "grad_accumulation_fusion": True,
        },
    )
    text = text.replace("  tp 2\n", "  tp 2\n  dp 4\n  zero 1\n")
    args = megatron_args(parse_plan(text, path="p")).text
    for flag in (
        "--tp-comm-overlap",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--no-overlap-p2p-communication",
    ):
        assert flag in args
    assert "--no-gradient-accumulation-fusion" not in args
    plain = megatron_args(parse_plan(_plan(), path="p")).text
    assert "--no-gradient-accumulation-fusion" in plain and "--overlap-grad-reduce" not in plain


def test_megatron_refuses_a_parameter_gather_overlap_alone():
    text = _plan().replace(
        "  microbatches 4\n", "  microbatches 4\n  dp 2\n  zero 1\n  overlap_param_gather true\n"
    )
    with pytest.raises(ExportError, match="overlap-grad-reduce"):
        megatron_args(parse_plan(text, path="p"))


def test_gen_takes_the_runtime_options(tmp_path, capsys):
    out = tmp_path / "p.octo"
    assert (
        main(
            [
                "gen",
                "1f1b",
                "-p",
                "2",
                "-m",
                "4",
                "--overlap",
                "grad-reduce,p2p-comm",
                "--grad-accumulation-fusion",
                "true",
                "--scatter-gather-messages",
                "true",
                "--reduce-scatter",
                "false",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    h = parse_plan(out.read_text(), path="p").header
    assert h.overlap_grad_reduce and h.overlap_p2p_comm and not h.overlap_tp_comm
    assert h.grad_accumulation_fusion and h.scatter_gather_messages and not h.reduce_scatter
    assert main(["gen", "1f1b", "-p", "2", "-m", "4", "--overlap", "sideways"]) == 2
    assert "give tp-comm" in capsys.readouterr().err
    assert main(["gen", "1f1b", "-p", "2", "-m", "4", "--overlap", "x" * 100_000]) == 2
    err = capsys.readouterr().err
    assert "give tp-comm" in err and len(err) < 200  # the value quoted in part


@pytest.mark.parametrize(
    "pattern,stages,ends,expect",
    [
        ("[" + "*-" * 4 + "]", 2, False, [(0, 4), (5, 9)]),
        # 22 transformer layers on 8 stages, the embedding and the head counted: 2, 3 x 6, 2
        (
            "[" + "*-" * 22 + "]",
            8,
            True,
            [(0, 4)] + [(5 + 6 * i, 10 + 6 * i) for i in range(6)] + [(41, 45)],
        ),
        ("[M-M*-]", 3, False, [(0, 2), (3, 4), (5, 6)]),  # a hybrid: each symbol a Megatron layer
    ],
)
def test_megatron_partitions(pattern, stages, ends, expect):
    assert megatron_layers(pattern, stages, ends) == expect


def test_convert_says_how_an_all_reducing_zero_runs():
    from octodsl.interop.deepspeed_out import deepspeed_snippet

    text = _plan().replace(
        "  microbatches 4\n", "  microbatches 4\n  dp 2\n  zero 1\n  reduce_scatter false\n"
    )
    plan = parse_plan(text, path="p")
    assert "distributed optimizer reduce-scatters" in megatron_args(plan).text
    assert '"reduce_scatter": False' in deepspeed_snippet(plan).text
    stock = parse_plan(
        _plan().replace("  microbatches 4\n", "  microbatches 4\n  dp 2\n  zero 1\n"), path="p"
    )
    assert "reduce_scatter" not in deepspeed_snippet(stock).text  # DeepSpeed's default
    assert "reduce-scatters" not in megatron_args(stock).text


def test_the_runtime_field_round_trips_and_decides_the_bytes_per_parameter():
    for runtime in ("deepspeed", "megatron"):
        text = _plan(runtime=runtime)
        assert f"  runtime {runtime}\n" in text
        assert parse_plan(text, path="p").header.runtime == runtime
        assert format_source(text) == text
        assert _codes(text) == []
    assert "runtime" not in _plan()  # none written: the fields imply it (plan_runtime)


@pytest.mark.parametrize(
    "field,value,hint",
    [
        ("runtime", "megatorn", "did you mean 'megatron'?"),
        ("runtime", '"megatron"', None),  # a name, not a string
        ("runtime", "1", None),
        pytest.param("runtime", "x" * 5000, None, id="runtime-long"),
        ("grad_accum_dtype", "fp64", "did you mean 'fp16'?"),
        ("grad_accum_dtype", "bfloat16", "did you mean 'bf16'?"),
        ("grad_accum_dtype", '"fp32"', None),
        ("grad_accum_dtype", "32", None),
        pytest.param("grad_accum_dtype", "x" * 5000, None, id="grad_accum_dtype-long"),
    ],
)
def test_a_name_not_among_a_fields_choices_is_refused_in_one_line(field, value, hint):
    names = {"runtime": "deepspeed or megatron", "grad_accum_dtype": "fp32, bf16 or fp16"}
    text = _plan().replace("  microbatches 4\n", f"  microbatches 4\n  {field} {value}\n")
    diags = [d for d in lint_source(text, "p.octo")[1] if d.code == "E111"]
    assert len(diags) == 1 and names[field] in diags[0].message
    assert len(diags[0].message) < 200  # a long value quoted in part
    assert hint is None or diags[0].hint == hint


@pytest.mark.parametrize(
    "fields",
    [
        "overlap_grad_reduce true",
        "grad_accumulation_fusion true",
        "dp 2\n  zero 2",
    ],
)
def test_deepspeed_with_what_only_megatron_runs_is_an_error(fields):
    text = _plan().replace("  microbatches 4\n", f"  microbatches 4\n  {fields}\n")
    assert "E407" not in _codes(text)  # no runtime written: Megatron's, as the fields imply
    assert "E407" not in _codes(
        text.replace("  microbatches 4\n", "  microbatches 4\n  runtime megatron\n")
    )
    diags = lint_source(
        text.replace("  microbatches 4\n", "  microbatches 4\n  runtime deepspeed\n"), "p.octo"
    )[1]
    found = [d for d in diags if d.code == "E407"]
    assert len(found) == 1 and fields.split("\n")[-1].strip() in found[0].message


def test_simulate_and_tune_take_the_target_and_refuse_a_contradiction(tmp_path, capsys):
    plan = tmp_path / "p.octo"
    plan.write_text(
        generate_text(
            "1f1b",
            2,
            4,
            model="nemotron-h-tiny",
            mesh={"dp": 2, "zero": 1, "overlap_grad_reduce": True},
        )
    )
    static = {}
    for target in ("megatron", None):
        assert main(["simulate", str(plan), *(["--target", target] if target else [])]) == 0
        line = next(
            l for l in capsys.readouterr().out.splitlines() if l.startswith("static memory")
        )
        static[target] = line
    assert static["megatron"] == static[None]  # the overlap implies Megatron already
    assert main(["simulate", str(plan), "--target", "deepspeed"]) == 2
    err = capsys.readouterr().err
    assert "runtime deepspeed with overlap_grad_reduce true" in err and len(err.splitlines()) == 1
    out = tmp_path / "t.octo"
    args = ["tune", "--from", str(plan), "--evaluations", "20", "-o", str(out)]
    assert main([*args, "--target", "deepspeed"]) == 2
    assert "runtime deepspeed with overlap_grad_reduce true" in capsys.readouterr().err
    assert main([*args, "--target", "megatron"]) == 0
    h = parse_plan(out.read_text(), path="t").header
    # the --from plan's runtime fields are kept, the runtime is the one given
    assert h.overlap_grad_reduce and h.runtime == "megatron"


def test_convert_says_which_runtime_a_plan_is_costed_for():
    from octodsl.interop.deepspeed_out import deepspeed_snippet

    megatron = parse_plan(_plan(runtime="megatron"), path="p")
    assert any("costed for Megatron-LM" in w for w in deepspeed_snippet(megatron).warnings)
    deepspeed = parse_plan(_plan(runtime="deepspeed"), path="p")
    assert not any("Megatron-LM" in w for w in deepspeed_snippet(deepspeed).warnings)
    assert "runtime deepspeed" in megatron_args(deepspeed).text
    assert "runtime deepspeed" not in megatron_args(megatron).text
