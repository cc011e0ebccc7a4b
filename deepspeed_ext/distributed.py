"""`init_distributed()`: `deepspeed.init_distributed` that leaves nothing behind in /dev/shm;
`released_groups()`: a scope whose process groups are destroyed when it ends; `shutdown()`: the
orderly end of a script.

On CPU, DeepSpeed's shared-memory all-reduce gives each rank a 69 MB segment
(/dev/shm/deepspeed_allreduce_buffer_UID_ADDR_PORT_RANK) that it never removes, so every launch
leaves ranks x 69 MB in memory until reboot (a test suite or a calibration fills the machine).
Every rank maps all the segments while it initialises, so once all ranks are past that the names
can go: the mappings live on until the processes end, and a crash can no longer leak them.
"""

from __future__ import annotations

import gc
import glob
import os
from collections.abc import Iterator
from contextlib import contextmanager

import deepspeed
import torch
import torch.distributed as dist


def init_distributed(backend: str | None = None) -> None:
    """Initialise torch.distributed through DeepSpeed (nccl with a GPU, else gloo, unless
    `backend` says), then unlink this rank's shared-memory segment once every rank has mapped
    it. A no-op when already initialised."""
    if dist.is_initialized():
        return
    deepspeed.init_distributed(
        dist_backend=backend or ("nccl" if torch.cuda.is_available() else "gloo")
    )
    port, rank = os.environ.get("MASTER_PORT"), dist.get_rank()
    if port is None:
        return
    mine = glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_{rank}")
    if dist.get_world_size() > 1:
        dist.barrier()  # every rank has mapped every segment
    for path in mine:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


@contextmanager
def released_groups() -> Iterator[None]:
    """Destroy, on leaving, every process group created inside (on every rank: all ranks must
    leave together). Each engine creates its own groups (DeepSpeed's grid, our message streams)
    and gloo keeps three polling threads per group alive until the group is destroyed, so a
    process that builds one engine after another (a calibration launch runs several plans)
    slows down with every engine it built: about 10% after a hundred groups on a CPU. The
    engine must not be used after the scope."""
    # torch keeps its groups in a private registry; without it nothing can be released.
    registry = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_map", None)
    before = set(registry) if registry is not None else None
    try:
        yield
    finally:
        if registry is not None and before is not None and dist.is_initialized():
            dist.barrier()  # no rank still talks over a group about to go
            for group in [g for g in registry if g not in before]:
                dist.destroy_process_group(group)
            gc.collect()  # the threads stop when the last reference to the group goes


def shutdown() -> None:
    """Destroy every process group, once all ranks get here; call it last in a script. Left to
    the interpreter's teardown, gloo's threads are sometimes destroyed while still running and
    the rank aborts ("terminate called without an active exception") after all its work is
    done, so the launcher reports a failed job. A no-op when torch.distributed is not set up."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
