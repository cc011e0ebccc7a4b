"""Selective recompute (octodsl.layers.recompute): what every layer kind drops after its forward
comes back in its backward, once, with the same values, so B then W (and a fused backward)
give the gradients of a forward that keeps everything, bit for bit."""

import gc

import pytest
import torch
from torch import nn

from octodsl.layers import LMHead, TiedEmbeddingHead, lm_loss, recompute
from octodsl.layers.recompute import dropping, recomputable
from octodsl.layers.split_backward import backward_input, backward_weight

from .test_layers import TINY, H

KINDS = {
    **{name: lambda c=c, cfg=cfg: c(cfg, H) for name, (c, cfg) in TINY.items()},
    "lm head": lambda: LMHead(11, H),
    "tied head": lambda: _Head(TiedEmbeddingHead(11, H)),
}


class _Head(nn.Module):
    def __init__(self, tied: TiedEmbeddingHead):
        super().__init__()
        self.tied = tied

    def forward(self, x):
        return self.tied.head(x)


def _run(module, x0, dy, labels, split: bool, selective: bool):
    """Output, input gradient and weight gradients of one forward and backward."""
    x = x0.clone().requires_grad_()
    if selective:
        with dropping():
            out = module(x)
    else:
        out = module(x)
    if labels is not None:
        out, dy = lm_loss(out, labels), None
    params = list(module.parameters())
    if split:
        (gx,), state = backward_input([out], [dy], [x])
        backward_weight(state, params)
    else:
        torch.autograd.backward([out], [dy])
        gx = x.grad
    grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return out.detach(), gx, grads


def _inputs(name):
    torch.manual_seed(0)
    module = KINDS[name]()
    x0 = torch.randn(2, 6, H)
    head = "head" in name
    labels = torch.randint(0, 11, (2, 6)) if head else None
    return module, x0, None if head else torch.randn(2, 6, H), labels


@pytest.mark.parametrize("split", [True, False], ids=["B then W", "fused"])
@pytest.mark.parametrize("name", list(KINDS))
def test_selective_recompute_gives_the_same_gradients_bit_for_bit(name, split):
    # the same operations on the same values: the forward's, run again on the kept inputs
    module, x0, dy, labels = _inputs(name)
    ref = _run(module, x0, dy, labels, split, selective=False)
    got = _run(module, x0, dy, labels, split, selective=True)
    assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])
    assert all(torch.equal(a, b) for a, b in zip(ref[2], got[2], strict=True))


def _held_after_forward(module, x, selective: bool) -> int:
    """Bytes the CPU allocator gives out during the forward and still holds after it: what the
    graph keeps for the backward, plus the output."""
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        if selective:
            with dropping():
                out = module(x)
        else:
            out = module(x)
    held = sum(e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    del out
    return held


@pytest.mark.parametrize("name", list(KINDS))
def test_selective_recompute_holds_less_after_the_forward(name):
    module, x0, _, _ = _inputs(name)
    x0 = x0.repeat(4, 8, 1)  # large enough that what is dropped is more than bookkeeping
    x = x0.requires_grad_()
    full, selective = _held_after_forward(module, x, False), _held_after_forward(module, x, True)
    # every kind drops at least its norm output (tokens x hidden), which its next op saves
    assert full - selective >= x.numel() * x.element_size(), (full, selective)


def test_each_region_runs_again_once_over_b_and_w():
    """B brings the dropped tensors back and keeps them: W, another autograd call, finds them
    without running the region a third time (PyTorch's non-reentrant checkpoint would)."""
    module, x0, dy, _ = _inputs("mamba2")
    calls = []
    module.norm.register_forward_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    x = x0.clone().requires_grad_()
    with dropping():
        out = module(x)
    assert len(calls) == 1
    _, state = backward_input([out], [dy], [x])
    assert len(calls) == 2  # B needed the norm output's storage for the in-projection
    backward_weight(state, list(module.parameters()))
    assert len(calls) == 2


def test_outside_dropping_nothing_is_dropped():
    module, x0, _, _ = _inputs("mlp swiglu")
    x = x0.repeat(4, 8, 1).requires_grad_()
    regions = []
    run = recompute._Scope.run
    recompute._Scope.run = lambda self, fn, args: regions.append(fn) or run(self, fn, args)
    try:
        module(x)
        with torch.no_grad(), dropping():  # a forward without grad saves nothing to drop
            module(x)
    finally:
        recompute._Scope.run = run
    assert regions == []


def test_a_region_output_modified_in_place_is_kept():
    # a later op saves the modified values, which running the region again would not give
    w = torch.randn(4, requires_grad=True)
    x = torch.randn(4, requires_grad=True)

    def forward():
        y = recomputable(torch.sin, x)
        y.mul_(3.0)
        return (y * w).sum()

    forward().backward()
    ref = w.grad.clone(), x.grad.clone()
    w.grad = x.grad = None
    with dropping():
        loss = forward()
    loss.backward()
    assert torch.equal(ref[0], w.grad) and torch.equal(ref[1], x.grad)


def _regions() -> list:
    gc.collect()
    return [o for o in gc.get_objects() if type(o) is recompute._Region]


def test_the_dropped_tensors_go_with_the_graph():
    # the handles in the graph hold the regions (and what they brought back), nothing else does
    module, x0, dy, _ = _inputs("attention")
    assert _regions() == []
    x = x0.clone().requires_grad_()
    with dropping():
        out = module(x)
    assert len(_regions()) == 2  # the norm and the attention core
    _, state = backward_input([out], [dy], [x])
    backward_weight(state, list(module.parameters()))
    del out, state
    assert _regions() == []
