"""Split a backward pass into B (input gradients, now) and W (weight gradients, later).

B asks autograd for the input gradients only, so autograd skips every weight-side output of
the nodes on the path from the outputs to the inputs. The nodes on that path with a child off
it ("restart" nodes: a matmul whose weight is a parameter, a norm with an affine weight) are
where the weight gradients branch off; a pre-hook on each captures the gradient flowing into
it. W restarts autograd at exactly those nodes with the captured gradients, toward the
parameters only, so no input-side work runs twice. W uses `torch.autograd.backward(...,
inputs=params)`, which accumulates into `.grad` through the parameters' AccumulateGrad nodes,
so post-accumulate-grad hooks (DeepSpeed's optimizers) fire as in a fused backward.

W runs one autograd call per *level*: restart nodes with no other restart node above them on
the input path, then those with one, and so on. Nodes of one level cannot reach each other
through the input path, so one call per level does no work twice (a node below another in
the same call would receive its input-side gradient again).

Restart nodes whose weight-side subgraphs share a node (a parameter used in several places,
tied weights) form a group. Restarting a group of several nodes in one call would recompute
the input path between them, so B instead computes the gradients of such a group's
weight-side edges (the cheap branch ops: a transpose, a scale, a cast) and W's last call
continues below them, apart from the restart nodes, which could reach them too.

The graph analysis is a pass over the autograd graph, linear in its size; its result is kept
per graph shape, so a layer seen again (the next micro-batch) only pays for the walk.
Pure torch: the profiler times B and W through this module without DeepSpeed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

_CACHE_SIZE = 1024


class CannotSplit(RuntimeError):
    """Autograd refused to compute the input gradients alone (reentrant activation
    checkpointing does); nothing was accumulated, the graph is intact: run a fused backward."""


@dataclass(slots=True)
class _Call:
    """One W autograd call: restart at `roots` with `grads`, accumulate into `leaves`."""

    roots: list[GradientEdge] = field(default_factory=list)
    grads: list[Tensor] = field(default_factory=list)
    leaves: list[Node] = field(default_factory=list)
    """AccumulateGrad nodes reached (their `.variable` is the tensor)."""


@dataclass(slots=True)
class WeightGradState:
    """What W needs after B: its autograd calls, in order. Holding it keeps the graph alive."""

    calls: list[_Call]

    @staticmethod
    def merge(states: Sequence[WeightGradState]) -> WeightGradState:
        """One state for the graphs of several layers run on detached inputs: their k-th calls
        cannot reach each other, so they run as one call. Graphs that share a parameter (a
        layer reused in the stage) stay in separate calls: one graph's call would otherwise
        reach the shared parameter through the other graph's restart nodes of another level."""
        batches: list[tuple[set[Node], list[WeightGradState]]] = []
        for s in states:
            leaves = {n for c in s.calls for n in c.leaves}
            batch = next((b for b in batches if not b[0] & leaves), None)
            if batch is None:
                batches.append((leaves, [s]))
            else:
                batch[0].update(leaves)
                batch[1].append(s)
        calls: list[_Call] = []
        for _, members in batches:
            merged = [_Call() for _ in range(max(len(s.calls) for s in members))]
            for s in members:
                for call, c in zip(
                    merged, s.calls, strict=False
                ):  # as many as the member with most
                    call.roots += c.roots
                    call.grads += c.grads
                    call.leaves += c.leaves
            calls += merged
        return WeightGradState(calls)


@dataclass(frozen=True, slots=True)
class _Plan:
    """The analysis of one graph shape, as positions in the walk's order."""

    on_path: tuple[bool, ...]
    """Per output: does it depend on the inputs."""
    hooked: tuple[tuple[int, int], ...]
    """(position, level) of each restart node that W restarts at."""
    edges: tuple[tuple[int, int], ...]
    """(position of a shared restart node, index in its next_functions) of each weight-side
    edge whose gradient B computes."""
    last: int
    """The level of the call that continues from the edges and the off-path outputs."""
    leaves: tuple[tuple[int, int], ...]
    """(level, position) of the AccumulateGrad nodes each level's call accumulates into."""


_plans: dict[tuple, _Plan] = {}


def _node(t: Tensor) -> Node:
    return get_gradient_edge(t).node


