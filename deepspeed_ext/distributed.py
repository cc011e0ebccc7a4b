"""`init_distributed()`: `deepspeed.init_distributed` that leaves nothing behind in /dev/shm.

On CPU, DeepSpeed's shared-memory all-reduce gives each rank a 69 MB segment
(/dev/shm/deepspeed_allreduce_buffer_UID_ADDR_PORT_RANK) that it never removes, so every launch
leaves ranks x 69 MB in memory until reboot (a test suite or a calibration fills the machine).
Every rank maps all the segments while it initialises, so once all ranks are past that the names
can go: the mappings live on until the processes end, and a crash can no longer leak them.
"""

from __future__ import annotations

import glob
import os

import deepspeed
import torch
import torch.distributed as dist


def init_distributed(backend: str | None = None) -> None:
    """Initialise torch.distributed through DeepSpeed (nccl with a GPU, else gloo, unless
    `backend` says), then unlink this rank's shared-memory segment once every rank has mapped
    it. A no-op when already initialised."""
    if dist.is_initialized():
        return
    deepspeed.init_distributed(dist_backend=backend or ("nccl" if torch.cuda.is_available() else "gloo"))
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
