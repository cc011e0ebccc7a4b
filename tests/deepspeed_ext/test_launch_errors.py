"""The executor on real processes when something goes wrong: every problem is one clear line,
never a traceback on every rank (launch_cases.py runs the cases; examples/train.py is launched
as users launch it)."""

from __future__ import annotations

import json

import pytest

from octodsl.gen import generate_text

from .test_executor import HERE, launch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = tmp_path_factory.mktemp("checkpoints") / "result.json"
    proc = launch(2, str(HERE / "launch_cases.py"), "checkpoints", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    ranks = json.loads(out.read_text())["ranks"]
    assert ranks[0] == ranks[1]  # every rank raised the same error at the same point
    return ranks[0]


def test_a_folder_one_rank_cannot_write_is_found_before_training(checkpoints):
    assert checkpoints["probe"].startswith("CheckpointError: cannot save checkpoints in ")
    assert checkpoints["probe"].endswith("probed: rank 1: File too large")


def test_loading_from_a_folder_without_a_checkpoint_is_an_error(checkpoints):
    assert checkpoints["missing"].endswith("nothing-here: ranks 0, 1: no such folder")
    assert checkpoints["empty"].endswith(
        "probed: ranks 0, 1: it holds no checkpoint (no 'latest' file naming one)"
    )


def test_a_checkpoint_of_another_layout_names_both(checkpoints):
    assert (
        "ranks 0, 1: checkpoint global_step1 was saved with 2 stages (layers 0..11, 12..23) on "
        "devices 0, 1, but this plan runs 4 stages (layers 0..5, 6..11, 12..17, 18..23) on "
        "devices 0, 1, 1, 0" in checkpoints["layout"]
    )


def test_a_disk_that_fills_while_saving_is_one_error_and_loses_nothing(checkpoints):
    full = checkpoints["full"]
    assert full.startswith("CheckpointError: saving checkpoint global_step2 in ")
    assert ": rank 1: writing its files failed (" in full and " free there" in full
    assert checkpoints["latest"] == "global_step1"  # still the last complete checkpoint
    assert checkpoints["resumed_at"] == 1


def test_a_killed_peer_is_named_by_the_survivor(tmp_path):
    out = tmp_path / "result.json"
    proc = launch(2, str(HERE / "launch_cases.py"), "killed", str(out))
    assert proc.returncode != 0 and not out.exists()
    assert (
        "octodsl watchdog: rank 0 (device 0, data-parallel copy 0) lost rank 1 (device 1): its "
        "connection closed (the process ended) while this rank waited for " in proc.stderr
    )
    assert "Traceback" not in proc.stderr and "Connection closed by peer" not in proc.stderr


def test_train_py_checks_its_save_folder_before_training(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    plan = tmp_path / "plan.octo"
    plan.write_text(
        generate_text(
            "1f1b",
            devices=2,
            microbatches=8,
            model="nemotron-h-tiny",
            microbatch_size=1,
            seq_len=16,
        )
    )
    proc = launch(
        2,
        "examples/train.py",
        "--deepspeed_config",
        "examples/ds_config.json",
        "--schedule",
        str(plan),
        "--save",
        str(not_a_folder / "ck"),
        "--steps",
        "1",
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert errors == [
        f"train.py: error: cannot save checkpoints in {not_a_folder / 'ck'}: "
        f"ranks 0, 1: Not a directory: {not_a_folder / 'ck'}"
    ], proc.stderr
    assert '"step"' not in proc.stdout and "Traceback" not in proc.stderr
