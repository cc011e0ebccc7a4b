"""Multi-process checks of what the executor does when something goes wrong, run under the
deepspeed launcher by test_launch_errors.py:

    deepspeed --num_gpus 2 tests/deepspeed_ext/launch_cases.py CASE OUT.json

The model, plans and helpers are harness.py's. A case that ends normally has every rank's
findings written by rank 0 to OUT.json.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch.distributed as dist  # noqa: E402
from harness import (  # noqa: E402
    SEED,
    SEQ,
    SPEC,
    M,
    build_ours,
    config,
    even,
    main,
    train,
    with_partition,
)
from train import step_data  # noqa: E402

from octodsl.errors import OctoError  # noqa: E402
from octodsl.gen import generate  # noqa: E402


@contextmanager
def file_limit(nbytes: int | None):
    """Files this process writes may grow to `nbytes` (None: no change): writes beyond fail as
    on a full disk (EFBIG instead of SIGXFSZ)."""
    if nbytes is None:
        yield
        return
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)
        signal.signal(signal.SIGXFSZ, handler)


def error_of(call) -> str | None:
    try:
        call()
    except OctoError as e:
        return f"{type(e).__name__}: {e}"
    return None


def case_checkpoints(out_dir: Path) -> dict:
    """Save and load problems, each reported on every rank with the group still usable."""
    rank = dist.get_rank()
    plan = with_partition(generate("1f1b", devices=2, microbatches=M), even(2))
    v_plan = with_partition(generate("zb-v", devices=2, microbatches=M), even(4))
    box = [tempfile.mkdtemp(dir=out_dir) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    tmp = Path(box[0])
    found: dict = {}
    engine = build_ours(plan, config())
    train(engine, 1)
    with file_limit(0 if rank == 1 else None):  # rank 1 cannot write a byte
        found["probe"] = error_of(lambda: engine.check_save_dir(tmp / "probed"))
    found["missing"] = error_of(lambda: engine.load_checkpoint(tmp / "nothing-here"))
    found["empty"] = error_of(lambda: engine.load_checkpoint(tmp / "probed"))
    engine.save_checkpoint(tmp / "ck")
    other = build_ours(v_plan, config())
    found["layout"] = error_of(lambda: other.load_checkpoint(tmp / "ck"))
    train(engine, 1, first=1)
    with file_limit(4096 if rank == 1 else None):  # the disk fills while rank 1 saves
        found["full"] = error_of(lambda: engine.save_checkpoint(tmp / "ck"))
    found["latest"] = (tmp / "ck" / "latest").read_text()
    again = build_ours(plan, config())  # the ranks are still together
    again.load_checkpoint(tmp / "ck")
    found["resumed_at"] = again.global_steps
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, found)
    return {"ranks": everyone}


def case_killed(out_dir: Path) -> dict:
    """Rank 1 is killed in the middle of a step: rank 0's watchdog must name it."""
    plan = with_partition(generate("1f1b", devices=2, microbatches=M), even(2))
    engine = build_ours(plan, config())
    train(engine, 1)
    data = step_data(SEED, 1, 0, M, 1, SEQ, SPEC.vocab)
    if dist.get_rank() == 1:
        data = _dying(data)
    engine.train_batch(data)
    return {"finished": True}


def _dying(it):
    yield next(it)
    time.sleep(1)  # rank 0 is waiting for this rank by now
    os.kill(os.getpid(), signal.SIGKILL)


CASES = {"checkpoints": case_checkpoints, "killed": case_killed}


if __name__ == "__main__":
    main(CASES)
