"""The bytes per parameter octodsl counts for DeepSpeed (octodsl.costs.param_bytes) are what
DeepSpeed's pipeline engine holds: a bf16 model at ZeRO 0 gets the BF16_Optimizer (each
`.grad`, a flat bf16 accumulator, an fp32 master copy and Adam's m and v: 2 + 2 + 2 + 12), at
ZeRO 1 the ZeRO optimizer (2 + 2 + 12), measured on one process (dp 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from octodsl.costs.param_bytes import param_bytes

from ..conftest import free_port

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("zero,optimizer", [(0, "BF16_Optimizer"), (1, "DeepSpeedZeroOptimizer")])
def test_deepspeed_holds_the_bytes_octodsl_counts(zero, optimizer):
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "LOCAL_RANK": "0",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    script = Path(__file__).with_name("held_bytes.py")
    proc = subprocess.run(
        [sys.executable, str(script), str(zero), str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["optimizer"] == optimizer
    # byte counts of whole storages over a parameter count that divides them: exact
    assert got["bytes_per_param"] == param_bytes("bf16", "deepspeed", zero, 1).total
