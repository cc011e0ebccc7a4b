"""Running layer cases on gloo process groups: the processes are spawned once per module, every
rank runs every case, and each case's largest difference over the ranks (or a traceback) comes
back to the test process, where each case is judged by its own test."""

from __future__ import annotations

import contextlib
import json
import os
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from octodsl.layers import recompute
from octodsl.layers import tensor_parallel as tpl
from octodsl.layers.split_backward import backward_input, backward_weight

from ..conftest import free_port

COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")


@contextlib.contextmanager
def counting_collectives() -> Iterator[list[str]]:
    """The torch.distributed collectives called inside the block, by name (still run)."""
    calls: list[str] = []
    real = {name: getattr(dist, name) for name in COLLECTIVES}

    def counted(name: str) -> Callable:
        def call(*args, **kwargs):
            calls.append(name)
            return real[name](*args, **kwargs)

        return call

    for name in COLLECTIVES:
        setattr(dist, name, counted(name))
    try:
        yield calls
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)


def run_layer(
    layer: torch.nn.Module, xt: torch.Tensor, gyt: torch.Tensor, variant: str, tp: tpl.TpGroup
) -> torch.Tensor:
    """`layer`'s output on this rank's input `xt`, and its gradients for the output gradient
    `gyt` as `variant` says (`recompute`: the forward under selective recompute; `split`: B, then
    W, which must touch no weight before it and call no collective), the sequence-parallel
    parameters' gradients summed over the tp group as the engine sums them."""
    with recompute.dropping() if "recompute" in variant else contextlib.nullcontext():
        yt = layer(xt)
    if variant.endswith("split"):
        (gx,), state = backward_input([yt], [gyt], [xt])
        assert not any(p.grad is not None for p in layer.parameters()), "B touched a weight"
        with counting_collectives() as calls:
            backward_weight(state, list(layer.parameters()))
        assert not calls, f"W communicated: {calls}"
        xt.grad = gx
    else:
        yt.backward(gyt)
    tpl.all_reduce_sequence_parallel_grads(layer.parameters(), tp)
    return yt


@contextlib.contextmanager
def reporting(rank: int, world: int, port: int, out: str) -> Iterator[dict[str, object]]:
    """A float64 one-thread gloo process of `world`; what the block `record`s in the dict it
    gets is written for `spawned` to read."""
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        # a rank that raised mid-case leaves its peers waiting in a collective: fail, not hang
        timeout=timedelta(seconds=60),
    )
    results: dict[str, object] = {}
    try:
        yield results
    finally:
        with open(f"{out}.{rank}", "w") as f:
            json.dump(results, f)
        dist.destroy_process_group()


def record(results: dict[str, object], key: str, run: Callable[..., float], *args) -> None:
    """Run one case, run(*args), on every rank: its largest difference over the ranks, or where
    it raised (on any rank) infinity and that rank's traceback."""
    try:
        err = torch.tensor(run(*args))
    except Exception:
        results[key] = traceback.format_exc()
        err = torch.tensor(float("inf"))
    dist.all_reduce(err, op=dist.ReduceOp.MAX)
    results.setdefault(key, float(err))


def spawned(worker: Callable, world: int, out: str, *args) -> dict[str, object]:
    """Run worker(rank, world, port, out, *args) on `world` processes; their merged results."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(worker, args=(world, free_port(), out, *args), nprocs=world, join=True)
    merged: dict[str, object] = {}
    for rank in range(world):
        with open(f"{out}.{rank}") as f:
            for k, v in json.load(f).items():
                if isinstance(v, str) or k not in merged:  # a traceback wins
                    merged[k] = v
    return merged
