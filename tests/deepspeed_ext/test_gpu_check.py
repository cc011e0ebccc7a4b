"""benchmarks/gpu_check.sh without a GPU: it stops at once with a message; its dry run shows the
commands for each GPU count; its tables (benchmarks/gpu_check.py) are written from results of
the shape the runs write."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from octodsl.costs.profile import write_profile
from octodsl.costs.profiler import profile_model
from octodsl.models import load_model

from ..conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_check  # noqa: E402


def sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PY": sys.executable},
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_stops_with_a_message():
    proc = sh()
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("gpu_check.sh: no CUDA GPU is visible")


def test_bad_arguments_are_one_line():
    for args, message in (
        (["--frobnicate"], "unknown argument --frobnicate"),
        (["--dry-run", "--gpus", "x"], "--gpus takes a number, not 'x'"),
        (["--gpus", "2"], "--gpus is for --dry-run"),
    ):
        proc = sh(*args)
        assert (
            proc.returncode == 2
            and proc.stderr
            == f"gpu_check.sh: {message}"
            + (
                " (see --help)"
                if "unknown" in message
                else "; a real run uses every visible GPU"
                if "is for" in message
                else ""
            )
            + "\n"
        )


@pytest.mark.parametrize(
    "gpus,cases,pipe",
    [
        (1, ["harness.py single"], 1),
        (2, ["harness.py plans"], 2),
        (8, ["tp_cases.py tp", "harness.py dp", "ep_cases.py ep", "ep_cases.py overlap"], 2),
    ],
)
def test_the_dry_run_shows_every_command_for_the_gpus(gpus, cases, pipe, tmp_path):
    proc = sh("--dry-run", "--gpus", str(gpus), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    launches = [line for line in lines if "OCTO_TEST_BACKEND=nccl" in line]
    ranks = min(gpus, 4) if gpus != 2 else 2
    assert [
        line.split("tests/deepspeed_ext/")[1].split(f" {tmp_path}")[0] for line in launches
    ] == cases
    assert all(
        f"--num_gpus {ranks} " in line and "DS_ACCELERATOR=cuda" in line for line in launches
    )
    assert any("octodsl profile --model nemotron-h-8b --device cuda" in line for line in lines)
    assert any(
        "train.py" in line and f"--num_gpus {pipe} " in line and "--trace" in line for line in lines
    )
    assert sum("octodsl compare" in line and "--json --no-files > " in line for line in lines) == 2
    assert not list(tmp_path.iterdir())  # nothing ran


def _result(case: str, world: int, runs: list[dict]) -> dict:
    return {"case": case, "world": world, "backend": "nccl", "results": runs}


def test_the_executor_table_judges_each_run_by_its_bound(tmp_path):
    tp = _result(
        "tp",
        4,
        [
            {"plan": "1f1b", "losses": [2.0], "ref_losses": [2.0], "loss_rel": 3e-6},
            {"plan": "zb-v", "losses": [2.0], "ref_losses": [2.0], "loss_rel": 2e-5},
        ],
    )
    stock = _result(
        "dp", 4, [{"plan": "1f1b/dp2", "loss_diff": 1e-6, "ref_losses": [4.0, 2.0], "exact": False}]
    )
    paths = []
    for i, r in enumerate((tp, stock)):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(r))
    table, ok = gpu_check.executor_table([str(p) for p in paths])
    assert not ok
    rows = table.splitlines()[2:]
    assert rows == [
        "| tp | 1f1b | 4 | nccl | 3.00e-06 | 1e-05 | - | ok |",
        "| tp | zb-v | 4 | nccl | 2.00e-05 | 1e-05 | - | FAIL |",
        "| dp | 1f1b/dp2 | 4 | nccl | 2.50e-07 | 1e-05 | no | ok |",
    ]
    assert gpu_check.main(["executor", str(paths[1])]) == 0


def test_the_costs_table_puts_analytical_beside_measured(tmp_path, capsys):
    spec = load_model("nemotron-h-tiny").with_shape(1, 16)
    path = tmp_path / "tiny.profile.json"
    write_profile(profile_model(spec, threads=1, warmup=0, repeats=1), path)
    assert gpu_check.main(["costs", str(path), "--device", "H100"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Analytical (H100) against measured (") and "nemotron-h-tiny" in out[0]
    rows = [line for line in out if line.startswith("| ") and "---" not in line][1:]
    assert [r.split(" | ")[1] for r in rows] == [
        "embedding",
        "mamba2",
        "mlp",
        "attention",
        "lm_head_loss",
    ]
    # on this CPU each layer takes far longer than an H100's analytical time
    assert all(float(r.rstrip(" |").rsplit(" | ", 1)[1]) > 1 for r in rows[1:-1])


def test_the_compare_table_reads_octodsl_compare_json(tmp_path):
    c = {
        "plan": "p",
        "devices": 2,
        "costs": "analytical",
        "metrics": [
            {"metric": "busy", "device": 0, "simulated": 1.0, "measured": 1.0, "error": 0.0},
            {
                "metric": "iteration",
                "device": None,
                "simulated": 0.1,
                "measured": 0.125,
                "error": -0.2,
            },
        ],
    }
    path = tmp_path / "c.json"
    path.write_text(json.dumps(c))
    assert (
        gpu_check.compare_table([str(path)]).splitlines()[2]
        == "| p | 2 | analytical | 100.0 | 125.0 | -20.0% |"
    )
