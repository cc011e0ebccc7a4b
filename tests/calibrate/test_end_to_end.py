"""The real thing, once: `octodsl calibrate` profiles a CPU-sized hybrid, runs its calibration
plans through the executor (deepspeed launcher, 2 processes) and fits; the calibrated profile
then drives `simulate` and `compare` on one of the measured traces."""

from __future__ import annotations

import json
import math

import pytest

from octodsl.cli import main
from octodsl.costs.profile import read_profile

SPEC = """\
name: hybrid-micro
hidden: 64
vocab: 512
seq_len: 32
microbatch_size: 1
dtype: fp32
pattern: "M-M*-M-"
mamba2: {heads: 4, head_dim: 32, groups: 1, state: 16, chunk: 16}
attention: {heads: 2, kv_heads: 1, head_dim: 32}
mlp: {ffn: 128, activation: relu2}
"""


@pytest.mark.slow
def test_calibrate_runs_the_executor_and_compare_reads_its_traces(tmp_path, capsys):
    spec = tmp_path / "micro.yaml"
    spec.write_text(SPEC)
    work = tmp_path / "runs"
    out = tmp_path / "micro.calibrated.json"
    assert (
        main(
            [
                "calibrate",
                "--model",
                str(spec),
                "--ranks",
                "2",
                "--steps",
                "4",
                "--workdir",
                str(work),
                "-o",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    cal = json.loads(capsys.readouterr().out)
    assert cal["processes"] == [2] and len(cal["fit"]["runs"]) == 4
    assert cal["link"]["bandwidth"] > 0 and cal["fit"]["probe"]
    assert cal["update_per_param"] > 0 and cal["act_w_extra"]
    assert read_profile(out).calibration is not None

    plan = work / "calibrate-zb-h1-p2-m4.octo"
    trace = work / "calibrate-zb-h1-p2-m4.trace.json"
    assert main(["simulate", str(plan), "--profile", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["link"] == "calibrated"
    assert main(["compare", str(plan), "--trace", str(trace), "--profile", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert math.isfinite(result["iteration_error"])
    # memory is deterministic: the fitted W-state bytes make the split plan's peaks match
    assert result["memory_error"] < 0.02, result
    assert (work / "calibrate-zb-h1-p2-m4.trace.compare.png").exists()
