"""B then W gives exactly the gradients of one fused backward."""

import pytest
import torch
from torch import nn

from octodsl.layers.split_backward import (
    WeightGradState,
    backward_input,
    backward_weight,
)


class Block(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.norm = nn.LayerNorm(h)
        self.up = nn.Linear(h, 2 * h)
        self.down = nn.Linear(2 * h, h)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Shared(nn.Module):
    """One linear used twice on the input path, plus a weight tied to another module."""

    def __init__(self, h: int, tied: nn.Linear):
        super().__init__()
        self.lin = nn.Linear(h, h)
        self.tied = tied

    def forward(self, x):
        return self.tied(torch.tanh(self.lin(torch.tanh(self.lin(x)))))


class TwoOut(nn.Module):
    """Multi-output: a hidden state and a side output that depends on a weight only."""

    def __init__(self, h: int):
        super().__init__()
        self.a = nn.Linear(h, h)
        self.bias = nn.Parameter(torch.randn(h))
        self.scale = nn.Parameter(torch.randn(h))

    def forward(self, x):
        h = self.a(x)
        return h * self.scale, h.sum(0) + self.bias, self.scale * 2


def _grads(params):
    out = [None if p.grad is None else p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return out


def _check(model, make_inputs, out_grads):
    params = list(model.parameters())
    torch.manual_seed(1)
    inputs = make_inputs()
    outs = model(*inputs)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    torch.autograd.backward(
        [o for o, g in zip(outs, out_grads, strict=True) if g is not None or o.numel() == 1],
        [g for o, g in zip(outs, out_grads, strict=True) if g is not None or o.numel() == 1],
    )
    ref_in = [None if t.grad is None else t.grad.clone() for t in inputs]
    ref = _grads(params)

    torch.manual_seed(1)
    inputs = make_inputs()
    outs = model(*inputs)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    fired = []
    hooks = [p.register_post_accumulate_grad_hook(lambda p: fired.append(p)) for p in params]
    in_grads, state = backward_input(outs, out_grads, inputs)
    assert not fired, "B must not accumulate weight gradients"
    assert all(p.grad is None for p in params)
    backward_weight(state, params)
    for h in hooks:
        h.remove()
    got = _grads(params)
    for r, g in zip(ref_in, in_grads, strict=True):
        assert (r is None and g is None) or torch.equal(r, g)
    for r, g in zip(ref, got, strict=True):
        assert (r is None and g is None) or torch.equal(r, g)
    assert {id(p) for p in fired} == {
        id(p) for p, g in zip(params, ref, strict=True) if g is not None
    }


def test_chain_of_blocks():
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(16) for _ in range(3)])
    _check(model, lambda: [torch.randn(5, 16, requires_grad=True)], [torch.randn(5, 16)])


def test_shared_and_tied_parameters():
    torch.manual_seed(0)
    tied = nn.Linear(8, 8)
    model = nn.Sequential(Shared(8, tied), nn.ReLU(), tied)
    _check(model, lambda: [torch.randn(4, 8, requires_grad=True)], [torch.randn(4, 8)])


def test_reused_weight_below_a_single_one():
    """A weight used twice on the input path, under a weight used once."""
    torch.manual_seed(0)
    _check(
        Shared(8, nn.Linear(8, 8)),
        lambda: [torch.randn(4, 8, requires_grad=True)],
        [torch.randn(4, 8)],
    )


def test_multi_output_and_weight_only_output():
    torch.manual_seed(0)
    model = TwoOut(6)
    _check(
        model,
        lambda: [torch.randn(3, 6, requires_grad=True)],
        [torch.randn(3, 6), torch.randn(6), torch.randn(6)],
    )


def test_input_without_grad_and_scalar_loss():
    """The first stage: token-like inputs need no gradient, so W does the whole backward."""
    torch.manual_seed(0)
    emb = nn.Embedding(10, 8)
    head = nn.Linear(8, 10)
    head.weight = emb.weight  # tied embedding and head

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.block, self.head = emb, Block(8), head

        def forward(self, ids):
            return self.head(self.block(self.emb(ids))).logsumexp(-1).mean()

    _check(LM(), lambda: [torch.randint(0, 10, (4,))], [None])


