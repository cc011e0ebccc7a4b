"""The expert-parallel MoE layer against the ep 1 layer, on gloo process groups of 2 and 4
processes in float64: ep groups carved out of the data-parallel copies (rank = tp rank + tp x
copy, as the executor's mesh orders them), every copy feeding its own input.

Each rank's output and input gradient must equal the ep 1 layer's on that rank's input; a local
expert's parameter gradient the sum over the ep group's copies of that expert's ep 1 gradient
(what the expert-data-parallel reduction then completes); every other parameter gradient the ep
1 one of the rank's own copy. With tp the ep 1 layer is the unsplit one and each parameter is
compared as the rank's tp shard of it. Fused backward, and a split backward's B then W (W must
not communicate), also under selective recompute; routings steered so that a rank sends nothing
to its peer, an expert receives no row and a rank receives none at all.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist

from octodsl.layers import MoE
from octodsl.layers import expert_parallel as epl
from octodsl.layers import tensor_parallel as tpl
from octodsl.models.load import SpecError
from octodsl.models.spec import MoEConfig

from .multiprocess import record, reporting, run_layer, spawned
from .test_tensor_parallel import expected_shard, moe_shards

HIDDEN, BATCH, SEQ = 16, 2, 8
TOL = 1e-10
SEED = 5
EXPERT_PARAMS = ("w_in", "w_out")

STEER = 10.0
"""Added to a steered input's feature: its tokens' router logits are then the routes'."""
ROUTES = torch.tensor([[4.0, 3.0, -4.0, -4.0], [4.0, -4.0, 3.0, -4.0]]).T
"""Router weights on features 0 and 1 of a 4-expert layer: a token steered by feature 0 picks
experts {0, 1}, by feature 1 experts {0, 2} (top 2)."""


@dataclass(frozen=True)
class Case:
    cfg: MoEConfig
    feature: Callable[[int], int] | None = None
    """The feature that steers data-parallel copy d's tokens (None: the router's own init)."""


@dataclass(frozen=True)
class Mesh:
    tp: int
    ep: int
    sp: bool = False

    def __str__(self) -> str:
        return f"tp{self.tp}-ep{self.ep}" + ("-sp" if self.sp else "")


SWIGLU = MoEConfig(
    experts=4, top_k=2, expert_ffn=8, shared_ffn=12, activation="swiglu", aux_loss_coef=0.1
)
CASES = {
    "swiglu-shared": Case(SWIGLU),
    "relu2-8-experts": Case(
        MoEConfig(experts=8, top_k=3, expert_ffn=8, activation="relu2", aux_loss_coef=0.1)
    ),
    # at ep 2 the first copy of each group routes to its own experts only and sends its peer
    # nothing; expert 3 receives no row
    "one-sided": Case(SWIGLU, lambda d: d % 2),
    # experts 2 and 3 receive nothing: at ep 2 the second rank of a group receives no row at all
    "idle-rank": Case(SWIGLU, lambda d: 0),
}
WORLDS = {2: (Mesh(1, 2),), 4: (Mesh(1, 2), Mesh(1, 4), Mesh(2, 2), Mesh(2, 2, sp=True))}
"""The meshes run on a world of each size (4 processes at ep 2: two ep groups)."""
VARIANTS = ("fused", "split", "recompute-split")


def make(case: Case) -> MoE:
    """The layer for the groups being built (same seed: same init), steered as the case says."""
    torch.manual_seed(SEED)
    layer = MoE(case.cfg, HIDDEN)
    if case.feature is not None:
        with torch.no_grad():
            layer.router.weight[:, : ROUTES.shape[1]] = ROUTES
    return layer


