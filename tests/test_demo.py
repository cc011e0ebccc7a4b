"""`make demo`'s last step: examples/demo_summary.py reads train.py's step lines and `octodsl
compare --json` output; examples/train.py takes `--task`."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import sys

import pytest
import torch

from octodsl.errors import OctoError

from .conftest import REPO

sys.path.insert(0, str(REPO / "examples"))
summary = importlib.import_module("demo_summary")


def _train():
    """examples/train.py as a module of its own name: tests/deepspeed_ext/test_train_script.py
    imports it as `train` and expects to be the first (train.py sets DS_ACCELERATOR on import)."""
    had = os.environ.get("DS_ACCELERATOR")
    spec = importlib.util.spec_from_file_location("demo_train", REPO / "examples" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if had is None:  # train.py chooses the CPU for its own process, not for the test session
        os.environ.pop("DS_ACCELERATOR", None)
    return module


train = _train()


def _step(i: int, loss: float) -> str:
    return json.dumps({"step": i, "loss": loss, "tokens_per_s": 1.0, "step_seconds": 1.0})


def test_losses_skip_launcher_lines():
    lines = [
        "[2026-12-01 15:00:00] [INFO] launching",
        "train.py: nemotron-h-tiny, ...",
        _step(0, 9.1),
        "{not json",
        '{"other": 1}',
        _step(1, 8.5),
    ]
    assert summary.losses(lines) == [9.1, 8.5]


def test_loss_line_shows_steps_1_5_10_15_20_and_the_last():
    run = [9.0 - 0.4 * i for i in range(22)]
    line = summary.loss_line(run, math.log(16), 16)
    assert (
        "step 1: 9.00  step 5: 7.40  step 10: 5.40  step 15: 3.40  step 20: 1.40  step 22: 0.60"
        in line
    )
    assert "ln 16 = 2.77" in line
    assert "step 5" not in summary.loss_line(run[:3], math.log(16), 16)


def _compare(simulated: float, measured: float, costs: str) -> dict:
    return {
        "steps": 20,
        "timed_steps": 19,
        "costs": costs,
        "metrics": [
            {"metric": "busy", "device": 0, "simulated": 0.1, "measured": 0.2, "error": -0.5},
            {
                "metric": "iteration",
                "device": None,
                "simulated": simulated,
                "measured": measured,
                "error": simulated / measured - 1,
            },
        ],
    }


def test_time_lines_put_measured_and_each_simulation_side_by_side():
    lines = summary.time_lines(
        [
            ("a profile", _compare(1.1, 1.0, "profile p.json")),
            ("analytical", _compare(0.5, 1.0, "analytical tiny on cpu")),
        ]
    )
    assert lines[0].endswith("measured 1.000 s") and "19 of 20 steps" in lines[0]
    assert "simulated 1.100 s (+10%) from a profile [profile p.json]" in lines[1]
    assert "simulated 0.500 s (-50%) from analytical" in lines[2]


def test_main_prints_the_screen(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text("\n".join(_step(i, 9.0 - 0.4 * i) for i in range(20)) + "\n")
    cmp = tmp_path / "c.json"
    cmp.write_text(json.dumps(_compare(2.0, 1.0, "analytical")))
    assert (
        summary.main(
            [
                str(log),
                "--task",
                "modadd",
                "--model",
                "nemotron-h-tiny",
                "--compare",
                f"analytical costs={cmp}",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "step 20: 1.40" in out and "measured 1.000 s" in out and "simulated 2.000 s (+100%)" in out
    )


@pytest.mark.parametrize("text", ["", "[INFO] nothing\n"])
def test_main_without_step_lines_is_one_error(tmp_path, capsys, text):
    log = tmp_path / "train.log"
    log.write_text(text)
    assert summary.main([str(log), "--task", "modadd", "--model", "nemotron-h-tiny"]) == 2
    assert capsys.readouterr().err.startswith("demo_summary.py: error:")


def test_train_takes_a_task_and_refuses_an_unknown_one():
    base = ["--deepspeed_config", "ds.json", "--schedule", "p.octo"]
    assert train.parse_args(base).task == "affine"
    assert train.parse_args([*base, "--task", "modadd"]).task == "modadd"
    with pytest.raises(OctoError, match="invalid choice: 'copy'"):
        train.parse_args([*base, "--task", "copy"])


def test_train_data_default_is_affine_and_modadd_stays_in_16_ids():
    ids, labels = next(train.step_data(1234, 0, 0, 2, 1, 64, 8192))
    assert torch.equal(labels, (5 * ids + 3) % 8192)
    ids, labels = next(train.step_data(1234, 0, 0, 2, 1, 64, 8192, "modadd"))
    assert torch.equal(labels, (ids + 3) % 16)