def _layer_by_layer(blocks, x0, g0) -> list:
    """Each block run on a detached input, then B block by block from the top: the W states."""
    ins, outs, x = [], [], x0
    for b in blocks:
        x = x.detach().requires_grad_()
        ins.append(x)
        x = b(x)
        outs.append(x)
    g, states = g0, []
    for xi, y in zip(reversed(ins), reversed(outs), strict=True):
        (g,), st = backward_input([y], [g], [xi])
        states.append(st)
    return states


def test_merged_layers_match_fused():
    """Layers run on detached inputs: B layer by layer, one merged W for all of them."""
    torch.manual_seed(0)
    blocks = [Block(8) for _ in range(4)]
    params = [p for b in blocks for p in b.parameters()]
    x0 = torch.randn(3, 8)
    g0 = torch.randn(3, 8)
    nn.Sequential(*blocks)(x0.requires_grad_()).backward(g0)
    ref = _grads(params)

    states = _layer_by_layer(blocks, x0, g0)
    assert all(p.grad is None for p in params)
    backward_weight(WeightGradState.merge(states), params)
    for r, p in zip(ref, params, strict=True):
        assert torch.equal(r, p.grad)


def test_merged_layers_sharing_a_module_match_fused():
    """A linear reused by two layers, below another weight in one of them: the merged W must
    not reach it twice."""
    torch.manual_seed(0)
    shared = nn.Linear(8, 8)
    first = nn.Sequential(shared, nn.Tanh())
    second = nn.Sequential(nn.LayerNorm(8), shared, nn.Tanh(), nn.Linear(8, 8))
    blocks = [first, Block(8), second]
    params = list({id(p): p for b in blocks for p in b.parameters()}.values())
    x0, g0 = torch.randn(3, 8), torch.randn(3, 8)
    nn.Sequential(*blocks)(x0.requires_grad_()).backward(g0)
    ref = _grads(params)

    states = _layer_by_layer(blocks, x0, g0)
    backward_weight(WeightGradState.merge(states), params)
    for r, p in zip(ref, params, strict=True):
        torch.testing.assert_close(p.grad, r, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_low_precision_cast_weights(dtype):
    """Weights cast inside forward (as under bf16): the cast sits on the weight side."""
    torch.manual_seed(0)

    class Cast(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return torch.tanh(x @ self.w.to(dtype)) @ self.w.to(dtype)

    _check(
        Cast(),
        lambda: [torch.randn(4, 8, dtype=dtype, requires_grad=True)],
        [torch.randn(4, 8, dtype=dtype)],
    )


@pytest.mark.parametrize(
    "make",
    [lambda: nn.Sequential(*[Block(8) for _ in range(3)]), lambda: Shared(8, nn.Linear(8, 8))],
)
def test_no_node_runs_twice(make):
    """Every node of the graph runs once over B and W, except the restart nodes, which run
    their input side in B and their weight side in W: no work is repeated."""
    torch.manual_seed(0)
    model = make()
    x = torch.randn(4, 8, requires_grad=True)
    y = model(x)
    nodes, stack = set(), [y.grad_fn]
    while stack:
        n = stack.pop()
        if n is not None and n not in nodes:
            nodes.add(n)
            stack += [c for c, _ in n.next_functions]
    runs = {n: 0 for n in nodes}
    hooks = [n.register_prehook(lambda g, n=n: runs.__setitem__(n, runs[n] + 1)) for n in nodes]
    _, state = backward_input([y], [torch.randn_like(y)], [x])
    in_b = dict(runs)
    backward_weight(state, list(model.parameters()))
    for h in hooks:
        h.remove()
    twice = [n for n in nodes if runs[n] == 2]
    assert all(c <= 2 for c in runs.values())
    assert all(in_b[n] == 1 for n in twice)  # once in B, once in W
    for n in twice:  # a restart node: on the input path, with a child off it
        assert any(
            c is not None and (c.name().endswith("AccumulateGrad") or c.name() == "TBackward0")
            for c, _ in n.next_functions
        )
    assert sum(runs.values()) == len(nodes) - 1 + len(twice)  # x's AccumulateGrad runs in neither