def inputs(case: Case, copy: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Data-parallel copy `copy`'s input and output gradient."""
    torch.manual_seed(SEED + 1 + copy)
    x, gy = torch.randn(BATCH, SEQ, HIDDEN), torch.randn(BATCH, SEQ, HIDDEN)
    if case.feature is not None:
        x[..., case.feature(copy)] += STEER
    return x, gy


def experts_used(layer: MoE, x: torch.Tensor) -> set[int]:
    with torch.no_grad():
        return set(layer.router(layer.norm(x)).topk(layer.cfg.top_k).indices.unique().tolist())


class Reference(NamedTuple):
    """The ep 1 layer on one copy's input."""

    y: torch.Tensor
    gx: torch.Tensor
    grads: dict[str, torch.Tensor]


def reference(layer: MoE, case: Case, copy: int) -> Reference:
    """The ep 1 layer's output, input gradient and parameter gradients on copy `copy`."""
    x, gy = inputs(case, copy)
    if case.feature is not None:  # the steering works: the experts the case says
        assert experts_used(layer, x) == {0, 1 + case.feature(copy)}
    x.requires_grad_()
    y = layer(x)
    names, params = zip(*layer.named_parameters(), strict=True)
    gx, *grads = torch.autograd.grad(y, [x, *params], gy)
    return Reference(y.detach(), gx, dict(zip(names, grads, strict=True)))


def run_case(
    case: Case, tp: tpl.TpGroup, ep: epl.EpGroup, copies: list[int], copy: int, variant: str
) -> float:
    """The largest difference between the ep layer on data-parallel copy `copy` and the ep 1
    layer, on this rank; `copies`: those of its ep group."""
    ref = make(case)
    with tpl.building(tp), epl.building(ep):
        layer = make(case)
    refs = {d: reference(ref, case, d) for d in copies}

    x, gy = inputs(case, copy)
    xt = tpl.seq_slice(x, tp).clone().requires_grad_()
    yt = run_layer(layer, xt, tpl.seq_slice(gy, tp), variant, tp)

    own = refs[copy]
    diffs = [
        (yt - tpl.seq_slice(own.y, tp)).abs().max(),
        (xt.grad - tpl.seq_slice(own.gx, tp)).abs().max(),
    ]
    refs_params = dict(ref.named_parameters())
    shards = moe_shards(case.cfg) if tp.size > 1 else {}
    for name, p in layer.named_parameters():
        r, grad = refs_params[name], own.grads[name]
        if name in EXPERT_PARAMS:
            mine = ep.local_experts(case.cfg.experts)
            r, grad = r[mine], sum(refs[d].grads[name] for d in copies)[mine]
            assert (p.allreduce, p.group_name) == (False, f"ep_size_{ep.size}"), name
            if p.grad is None:  # no row reached this rank's experts
                assert not grad.any(), f"{name} got no gradient"
                p.grad = torch.zeros_like(p)
        else:
            assert not hasattr(p, "allreduce"), f"{name} marked an expert parameter"
        if name in shards:
            r, grad = (expected_shard(t, shards[name], tp.rank) for t in (r, grad))
        diffs += [(p - r).abs().max(), (p.grad - grad).abs().max()]
    return float(torch.stack(diffs).max())


def _worker(rank: int, world: int, port: int, out: str) -> None:
    with reporting(rank, world, port, out) as results:
        for mesh in WORLDS[world]:
            # every rank creates every group, in the same order
            copies = world // mesh.tp
            tp_groups = [
                dist.new_group([t + mesh.tp * d for t in range(mesh.tp)]) for d in range(copies)
            ]
            ep_groups = {
                (t, k): dist.new_group([t + mesh.tp * d for d in range(k, k + mesh.ep)])
                for t in range(mesh.tp)
                for k in range(0, copies, mesh.ep)
            }
            t, copy = rank % mesh.tp, rank // mesh.tp
            first = copy - copy % mesh.ep
            tp = tpl.TpGroup(mesh.tp, t, tp_groups[copy], mesh.sp) if mesh.tp > 1 else tpl.TpGroup()
            ep = epl.EpGroup(mesh.ep, copy % mesh.ep, ep_groups[t, first])
            ep_copies = list(range(first, first + mesh.ep))
            for name, case in CASES.items():
                for variant in VARIANTS:
                    key = f"{world}/{mesh}/{name}/{variant}"
                    record(results, key, run_case, case, tp, ep, ep_copies, copy, variant)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, object]:
    merged: dict[str, object] = {}
    for world in WORLDS:
        merged |= spawned(_worker, world, str(tmp_path_factory.mktemp(f"ep{world}") / "results"))
    return merged


@pytest.mark.slow  # 2 then 4 processes run every case
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("world, mesh", [(w, m) for w, ms in WORLDS.items() for m in ms], ids=str)
def test_ep_layer_equals_ep1(results, world, mesh, case, variant):
    got = results[f"{world}/{mesh}/{case}/{variant}"]
    assert not isinstance(got, str), got
    assert got <= TOL, got