def _walk(
    out_nodes: list[Node], stop: set[Node]
) -> tuple[list[Node], list[tuple[tuple[int, int], ...]]]:
    """Every node below `out_nodes` (not below `stop`) in post-order (children first), and
    each one's next_functions as (position of the child, or -1 for none; input_nr)."""
    nexts: dict[Node, tuple] = {}
    order: list[Node] = []
    stack: list = list(reversed(out_nodes))
    while stack:
        n = stack.pop()
        if n is None:  # the marker below: the node under it is finished
            order.append(stack.pop())
            continue
        if n in nexts:
            continue
        nf = () if n in stop else n.next_functions
        nexts[n] = nf
        stack.append(n)
        stack.append(None)
        for c, _ in reversed(nf):
            if c is not None and c not in nexts:
                stack.append(c)
    index: dict[Node | None, int] = {n: i for i, n in enumerate(order)}
    index[None] = -1
    return order, [tuple([(index[c], nr) for c, nr in nexts[n]]) for n in order]


def _analyse(
    children: list[tuple[tuple[int, int], ...]], ins: set[int], outs: list[int], leaf: list[bool]
) -> _Plan:
    """Where B hooks and what W runs, for a graph of this shape (`leaf`: AccumulateGrad)."""
    n = len(children)
    kids = [[c for c, _ in ks if c >= 0] for ks in children]
    on_path = [i in ins for i in range(n)]
    for i in range(n):  # children come first
        if not on_path[i] and any(on_path[c] for c in kids[i]):
            on_path[i] = True
    restart = [
        i for i in range(n) if on_path[i] and i not in ins and not all(on_path[c] for c in kids[i])
    ]
    is_restart = set(restart)
    off_outputs = [i for i in dict.fromkeys(outs) if not on_path[i]]

    # Groups: restart nodes and off-path outputs joined by the weight-side nodes they share.
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i in range(n):
        if not on_path[i] or i in is_restart:
            for c in kids[i]:
                if not on_path[c]:
                    parent[find(i)] = find(c)
    size: dict[int, int] = {}
    for i in restart + off_outputs:
        size[find(i)] = size.get(find(i), 0) + 1
    shared = {i for i in restart if size[find(i)] > 1}

    level = [0] * n
    for i in reversed(range(n)):  # parents come first
        if on_path[i]:
            below = level[i] + (i in is_restart and i not in shared)
            for c in kids[i]:
                if on_path[c] and level[c] < below:
                    level[c] = below
    hooked = tuple((i, level[i]) for i in restart if i not in shared)
    # one per (child, input_nr): two restart nodes may feed the same weight-side edge
    edges = tuple(
        {
            children[i][k]: (i, k)
            for i in sorted(shared)
            for k, (c, _) in enumerate(children[i])
            if c >= 0 and not on_path[c]
        }.values()
    )
    # The edges and the off-path outputs get a call of their own: a restart node above a shared
    # one would reach the shared parameters through the input path if they were in its call.
    last = 1 + max((lvl for _, lvl in hooked), default=-1)
    group_level = {find(i): lvl for i, lvl in hooked}
    group_level.update({find(i): last for i in shared | set(off_outputs)})
    leaves = tuple(
        (group_level[find(i)], i)
        for i in range(n)
        if leaf[i] and not on_path[i] and find(i) in group_level
    )
    return _Plan(tuple(on_path[i] for i in outs), hooked, edges, last, leaves)


def _differentiated(
    outputs: Sequence[Tensor], output_grads: Sequence[Tensor | None]
) -> tuple[list[Tensor], list[Tensor]]:
    """The outputs backward starts from and their gradients: those that require grad and have
    a gradient, a scalar's None meaning 1."""
    outs: list[Tensor] = []
    grads: list[Tensor] = []
    for t, g in zip(outputs, output_grads, strict=True):
        if not t.requires_grad:
            continue
        if g is None:
            if t.numel() != 1:
                continue
            g = torch.ones_like(t)
        outs.append(t)
        grads.append(g)
    return outs, grads


def _plan_for(
    order: list[Node],
    children: list[tuple[tuple[int, int], ...]],
    ins: list[int],
    out_pos: list[int],
) -> _Plan:
    """The _Plan of a graph of this shape, analysed once per shape."""
    key = (tuple(map(type, order)), tuple(children), tuple(ins), tuple(out_pos))
    plan = _plans.get(key)
    if plan is None:
        plan = _analyse(children, set(ins), out_pos, [hasattr(x, "variable") for x in order])
        if len(_plans) >= _CACHE_SIZE:
            _plans.clear()
        _plans[key] = plan
    return plan


