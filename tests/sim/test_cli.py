"""`octodsl simulate`: summary, JSON contract, trace, Gantt chart, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from octodsl.cli import main
from octodsl.costs.resolve import cost_table
from octodsl.gen import generate_text
from octodsl.lang import load_plan
from octodsl.models import load_model

MODEL_PLAN = Path(__file__).parent / "data" / "nemotron-1f1b.octo"


@pytest.fixture
def plan_file(tmp_path):
    def write(name="1f1b", p=4, m=8, text=None):
        path = tmp_path / f"{name}-{p}-{m}.octo"
        path.write_text(text if text is not None else generate_text(name, p, m))
        return str(path)

    return write


def run_json(capsys, *argv):
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_summary(plan_file, capsys):
    assert main(["simulate", plan_file()]) == 0
    out = capsys.readouterr().out
    for text in (
        "1f1b-p4-m8",
        "iteration time",
        "bubble ratio",
        "27.3%",
        "critical path",
        "peak memory",
        "F0:3",
    ):
        assert text in out


def test_json_contract(plan_file, capsys):
    data = run_json(capsys, plan_file())
    assert data["iteration_time"] == 33.0
    assert data["bubble_ratio"] == pytest.approx(9 / 33)
    assert data["overlap_rate"] == 1.0
    assert data["lower_bound"] == 24.0 and data["efficiency"] == pytest.approx(24 / 33)
    assert data["peak_memory"] == [4.0, 3.0, 2.0, 1.0]
    assert [(s["F"], s["B"], s["W"]) for s in data["stages"]] == [(1.0, 1.0, 1.0)] * 4
    assert data["throughput"] is None
    assert 0 < data["simulate_seconds"] < 5
    assert data["critical_path"][0]["first"] == "F0:0"


def test_costs_and_links(plan_file, capsys):
    path = plan_file("1f1b", 2, 1)
    assert run_json(capsys, path, "--costs", "F=2,B=1,W=1,comm=0.5")["iteration_time"] == 9.0
    assert (
        run_json(capsys, path, "--costs", "f=2,b=1,w=1,comm=0.5", "--link", "none")[
            "iteration_time"
        ]
        == 8.0
    )


def test_model_costs(capsys):
    data = run_json(capsys, str(MODEL_PLAN), "--link", "ib-ndr")
    plan = load_plan(str(MODEL_PLAN))
    stages = cost_table(model="nemotron-h-8b", device="H800").stage_costs(plan)
    assert [s["F"] for s in data["stages"]] == pytest.approx([c.f for c in stages])
    assert data["throughput"] == pytest.approx(8 * 4096 / (data["iteration_time"] * 4))
    assert data["memory_limit"] == 40 * 2**30 and data["link"] == "ib-ndr"
    assert 0 < data["overlap_rate"] < 1


def test_memory_limit_defaults_to_the_devices(tmp_path, capsys):
    path = tmp_path / "no-limit.octo"
    path.write_text(MODEL_PLAN.read_text().replace("memory 40GiB", ""))
    assert run_json(capsys, str(path), "--device", "H200")["memory_limit"] == 141 * 10**9
    assert run_json(capsys, str(path), "--costs", "F=1,B=1,W=1")["memory_limit"] is None


def test_dp(capsys):
    data = run_json(capsys, str(MODEL_PLAN), "--dp", "8", "--dp-link", "ib-ndr")
    assert data["dp"] == 8
    assert all(t > 0 for t in data["allreduce_time"])
    assert data["iteration_time"] > data["pipeline_time"]


def test_zero_shards_the_static_bytes_and_splits_the_all_reduce(capsys):
    base = run_json(capsys, str(MODEL_PLAN), "--dp", "8", "--dp-link", "ib-ndr")
    data = run_json(capsys, str(MODEL_PLAN), "--dp", "8", "--zero", "1", "--dp-link", "ib-ndr")
    assert (data["zero"], data["dp"], base["zero"]) == (1, 8, 0)
    # as DeepSpeed holds them (the plan's runtime fields are the executor's): at zero 1 its ZeRO
    # optimizer, at zero 0 its BF16 optimizer, which shards the fp32 copy and Adam state too
    # but keeps a flat bf16 gradient accumulator beside each .grad
    assert data["param_bytes"] == {
        "runtime": "deepspeed",
        "grad_accum_dtype": "bf16",
        "grad_reduce_bytes": 2.0,
        "weights": 2.0,
        "grads": 2.0,
        "optimizer": 12.0,
        "total": 16.0,
        "per_device": 2 + 2 + 12 / 8,
    }
    assert base["param_bytes"] == {
        "runtime": "deepspeed",
        "grad_accum_dtype": "bf16",
        "grad_reduce_bytes": 2.0,
        "weights": 2.0,
        "grads": 4.0,
        "optimizer": 12.0,
        "total": 18.0,
        "per_device": 2 + 4 + 12 / 8,
    }
    assert data["allreduce_time"] == [0.0] * 4
    # DeepSpeed reduces bf16 gradients in bf16 (its communication_data_type), and gathers the
    # parameters in bf16: the same bytes, the same latencies (ib-ndr's 15 us per ring step)
    latency = 7 * 15e-6
    assert data["reduce_scatter_time"] == pytest.approx(data["all_gather_time"])
    # Megatron-LM reduces them in fp32: twice the bytes
    megatron = run_json(
        capsys,
        str(MODEL_PLAN),
        "--dp",
        "8",
        "--zero",
        "1",
        "--dp-link",
        "ib-ndr",
        "--target",
        "megatron",
    )
    assert [r - latency for r in megatron["reduce_scatter_time"]] == pytest.approx(
        [2 * (g - latency) for g in megatron["all_gather_time"]]
    )
    assert megatron["all_gather_time"] == pytest.approx(data["all_gather_time"])
    assert [2 * r for r in data["reduce_scatter_time"]] == pytest.approx(base["allreduce_time"])
    assert data["dp_comm_exposed"] == pytest.approx(
        [a + b for a, b in zip(data["reduce_scatter_time"], data["all_gather_time"], strict=True)]
    )
    for mine, full in zip(data["static"], base["static"], strict=True):
        assert mine["weights"] == pytest.approx(full["weights"])
        assert mine["grads"] == pytest.approx(full["grads"] / 2)
        assert mine["optimizer"] == pytest.approx(full["optimizer"])
        assert mine["weights"] + mine["grads"] + mine["optimizer"] == pytest.approx(mine["total"])
        assert full["optimizer"] == pytest.approx(0.75 * full["weights"])
    # Activations are the same: the peaks differ by the static bytes saved.
    saved = [f["total"] - m["total"] for m, f in zip(data["static"], base["static"], strict=True)]
    assert [
        b - d for b, d in zip(base["peak_memory"], data["peak_memory"], strict=True)
    ] == pytest.approx(saved)
    assert main(["simulate", str(MODEL_PLAN), "--dp", "8", "--zero", "2"]) == 0
    out = capsys.readouterr().out
    assert "DP 8, ZeRO 2" in out and "reduce-scatter" in out and "all-gather" in out
    # zero 2 is Megatron's, whose distributed optimizer keeps the fp32 gradient buffer whole
    assert "(7.5 of 18 bytes per parameter, Megatron-LM's)" in out
    assert main(["simulate", str(MODEL_PLAN), "--dp", "8", "--zero", "1"]) == 0
    assert "(5.5 of 16 bytes per parameter, DeepSpeed's)" in capsys.readouterr().out


def test_a_megatron_only_field_makes_the_static_bytes_megatrons(capsys):
    """Gradient-accumulation fusion is Megatron's alone, so the plan's static bytes are its
    distributed optimizer's 2 + 4 + 12/8 (fp32 main_grad buffer) instead of DeepSpeed's
    2 + 2 + 12/8: 2 more per parameter, on every device."""
    argv = (str(MODEL_PLAN), "--dp", "8", "--zero", "1")
    deepspeed = run_json(capsys, *argv)
    megatron = run_json(capsys, *argv, "--grad-accumulation-fusion", "true")
    assert megatron["param_bytes"]["runtime"] == "megatron"
    assert megatron["param_bytes"]["per_device"] == 7.5
    assert deepspeed["param_bytes"]["per_device"] == 5.5
    for m, d in zip(megatron["static"], deepspeed["static"], strict=True):
        assert m["grads"] == pytest.approx(2 * d["grads"])
        assert (m["weights"], m["optimizer"]) == pytest.approx((d["weights"], d["optimizer"]))
        assert m["total"] == pytest.approx(d["total"] * 7.5 / 5.5)
    assert main(["simulate", *argv, "--grad-accumulation-fusion", "true"]) == 0
    assert "(7.5 of 18 bytes per parameter, Megatron-LM's)" in capsys.readouterr().out


def test_recompute_override(capsys):
    base = run_json(capsys, str(MODEL_PLAN))
    full = run_json(capsys, str(MODEL_PLAN), "--recompute", "full")
    assert [s["recompute"] for s in full["stages"]] == ["full"] * 4
    assert [s["B"] for s in full["stages"]] == pytest.approx(
        [s["F"] + s["B"] for s in base["stages"]]
    )
    assert all(s["act_b"] > 0 for s in full["stages"]) and all(
        s["act_b"] == 0 for s in base["stages"]
    )
    assert max(full["peak_memory"]) < max(base["peak_memory"])
    assert full["iteration_time"] > base["iteration_time"]
    assert main(["simulate", str(MODEL_PLAN), "--recompute", "selective"]) == 0
    assert "recompute       selective: stages 0, 1, 2, 3" in capsys.readouterr().out


def test_zero_with_uniform_costs_is_strict_json(plan_file, capsys):
    data = run_json(capsys, plan_file(), "--zero", "2", "--dp", "4")
    assert data["param_bytes"] is None and data["static"][0]["weights"] is None
    assert data["reduce_scatter_time"] == [0.0] * 4  # no gradient bytes are known


def test_trace(plan_file, tmp_path, capsys):
    out = tmp_path / "trace.json"
    assert (
        main(
            [
                "simulate",
                plan_file("zb-v", 2, 4),
                "--costs",
                "F=1,B=1,W=1,comm=0.1",
                "--trace",
                str(out),
            ]
        )
        == 0
    )
    events = json.loads(out.read_text())["traceEvents"]
    ops = [e for e in events if e["ph"] == "X" and e["tid"] == 0]
    assert len(ops) == 2 * 2 * 4 * 3
    first = next(e for e in ops if e["name"] == "F0:0")
    assert first["args"] == {"kind": "F", "stage": 0, "mb": 0} and first["pid"] == 0
    assert first["ts"] == 0 and first["dur"] == 1e6
    comm = [e for e in events if e["ph"] == "X" and e["tid"] == 1]
    sends = [e for e in comm if e["args"]["kind"] == "send"]
    recvs = [e for e in comm if e["args"]["kind"] == "recv"]
    assert sends[0]["name"] == "F0:0" and sends[0]["args"] == {
        "kind": "send",
        "stage": 0,
        "mb": 0,
        "peer": 1,
    }
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    assert len(sends) == len(recvs) == len(starts) == len(ends) > 0
    assert {e["id"] for e in starts} == {e["id"] for e in ends}
    memory = [e for e in events if e["ph"] == "C" and e["name"] == "memory"]
    assert {e["pid"] for e in memory} == {0, 1}
    assert max(e["args"]["bytes"] for e in memory if e["pid"] == 0) > 0


def test_png(plan_file, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "gantt.png"
    assert main(["simulate", plan_file("zb-h1", 8, 32), "--png", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--costs", "F=1,B=x"], "--costs: B: 'x' is not a number of seconds"),
        (["--costs", "F=1,X=1"], "--costs: cannot read 'X=1'"),
        (["--costs", "F=1,B=1"], "--costs: give W too"),
        (["--costs", "F=1,B=1,W=-1"], "--costs: W: must be at least 0 seconds"),
        (["--costs", "F=nan,B=1,W=1"], "--costs: F: 'nan' is not a finite number of seconds"),
        (["--costs", "F=1,B=inf,W=1"], "--costs: B: 'inf' is not a finite number of seconds"),
        (["--costs", "F=1,B=1,W=1,comm=1e300"], "--costs: comm: must be at most 1e+06 seconds"),
        (["--link", "carrier-pigeon"], "unknown link 'carrier-pigeon'"),
        (["--model", "no-such-model"], "no-such-model"),
        (["--dp", "0"], "--dp: must be at least 1"),
        (["--dp", "two"], "--dp: 'two' is not a whole number"),
        (["--zero", "3"], "--zero: must be at most 2"),
        (["--zero", "-1"], "--zero: must be at least 0"),
        (["--recompute", "some"], "--recompute: invalid choice: 'some'"),
        (["--png", "gantt.txt"], "--png: gantt.txt must end in .png"),
        (["--trace", "trace.png"], "--trace: trace.png must end in .json"),
        (
            ["--trace", "/no/such/folder/t.json"],
            "cannot write /no/such/folder/t.json: there is no folder",
        ),
    ],
)
def test_bad_input_is_a_message(plan_file, capsys, argv, message):
    assert main(["simulate", plan_file(), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_plan_that_names_no_layers_is_costed_with_the_executors_split(plan_file, capsys):
    # the split is octodsl.partition.plan_partition's, which the executor runs too
    # (tests/deepspeed_ext/test_train_script.py checks that both agree)
    table = cost_table(model="nemotron-h-tiny", device="cpu")
    split = table.stage_ranges(load_plan(plan_file()))
    obj = run_json(capsys, plan_file(), "--model", "nemotron-h-tiny", "--device", "cpu")
    work = table.layer_work()
    busy = [sum(work[a : b + 1]) * 8 for a, b in split]  # 8 micro-batches, one stage per device
    assert obj["busy"] == pytest.approx(busy, rel=1e-9)


def test_a_partition_over_other_layers_than_the_model_is_refused(tmp_path, capsys):
    plan = tmp_path / "p24.octo"
    plan.write_text(generate_text("1f1b", 2, 4, model="nemotron-h-tiny"))  # 24 layers
    spec = tmp_path / "wide.json"
    spec.write_text(
        json.dumps(
            {
                **load_model("nemotron-h-tiny").compact(),
                "name": "wide",
                "pattern": "[" + "M-" * 498 + "M*]",
            }
        )
    )  # 1000 layers
    assert main(["simulate", str(plan), "--model", str(spec)]) == 2
    assert (
        f"{plan}: the plan's partition covers 24 layers (0..23), but the model has 1000 "
        "(0..999)" in capsys.readouterr().err
    )


def test_plan_with_errors(plan_file, capsys):
    text = generate_text("1f1b", 2, 2).replace("BW1:0", "BW1:9")
    assert main(["simulate", plan_file(text=text)]) == 1
    assert "octodsl lint" in capsys.readouterr().err


def test_missing_file(capsys):
    assert main(["simulate", "no/such/plan.octo"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_several_plans_side_by_side(tmp_path, capsys):
    paths = []
    for name in ("1f1b", "zb-h1"):
        path = tmp_path / f"{name}.octo"
        path.write_text(generate_text(name, devices=4, microbatches=8))
        paths.append(str(path))
    assert main(["simulate", *paths]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith(("1f1b", "zb-h1"))]
    assert len(lines) == 2 and lines[0].split()[-1] == "1.00x"
    # Uniform F=B=W=1: 1F1B takes (m+p-1)*3 = 33, ZB-H1 takes 3m + (p-1)(F+B-W) = 27.
    assert lines[1].split()[-1] == f"{33 / 27:.2f}x"
    assert main(["simulate", *paths, "--json"]) == 0
    objs = json.loads(capsys.readouterr().out)
    assert [o["iteration_time"] for o in objs] == [33.0, 27.0]
    assert main(["simulate", *paths, "--png", str(tmp_path / "x.png")]) == 2
