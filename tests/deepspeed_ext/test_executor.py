"""The executor on real processes (gloo on this CPU): plans train like stock DeepSpeed.

Each launch runs harness.py under the deepspeed launcher; a launch covers many plans in one
process group to keep the wall time down (the first launch on a machine also compiles
DeepSpeed's small CPU communication op, about 90 s, cached afterwards).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from octodsl.deepspeed_ext.program import PlanSchedule
from octodsl.gen import generate, generate_text
from octodsl.plan import Op, OpKind

from ..conftest import free_port

HERE = Path(__file__).resolve().parent
M = 4
"""Micro-batches per step in harness.py."""
ROOT = HERE.parents[1]
DEEPSPEED = str(Path(sys.executable).parent / "deepspeed")
TIMEOUT = 900

EXACT = (
    "1f1b",
    "gpipe",
    "zb-h1",
    "zb-h2",
    "interleaved",
    "zb-v",
    "dualpipev",
    "irregular",
    "1f1b/bf16",
    "zb-h1/bf16",
    "1f1b/zero1",
    "zb-h1/zero1",
    "1f1b/bf16-zero1",
    "zb-h1/bf16-zero1",
    "1f1b/clip",
    "zb-h1/clip",
    "1f1b/dp2",
    "zb-h1/dp2",
    "zb-v/dp2",
    "zb-h1/dp2/zero1",
    "zb-h1/dp2/zero1/allreduce",
    "irregular-p4",
    "zb-h1/unsplittable",
)
"""Plans whose losses and weights equal stock DeepSpeed's bit for bit on every CPU, because each
number is the same operations on the same operands: each parameter's gradient sums its
micro-batches in micro-batch order as stock's does (a tied embedding and LM head on one rank
keep a sum per use, added as stock's tied all-reduce adds the two ranks'), and the optimizer
steps the same tensors (per parameter; with ZeRO-1 the same flat buffer, as the partition is
stock's). The others differ in rounding only, by construction:
- irregular/reversed-w sums its weight gradients last micro-batch first;
- zb-v/zero1 and zb-v/bf16-zero1 flatten other parameters into each rank's ZeRO buffer than
  stock, and DeepSpeed's CPU Adam rounds an element differently in its vector body and its
  scalar tail, so where an element sits in the buffer matters;
- zb-v/bf16 accumulates both tied uses in schedule order in the bf16 optimizer's fp32 copies;
- zb-v/clip: stock leaves the LM head's norm out of the gradient norm (DeepSpeed marks every
  parameter of a tied module on its second rank as replicated), ours counts it."""

ADAM_BOUND = 2 * 3 * 1e-3 * 1.01
"""How far two runs' weights can drift in three AdamW steps at lr 1e-3 when their gradients
differ in rounding only: Adam's step m_hat / (sqrt(v_hat) + eps) is at most 1.00 in size over
steps 1-3 at betas (0.9, 0.999) (Cauchy-Schwarz over the moment sums, with the bias
corrections), so a step moves a weight by at most lr, and two runs by 2 lr (a rounding that
flips a near-zero gradient's sign moves it the whole way), plus 1% for the decay term."""


def launch(procs: int, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
        "PYTHONWARNINGS": "ignore",
    }
    port = free_port()
    cmd = [DEEPSPEED, "--num_gpus", str(procs), "--master_port", str(port), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    # DeepSpeed's CPU all-reduce segments (69 MB a rank) must not outlive the launch
    assert not glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*")
    return proc


def run_case(tmp_path_factory, procs: int, case: str, script: str = "harness.py") -> dict:
    out = tmp_path_factory.mktemp(case) / "result.json"
    proc = launch(procs, str(HERE / script), case, str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return {**json.loads(out.read_text()), "stderr": proc.stderr}


def _check(results: list[dict]) -> None:
    for r in results:
        # the first step starts from the same weights: the same forwards on the same inputs,
        # and the loss summed over the micro-batches in order, on every plan
        assert r["losses"][0] == r["ref_losses"][0], r
        assert r["loss_diff"] <= 1e-3 * max(r["ref_losses"]), r
        assert r["weight_diff"] <= ADAM_BOUND, r
        if r["plan"] in EXACT:
            assert r["exact"] and r["weight_diff"] == 0.0, r
        assert r.get("eval_diff", 0.0) == 0.0, r
        # the plan's header `zero 1` is what DeepSpeed ran (the config leaves it out or agrees)
        assert r["zero"] == (1 if "zero1" in r["plan"] else 0), r


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    return run_case(tmp_path_factory, 2, "plans")


@pytest.mark.slow
def test_every_plan_trains_like_stock(plans):
    names = {r["plan"] for r in plans["results"]}
    assert {n for n in EXACT if "dp2" not in n and n != "irregular-p4"} <= names
    _check(plans["results"])


@pytest.mark.slow
def test_recompute_trains_like_the_same_plan_without_it(plans):
    # Bit for bit, by construction: a `full` stage's B (or BW) runs the stage's forward again on
    # the input F kept, the same operations on the same values as F (CPU kernels are
    # deterministic, and a forward without grad computes the same numbers), then the same B
    # and W; `selective` brings back each dropped tensor by running the operations that made it
    # again on the same inputs, once, and B and W read the same values. So the gradients, the
    # losses, the weights and the evaluation after training equal the plan's without recompute.
    results = plans["recompute"]
    assert {r["plan"] for r in results} == {
        "zb-h1/full-selective",
        "zb-h1/selective-full",
        "zb-v/selective-full-selective-full",
        "1f1b/full-selective",
    }
    runs = M * 3  # micro-batches x steps
    for r in results:
        assert r["exact"] and r["weight_diff"] == 0.0 and r["eval_diff"] == 0.0, r
        # and recompute did run: a full stage's forward twice per micro-batch, first without grad;
        # the ranks holding a selective stage brought dropped tensors back
        for s, mode in enumerate(r["modes"]):
            assert r["forwards"].get(f"{s} grad") == runs, r
            assert r["forwards"].get(f"{s} no_grad", 0) == (runs if mode == "full" else 0), r
        for d, regions in enumerate(r["recomputed_regions"]):
            selective = any(
                m == "selective" and r["stage_device"][s] == d for s, m in enumerate(r["modes"])
            )
            assert (regions > 0) == selective, r


@pytest.mark.slow
def test_released_groups_keep_the_thread_count_flat(plans):
    # Each engine's gloo groups hold polling threads; released after each plan, the ninth
    # plan leaves no more threads than the first (without it: about 20 more per plan).
    threads = plans["threads"]
    assert len(threads) == 9 and max(threads) <= threads[0], threads


@pytest.mark.slow
def test_a_layer_that_cannot_split_runs_fused_and_says_so(plans):
    assert "octodsl: stage 0: layer(s) 5 cannot split their backward" in plans["stderr"]
    assert any(r["plan"] == "zb-h1/unsplittable" for r in plans["results"])


@pytest.mark.slow
def test_measured_trace_has_every_op_in_the_simulator_layout(plans):
    data = json.loads(Path(plans["trace"]).read_text())
    events = data["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    compute = sorted(e["name"] for e in spans if e["tid"] == 0 and e["args"]["kind"] != "optimizer")
    plan = generate("zb-v", devices=2, microbatches=4)
    assert compute == sorted(str(op) for _, _, op in plan.ops())
    assert {e["pid"] for e in spans} == {0, 1}
    # one step: one optimizer update per rank, after its last op
    updates = {e["pid"]: e for e in spans if e["args"]["kind"] == "optimizer"}
    assert sorted(updates) == [0, 1] and len([e for e in spans if e["name"] == "optimizer"]) == 2
    for pid, u in updates.items():
        assert u["ts"] >= max(
            e["ts"] + e["dur"]
            for e in spans
            if e["pid"] == pid and e["tid"] == 0 and e["args"]["kind"] != "optimizer"
        )
    # the first step's memory: the static bytes first, then a level after every op of the rank
    for pid in (0, 1):
        levels = [
            e["args"]["bytes"]
            for e in events
            if e["ph"] == "C" and e["pid"] == pid and e["name"] == "memory"
        ]
        assert len(levels) == 1 + sum(len(slot.ops) for slot in plan.schedule[pid])
        static = data["otherData"]["memory"][str(pid)]["static"]
        assert levels[0] == static > 0 and max(levels) > static
        assert max(levels) == static + data["otherData"]["memory"][str(pid)]["activations"]
    assert data["otherData"]["partition"] == [
        [a, b - 1] for a, b in pairwise(plans["trace_bounds"])
    ]
    for e in spans:
        assert e["dur"] >= 0 and e["ts"] >= 0
        a = e["args"]
        if a["kind"] == "optimizer":
            continue
        if e["tid"] == 0:
            assert Op.parse(e["name"]) == Op(OpKind(a["kind"]), a["stage"], a["mb"])
        else:
            assert a["kind"] in ("send", "recv") and a["peer"] in (0, 1)
    comm = [e for e in spans if e["tid"] == 1]
    assert len(comm) == 2 * len(PlanSchedule(plan, 0, True).messages)  # a send and a receive each


@pytest.mark.slow
def test_checkpoint_resume_gives_the_same_losses(plans):
    # exact: the resumed engine loads the same weights and optimizer state and then runs the
    # same operations (with torch's AdamW: see harness.TORCH_ADAMW for DeepSpeed's CPU Adam)
    ck = plans["checkpoint"]
    assert ck["resumed"] == ck["continued"]


@pytest.mark.slow
def test_data_parallel_and_non_adjacent_ranks(tmp_path_factory):
    results = run_case(tmp_path_factory, 4, "dp")["results"]
    by_plan = {r["plan"]: r for r in results}
    assert {
        "1f1b/dp2",
        "zb-h1/dp2",
        "zb-v/dp2",
        "zb-h1/dp2/zero1",
        "zb-h1/dp2/zero1/allreduce",
        "irregular-p4",
    } <= set(by_plan)
    _check(results)
    # the header's reduce_scatter is what DeepSpeed's ZeRO optimizer ran
    assert by_plan["zb-h1/dp2/zero1"]["reduce_scatter"] is True
    assert by_plan["zb-h1/dp2/zero1/allreduce"]["reduce_scatter"] is False


@pytest.mark.slow
def test_watchdog_stops_a_stalled_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("stall") / "result.json"
    proc = launch(2, str(HERE / "harness.py"), "stall", str(out))
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "octodsl watchdog: rank 0" in text and "waited more than 5 s for the gradient of" in text
    assert not out.exists()


@pytest.mark.slow
def test_plan_that_does_not_fit_the_launch_is_a_clear_error(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 8,
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            }
        )
    )
    plan = tmp_path / "plan.octo"
    plan.write_text(generate_text("1f1b", devices=4, microbatches=8))
    proc = launch(
        2,
        "examples/train.py",
        "--deepspeed_config",
        str(config),
        "--schedule",
        str(plan),
        "--steps",
        "1",
    )
    assert proc.returncode == 2
    assert (
        "train.py: error: the plan runs 1 data-parallel copy of a 4-device pipeline "
        "(4 processes), but the job has 2 processes" in proc.stderr
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_one_process_trains_like_stock(tmp_path_factory):
    # tp 1 x pp 1: what benchmarks/gpu_check.sh runs on a machine with one GPU
    result = run_case(tmp_path_factory, 1, "single")
    assert result["world"] == 1 and result["backend"] == "gloo"
    (r,) = result["results"]
    assert r["exact"] and r["weight_diff"] == 0.0, r


@pytest.mark.slow
def test_qwen3_next_tiny_trains_like_stock(tmp_path):
    # gated DeltaNet, gated attention and MoE layers through a zero-bubble plan's split
    # backward, against stock DeepSpeed's 1F1B on the same partition, weights and data
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}))
    plan = tmp_path / "plan.octo"
    plan.write_text(
        generate_text(
            "zb-h1",
            devices=2,
            microbatches=4,
            model="qwen3-next-tiny",
            microbatch_size=1,
            seq_len=64,
        )
    )
    losses = []
    for stock in ([], ["--stock"]):
        proc = launch(
            2,
            "examples/train.py",
            "--deepspeed_config",
            str(config),
            "--schedule",
            str(plan),
            "--steps",
            "3",
            *stock,
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        losses.append(
            [json.loads(line)["loss"] for line in proc.stdout.splitlines() if line.startswith("{")]
        )
    ours, ref = losses
    assert len(ours) == len(ref) == 3, losses
    # the first step's forwards are the same operations on the same weights and inputs
    assert ours[0] == ref[0], losses
    assert max(abs(a - b) for a, b in zip(ours, ref, strict=True)) <= 1e-3 * max(ref), losses