def _weight_calls(
    plan: _Plan,
    order: list[Node],
    captured: dict[int, tuple],
    edges: list,
    edge_grads: Sequence[Tensor | None],
    outs: list[Tensor],
    grads: list[Tensor],
) -> WeightGradState:
    """What W runs: per level, the gradients B captured at the hooked nodes, then (last) the
    shared weight-side edges and the outputs off the input path."""
    calls: dict[int, _Call] = {}
    for i, lvl in plan.hooked:
        call = calls.setdefault(lvl, _Call())
        for j, g in enumerate(captured.get(i, ())):
            if g is not None:
                call.roots.append(GradientEdge(order[i], j))
                call.grads.append(g)
    last = calls.setdefault(plan.last, _Call())
    for (c, nr), g in zip(edges, edge_grads, strict=True):
        if g is not None:
            last.roots.append(GradientEdge(c, nr))
            last.grads.append(g)
    for t, g, p in zip(outs, grads, plan.on_path, strict=True):
        if not p:  # an output that does not depend on the inputs: W does all of it
            last.roots.append(get_gradient_edge(t))
            last.grads.append(g)
    for lvl, i in plan.leaves:
        calls.setdefault(lvl, _Call()).leaves.append(order[i])
    return WeightGradState([calls[k] for k in sorted(calls) if calls[k].roots and calls[k].leaves])


def backward_input(
    outputs: Sequence[Tensor],
    output_grads: Sequence[Tensor | None],
    inputs: Sequence[Tensor],
) -> tuple[list[Tensor | None], WeightGradState]:
    """B: the gradients of `inputs` (None where an input gets none or needs none), and the
    state `backward_weight` needs. An output whose gradient is None is skipped, except a
    scalar (a loss), whose None means 1 as in `Tensor.backward()`. Raises CannotSplit."""
    outs, grads = _differentiated(outputs, output_grads)
    wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
    in_nodes = [_node(inputs[i]) for i in wanted]
    out_nodes = [_node(t) for t in outs]
    order, children = _walk(out_nodes, set(in_nodes))
    index = {node: i for i, node in enumerate(order)}
    ins, out_pos = [index.get(x, -1) for x in in_nodes], [index[x] for x in out_nodes]
    plan = _plan_for(order, children, ins, out_pos)

    captured: dict[int, tuple] = {}
    handles = [
        order[i].register_prehook(lambda g, i=i: captured.__setitem__(i, g)) for i, _ in plan.hooked
    ]
    edges: list[tuple[Node, int]] = []
    for i, k in plan.edges:
        c, nr = order[i].next_functions[k]
        assert c is not None, "_analyse keeps only the edges to a node"
        edges.append((c, nr))
    in_grads: list[Tensor | None] = [None] * len(inputs)
    edge_grads: Sequence[Tensor | None] = [None] * len(edges)
    try:
        path = [(t, g) for t, g, p in zip(outs, grads, plan.on_path, strict=True) if p]
        if path and wanted:
            targets = [inputs[i] for i in wanted] + [GradientEdge(c, nr) for c, nr in edges]
            # torch types `inputs` as tensors or edges, though autograd takes a mix of the two
            got = torch.autograd.grad(
                [t for t, _ in path],
                targets,  # type: ignore[arg-type]
                [g for _, g in path],
                retain_graph=True,
                allow_unused=True,
            )
            for i, g in zip(wanted, got[: len(wanted)], strict=True):  # then the edges'
                in_grads[i] = g
            edge_grads = got[len(wanted) :]
    except RuntimeError as e:
        raise CannotSplit(str(e)) from e
    finally:
        for h in handles:
            h.remove()
    return in_grads, _weight_calls(plan, order, captured, edges, edge_grads, outs, grads)


def backward_weight(state: WeightGradState, params: Sequence[nn.Parameter]) -> None:
    """W: accumulate the weight gradients into `.grad` of those `params` the outputs depend
    on (post-accumulate-grad hooks fire). Releases the state's graph."""
    wanted = {id(p) for p in params}
    for call in state.calls:
        # AccumulateGrad nodes have `.variable`, which torch's Node does not declare
        nodes = dict.fromkeys(call.leaves)
        leaves = [n.variable for n in nodes if id(n.variable) in wanted]  # type: ignore[attr-defined]
        if leaves:
            torch.autograd.backward(call.roots, call.grads, retain_graph=True, inputs=leaves)
    state.calls = []