def test_ep1_is_the_layer_itself():
    # the same init draws, nothing marked, no collective (this process has no process group)
    plain = make(CASES["swiglu-shared"])
    with epl.building(epl.EpGroup()):
        one = make(CASES["swiglu-shared"])
    for (n, a), (m, b) in zip(plain.named_parameters(), one.named_parameters(), strict=True):
        assert n == m and torch.equal(a, b) and not hasattr(b, "allreduce")
    x = torch.randn(BATCH, SEQ, HIDDEN, requires_grad=True)
    one(x).sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize("size, rank", [(0, 0), (-2, 0), (2, 2), (2, -1)])
def test_an_impossible_ep_group_is_refused(size, rank):
    with pytest.raises(ValueError, match=f"size {size}, rank {rank}"):
        epl.EpGroup(size, rank)


def test_ep_not_dividing_the_experts_is_refused_before_any_communication():
    with epl.building(epl.EpGroup(3, 0)), pytest.raises(SpecError, match="ep 3 cannot split 4"):
        MoE(SWIGLU, HIDDEN)


def test_dispatch_bytes_by_hand():
    # 4096 tokens x top 2 x 1024 bf16 values: 16 MiB of rows, 3/4 of them to the 3 other ranks
    assert epl.dispatch_bytes(4096, 2, 1024, 2, ep=4) == 12 * 2**20
    assert epl.dispatch_bytes(4096, 2, 1024, 2, ep=1) == 0
    assert epl.dispatch_bytes(10, 1, 3, 4, ep=2) == 60


def _waiting_worker(rank: int, world: int, port: int, out: str) -> None:
    with reporting(rank, world, port, out) as results:
        ep = epl.EpGroup(2, rank, dist.new_group([0, 1]))
        case = CASES["swiglu-shared"]
        with epl.building(ep):
            layer = make(case)
        x, gy = inputs(case, rank)
        runs = []
        works: list[dist.Work] = []

        def wait(work: dist.Work) -> None:
            works.append(work)
            work.wait()

        for waited in (False, True):
            xt = x.clone().requires_grad_()
            with epl.waiting(wait) if waited else contextlib.nullcontext():
                layer(xt).backward(gy)
            runs.append((xt.grad, len(works)))
        results[f"waits{rank}"] = runs[1][1]
        results[f"same{rank}"] = bool(torch.equal(runs[0][0], runs[1][0]))
        # an executor lane: the forward on another thread inside `lane` issues on the lane's
        # group and waits with the lane's wait; the backward, on this thread, as before
        lane_group, lane_works, issued = dist.new_group([0, 1]), [], []
        issue = epl.dist.all_to_all_single

        def noted(*args, group=None, **kwargs):
            issued.append(("lane" if group is lane_group else "layer", threading.current_thread()))
            return issue(*args, group=group, **kwargs)

        def lane_wait(work: dist.Work) -> None:
            lane_works.append(work)
            work.wait()

        xt, box = x.clone().requires_grad_(), []

        def forward() -> None:
            with epl.lane(lane_group, lane_wait):
                box.append(layer(xt))

        epl.dist.all_to_all_single = noted
        try:
            thread = threading.Thread(target=forward)
            thread.start()
            thread.join()
            with epl.waiting(wait):
                box[0].backward(gy)
        finally:
            epl.dist.all_to_all_single = issue
        here = threading.current_thread()
        results[f"lane{rank}"] = [
            (where, "this thread" if t is here else "the lane") for where, t in issued
        ]
        results[f"lane_waits{rank}"] = [len(lane_works), len(works) - runs[1][1]]
        results[f"lane_same{rank}"] = bool(torch.equal(runs[0][0], xt.grad))


@pytest.mark.slow  # 2 processes
def test_the_all_to_alls_wait_through_the_waiter_the_executor_sets(tmp_path):
    got = spawned(_waiting_worker, 2, str(tmp_path / "results"))
    # forward: the counts, the rows out, the outputs back; backward: the last two reversed
    assert [got["waits0"], got["waits1"]] == [5, 5], got
    assert got["same0"] and got["same1"], got
    # in a lane: the forward's three on the lane's group and wait, the backward's two not
    lane = [["lane", "the lane"]] * 3 + [["layer", "this thread"]] * 2
    assert got["lane0"] == got["lane1"] == lane, got
    assert got["lane_waits0"] == got["lane_waits1"] == [3, 2], got
    assert got["lane_same0"] and got["lane_same1"], got
