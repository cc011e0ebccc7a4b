"""How expert parallelism divides a model's MoE layers, in one place (torch-free): lint checks a
plan's `ep` against it, the cost model sizes one rank's experts, rows and all-to-all bytes with
it, and the executor's ep MoE layer (`octodsl.layers.expert_parallel`) sends what
`dispatch_bytes` counts.

An ep group is `ep` ranks carved out of the data-parallel copies (Megatron-core's expert
parallelism; `octodsl.mesh` says where its ranks sit): ep divides dp and every MoE layer's
expert count, and each rank holds E / ep of the E experts of every MoE layer. Each rank routes
the T tokens of its own micro-batch (T x top_k rows; with tp, the tp group's whole set of tokens,
as the executor's layer does) and sends each row to the rank owning its expert:

- dispatch, then combine, each an all-to-all of T x top_k x hidden x dtype bytes per rank, of
  which (ep - 1) / ep leave the rank (`dispatch_bytes`), in F and again in B (the backward of
  an all-to-all is the reverse all-to-all); W has none;
- a rank's E / ep local experts receive rows from all ep ranks: ep x T x top_k / E rows each on
  average, T x top_k rows in all (as many as at ep 1, in fewer, larger GEMMs: `expert_rows`);
- routers balance imperfectly, and every rank waits at the combine for the busiest one, which
  receives `imbalance` (MoEConfig.imbalance, max over mean per rank) times the mean: its rows and
  its all-to-all bytes are what the cost model times (`busiest_share`);
- the routed experts' weights, gradients and optimizer state divide by ep
  (`local_routed_params`); their gradients are summed over the dp / ep copies that hold the same
  experts (the expert-data-parallel group), not over all dp.
"""

from __future__ import annotations

import math

from .spec import LayerConfig, ModelSpec, MoEConfig


def moe_layers(spec: ModelSpec) -> list[MoEConfig]:
    """The spec's MoE layers, in order."""
    return [layer for layer in spec.layers if isinstance(layer, MoEConfig)]


def ep_problem(spec: ModelSpec | None, ep: int, dp: int) -> tuple[str, str] | None:
    """Why `ep` cannot be used with `dp` copies of `spec` (None: it can, or ep is 1), as (which
    header field the problem is about, 'dp' or 'ep', the message): lint's E705 and E706."""
    if ep > 1 and dp % ep:
        return "dp", f"ep {ep} does not divide dp {dp}: the ep group is carved out of the dp copies"
    why = experts_problem(spec, ep) if spec is not None else None
    return None if why is None else ("ep", why)


def experts_problem(spec: ModelSpec, ep: int) -> str | None:
    """Why `ep` cannot spread `spec`'s experts (None: it can): the first expert count of its MoE
    layers that ep does not divide. What the cost model refuses (lint's E706)."""
    return split_experts_problem(moe_layers(spec), ep, f"{spec.name}'s")


def split_experts_problem(moes: list[MoEConfig], ep: int, whose: str) -> str | None:
    """`experts_problem` for the MoE layers `moes` of `whose` model."""
    bad = sorted({layer.experts for layer in moes if layer.experts % ep})
    if not bad:
        return None
    return (
        f"ep {ep} does not divide the {bad[0]} experts of {whose} MoE layers: each rank "
        "holds experts / ep of them"
    )


def eps_that_fit(spec: ModelSpec | None, dp: int) -> list[int]:
    """The ep that divide dp and every MoE layer's expert count (1 always does), ascending;
    1 alone for a spec without MoE layers (a larger ep has no experts to spread: W704), every
    divisor of dp when the spec is unknown (None)."""
    if spec is None:
        return _divisors(dp)
    experts = {layer.experts for layer in moe_layers(spec)}
    if not experts:
        return [1]
    return [e for e in _divisors(dp) if all(n % e == 0 for n in experts)]


def _divisors(n: int) -> list[int]:
    """The divisors of n, ascending (sqrt(n) steps: n is at most MAX_DP)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def busiest_share(imbalance: float, ep: int) -> float:
    """The busiest rank's rows over the mean: `imbalance`, at most ep (all rows on one rank),
    and 1 at ep 1 (one rank takes every row whatever the router does)."""
    return 1.0 if ep == 1 else min(float(imbalance), float(ep))


def expert_rows(tokens: int, top_k: int, experts: int, ep: int, imbalance: float = 1.0) -> int:
    """Rows each local expert of the busiest rank multiplies (the m of its grouped GEMMs): the
    ep ranks' tokens x top_k rows spread over the E experts, ep x T x top_k / E per expert, times
    the busiest rank's share (`busiest_share`), rounded up. At ep 1: ceil(T x top_k / E)."""
    share = busiest_share(imbalance, ep)
    if share == 1.0:
        return -(-(ep * tokens * top_k) // experts)
    return math.ceil(share * ep * tokens * top_k / experts)


def dispatch_bytes(tokens: int, top_k: int, hidden: int, dtype_bytes: int, ep: int) -> float:
    """Bytes one rank sends in one all-to-all of a layer's pass (the dispatch; the combine, and
    each of the two in the backward, move as many) when its `tokens` x `top_k` rows of `hidden`
    values spread evenly over the experts: all but the 1 / ep staying on the rank."""
    return tokens * top_k * hidden * dtype_bytes * (ep - 1) / ep


def local_routed_params(layer: LayerConfig, hidden: int, ep: int) -> int:
    """Of `layer`'s parameters (as one GPU of its tp group holds them), the routed experts' this
    rank of an ep group holds: 1 / ep of them (0 for a layer without experts)."""
    if not isinstance(layer, MoEConfig):
        return 0
    return layer.routed_params(hidden) // ep
