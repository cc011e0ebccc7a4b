"""The all-reduce of tied word embeddings' two copies (sim/dpcomm.py, `TiedReduce`): between the
embedding's device and the LM head's, when they differ, before the data-parallel reduction
under DeepSpeed (`ReduceTiedGrads`, then `ReduceGrads`) and after it under Megatron-LM
(`finalize_model_grads`), gating the optimizer step either way."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import numpy as np
import pytest

from octodsl.costs.devices import get_link
from octodsl.costs.resolve import cost_table
from octodsl.gen import generate, render_plan
from octodsl.sim import simulate
from octodsl.sim.costs import SimCosts

from ..conftest import REPO, spec_file

LINK = get_link("nvlink")


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> str:
    """nemotron-h-tiny with tied embeddings, in bf16 (where the runtimes' gradient dtypes
    differ)."""
    return spec_file(
        tmp_path_factory.mktemp("spec") / "tied.yaml",
        "nemotron-h-tiny",
        tie_embeddings=True,
        dtype="bf16",
    )


def _run(spec: str, name: str = "1f1b", untie: bool = False, **header):
    plan = generate(name, 4 if name != "zb-v" else 2, 8, model=spec, partition="equal")
    plan = dataclasses.replace(plan, header=plan.header.model_copy(update=header))
    costs = SimCosts.from_table(cost_table(spec, device="H800"), plan)
    if untie:  # the same costs without the all-reduce: what it adds is all that differs
        costs = dataclasses.replace(costs, tied_stage=-1, tied_bytes=0.0)
    return simulate(plan, costs, LINK), costs


def _two_rank_allreduce(nbytes: float) -> float:
    """A ring all-reduce of two ranks, by hand: a reduce-scatter and an all-gather, one step
    each of half the bytes."""
    return 2 * (LINK.latency + nbytes / 2 / LINK.bandwidth)


def test_the_two_devices_reduce_the_embeddings_gradient(spec):
    r, costs = _run(spec)
    table = cost_table(spec, device="H800")
    # DeepSpeed's default for a bf16 model: `.grad` in bf16, 2 bytes a parameter
    assert costs.tied_bytes == table.grad_params(0, 0) * 2
    expected = _two_rank_allreduce(costs.tied_bytes)
    assert r.dp_comm.tied.tolist() == pytest.approx([expected, 0, 0, expected], rel=1e-12)
    assert r.exposed()["tied"].tolist() == r.dp_comm.tied.tolist()


def test_it_gates_the_step_by_its_own_seconds_at_dp_1(spec):
    """dp 1, DeepSpeed: the step waits for the later of the two devices, then the all-reduce;
    nothing else moves, so the iteration is longer by exactly its seconds (the same
    additions on the same floats, up to one rounding)."""
    tied, _ = _run(spec)
    untied, _ = _run(spec, untie=True)
    assert tied.pipeline_time == untied.pipeline_time
    assert tied.iteration_time - untied.iteration_time == pytest.approx(
        float(tied.dp_comm.tied.max()), rel=1e-9
    )


def test_deepspeed_reduces_it_before_the_data_parallel_reduction(spec):
    tied, _ = _run(spec, dp=4, zero=1)
    untied, _ = _run(spec, dp=4, zero=1, untie=True)
    dpc = tied.dp_comm
    spans = list(tied.collectives())
    for d in (0, 3):
        mine = [s for s in spans if s.device == d and s.kind != "all-gather"]
        assert [s.kind for s in mine] == ["tied-allreduce", "reduce-scatter"]
        assert mine[1].start == mine[0].end  # the reduction waits for it
    # the devices in between reduce as without it
    for d in (1, 2):
        assert dpc.span_start[dpc.span_ptr[d]] == untied.dp_comm.span_start[d]
    both = [s for s in spans if s.kind == "tied-allreduce"]
    ready = np.maximum(untied.dp_comm.span_start[[0, 3]], 0)
    assert both[0].start == both[1].start == ready.max()


def test_megatron_reduces_it_after_the_data_parallel_reduction(spec):
    r, costs = _run(spec, dp=4, zero=1, overlap_grad_reduce=True)
    assert costs.param_bytes.runtime == "megatron"
    # Megatron-LM's fp32 main_grad of a bf16 model
    assert costs.tied_bytes == cost_table(spec, device="H800").grad_params(0, 0) * 4
    spans = [s for s in r.collectives() if s.kind != "all-gather"]
    tied = [s for s in spans if s.kind == "tied-allreduce"]
    assert [s.device for s in tied] == [0, 3]
    last_reductions = max(s.end for s in spans if s.device in (0, 3) and s.kind != tied[0].kind)
    # ... and the two devices' compute, which the reductions under it slowed (their SMs)
    dpc = r.dp_comm
    assert dpc.slowed[[0, 3]].min() > 0
    ready = max(last_reductions, float(dpc.compute_end[[0, 3]].max()))
    assert tied[0].start == tied[1].start == ready
    for d in (0, 3):
        assert [s.kind for s in spans if s.device == d][-1] == "tied-allreduce"
    assert r.dp_comm.update_start == pytest.approx(tied[0].end, rel=0, abs=0)


@pytest.mark.parametrize(
    "header", [{}, {"dp": 4, "zero": 1}, {"dp": 4, "overlap_grad_reduce": True}]
)
def test_the_critical_path_runs_through_it_without_a_gap(spec, header):
    """The path reaches the all-reduce from the device that started it, and the next step
    (the reduction that waited for it, or the optimizer step) starts when it ends."""
    r, _ = _run(spec, **header)
    steps = r.critical_path()
    i = [s.kind for s in steps].index("tied-allreduce")
    assert steps[i].device == r.dp_comm.tied_from
    for a, b in (steps[i - 1], steps[i]), (steps[i], steps[i + 1]):
        assert b.start == pytest.approx(a.end, rel=0, abs=1e-15)


def test_none_on_a_v_where_one_device_holds_both_ends(spec):
    r, costs = _run(spec, "zb-v", dp=4, zero=1)
    assert costs.tied_stage == -1 and not r.dp_comm.tied.any()
    assert "tied-allreduce" not in {s.kind for s in r.collectives()}


def test_simulate_shows_it(spec, tmp_path):
    plan = generate("1f1b", 4, 8, model=spec, partition="equal")
    path = tmp_path / "p.octo"
    path.write_text(render_plan(plan))
    octodsl = str(REPO / ".venv/bin/octodsl")
    out = subprocess.run(
        [octodsl, "simulate", str(path), "--device", "H800"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "tied embeddings' all-reduce" in out.stdout
    data = json.loads(
        subprocess.run(
            [octodsl, "simulate", str(path), "--device", "H800", "--json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert max(data["exposed"]["tied"]) > 0
