"""The configurations `tune --gpus` chooses among: every way to run a global batch on a GPU count
as tp x pp x dp, micro-batch size x micro-batches, a ZeRO stage and an expert-parallel degree,
each with its tuning problem, and the proof that each one left out cannot work.

The space (docs/cluster.md):
- tp divides the GPUs per node (a tp group inside one node, as Megatron places it) and splits
  every size of the model (`octodsl.models.tp`); sequence parallelism on when tp > 1;
- pp from 1 to the model's layer count, tp x pp x dp = the GPU count;
- dp divides the global batch, and the micro-batch size divides each copy's share of it;
- ZeRO 0, 1 and 2 (0 alone when dp is 1), those the target runs (octodsl.tune.target);
- ep, for a model with MoE layers, each that divides dp and every MoE layer's expert count
  (`octodsl.models.ep.eps_that_fit`); 1 alone for a model without.
A configuration of the space is infeasible when no plan of it fits in memory
(`Problem.why_no_plan_fits`, a lower bound on any plan's bytes) or its plans exceed octodsl's
limits (micro-batches, ops)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

from pydantic import ValidationError

from ... import limits
from ...costs.devices import get_device, get_link
from ...costs.resolve import cost_table
from ...costs.table import CostTable, Link
from ...errors import OctoError
from ...mesh import Mesh
from ...models import load_model
from ...models.ep import eps_that_fit, experts_problem, moe_layers
from ...models.tp import tp_problems
from ...plan import DEEPSPEED, Header
from ..problem import AUTO, Problem, RecomputeChoice, unsplit_sequence
from .target import admits


@dataclass(frozen=True, order=True)
class Config:
    """One way to run the global batch: the mesh, the micro-batching and the ZeRO stage."""

    tp: int
    pp: int
    """Pipeline devices (each a tp group of GPUs)."""
    dp: int
    microbatch_size: int
    """Sequences per micro-batch."""
    microbatches: int
    """Micro-batches per pipeline and iteration: global batch / (dp x micro-batch size)."""
    zero: int
    ep: int = 1
    """Expert-parallel degree of the MoE layers (`Header.ep`): their experts spread over ep of
    the dp copies."""

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def short(self) -> str:
        """'tp8 pp4 dp2 64x1 z1': tp, pp, dp, micro-batches x size, ZeRO; 'tp1 pp4 dp16 ep8
        64x1 z1' with expert parallelism."""
        return (
            f"tp{self.tp} pp{self.pp} dp{self.dp}{self._ep(' ep')} "
            f"{self.microbatches}x{self.microbatch_size} z{self.zero}"
        )

    def __str__(self) -> str:
        return (
            f"tp {self.tp} x pp {self.pp} x dp {self.dp}{self._ep(', ep ')}, {self.microbatches} x "
            f"{self.microbatch_size} sequences, zero {self.zero}"
        )

    def _ep(self, label: str) -> str:
        """`label` and ep when the experts are spread (ep 1 is every dense configuration's)."""
        return f"{label}{self.ep}" if self.ep > 1 else ""


@dataclass(frozen=True)
class Cluster:
    """What `tune --gpus` is asked: a model, a GPU count, a global batch, the hardware; and
    optionally some choices fixed."""

    model: str
    """Built-in name or spec path."""
    gpus: int
    global_batch: int
    """Sequences per iteration, over all data-parallel copies."""
    seq_len: int | None = None
    """Tokens per sequence (None: the model's)."""
    device: str = "H800"
    """A built-in device's name or a device file's path."""
    gpus_per_node: int = 8
    memory: int | None = None
    """Bytes per GPU (None: no limit)."""
    link: Link | None = None
    """Inside a node: tp collectives, pipeline messages, dp collectives (None: the device's)."""
    inter_link: Link | None = None
    """Between nodes (None: the device's inter-node link)."""
    recompute: RecomputeChoice = AUTO
    tp: int | None = None
    """Fixed tp (None: searched); likewise pp, microbatch_size, zero and ep."""
    pp: int | None = None
    microbatch_size: int | None = None
    zero: int | None = None
    ep: int | None = None
    sequence_parallel: bool | None = None
    """None: on at tp > 1."""
    target: str = DEEPSPEED
    """The runtime the configurations are for (octodsl.tune.target)."""
    runtime_fields: tuple[tuple[str, bool], ...] = ()
    """The header's runtime fields every configuration's plans take (`tune --gpus --overlap`
    and the like: those given), but `overlap_param_gather` at zero 0, where nothing is
    gathered (lint's E405)."""

    def __post_init__(self) -> None:
        for what, value, limit in (
            ("GPUs", self.gpus, limits.MAX_GPUS),
            ("sequences of global batch", self.global_batch, limits.MAX_GLOBAL_BATCH),
        ):
            if not 1 <= value <= limit:
                raise OctoError(
                    f"{value:,} {what}: the search takes at least 1 and "
                    + limits.at_most(limit, "")
                )
        if self.ep is not None and not 1 <= self.ep <= limits.MAX_DP:
            raise OctoError(
                f"ep {self.ep:,}: the search takes at least 1 and "
                + limits.at_most(limits.MAX_DP, "")
            )

    @property
    def node_link(self) -> Link:
        return self.link or get_link(get_device(self.device).node_link)

    @property
    def between_nodes(self) -> Link:
        return self.inter_link or get_link(get_device(self.device).inter_node_link)

    def tokens(self) -> int:
        """Tokens per iteration."""
        return self.global_batch * (self.seq_len or load_model(self.model).seq_len)


@dataclass(frozen=True)
class Skipped:
    """A configuration of the space that `tune --gpus` did not tune, and why it cannot win."""

    config: Config
    why: str
    """INFEASIBLE, DOMINATED or NOT_SCREENED."""
    detail: str
    memory: bool = False
    """INFEASIBLE for memory (not for octodsl's limits): a larger micro-batch does not fit either."""


INFEASIBLE, DOMINATED, NOT_SCREENED = "infeasible", "dominated", "not screened"
"""Why a configuration was left out: no plan of it fits (or its plans exceed octodsl's limits); its
lower bound is no better than a plan already simulated; the budget ran out before it."""


def tp_degrees(cluster: Cluster) -> tuple[list[int], dict[int, str]]:
    """The tps of the space, and for each other divisor of the node the reason the model does
    not split over it."""
    spec = load_model(cluster.model)
    out, why = [], {}
    for tp in range(1, cluster.gpus_per_node + 1):
        if cluster.gpus_per_node % tp or cluster.gpus % tp:
            continue
        fatal = [p.message for p in tp_problems(spec, tp) if p.fatal]
        fatal += [
            m
            for m in [
                unsplit_sequence(
                    cluster.seq_len or spec.seq_len, tp, cluster.sequence_parallel is not False
                )
            ]
            if m
        ]
        if fatal:
            why[tp] = fatal[0]
        elif cluster.tp in (None, tp):
            out.append(tp)
    return out, why


def meshes(cluster: Cluster, tps: list[int]) -> Iterator[tuple[int, int, int]]:
    """(tp, pp, dp) with tp x pp x dp = the GPU count, pp at most the layer count, pp and dp as
    fixed."""
    layers = len(load_model(cluster.model).layers)
    for tp in tps:
        for pp in range(1, min(layers, cluster.gpus // tp) + 1):
            if (cluster.gpus // tp) % pp == 0 and cluster.pp in (None, pp):
                yield tp, pp, cluster.gpus // (tp * pp)


def configurations(cluster: Cluster, tps: list[int]) -> Iterator[Config]:
    """Every configuration of the space, by mesh, then micro-batch size (smallest first), then
    ZeRO stage, then ep (smallest first)."""
    spec = load_model(cluster.model)
    for tp, pp, dp in meshes(cluster, tps):
        if cluster.global_batch % dp:
            continue
        share = cluster.global_batch // dp
        eps = [e for e in eps_that_fit(spec, dp) if cluster.ep in (None, e)]
        for mbs in divisors(share):
            if mbs > limits.MAX_MICROBATCH_SIZE or cluster.microbatch_size not in (None, mbs):
                continue
            for zero in ZEROS if dp > 1 else (0,):
                if cluster.zero in (None, zero) and admits(cluster.target, zero):
                    for ep in eps:
                        yield Config(tp, pp, dp, mbs, share // mbs, zero, ep)


class Tables:
    """Cost tables per (tp, micro-batch size, ep, ep ranks per node): every configuration with
    the same four has the same per-layer costs."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._tables: dict[tuple[int, int, int, int], CostTable] = {}

    def __call__(
        self, tp: int, microbatch_size: int, ep: int = 1, ep_node_ranks: int = 1
    ) -> CostTable:
        """`ep_node_ranks`: of an ep group's GPUs, those that share a node
        (`Mesh.ep_ranks_per_node`)."""
        key = (tp, microbatch_size, ep, min(ep_node_ranks, ep))
        if key not in self._tables:
            c = self.cluster
            # pipelined once here, not in each of the many problems that share the table
            self._tables[key] = cost_table(
                model=c.model,
                device=c.device,
                microbatch_size=microbatch_size,
                seq_len=c.seq_len,
                tp=tp,
                sp=c.sequence_parallel,
                tp_link=c.node_link,
                ep=ep,
                ep_node_ranks=key[3],
                inter_link=c.between_nodes,
            ).pipelined()
        return self._tables[key]


def problem_of(cluster: Cluster, config: Config, tables: Tables) -> Problem:
    """The tuning problem of one configuration. OctoError for a header out of range."""
    c = cluster
    try:
        header = Header(
            name=f"{c.model}-tp{config.tp}-pp{config.pp}-dp{config.dp}-"
            f"mb{config.microbatch_size}x{config.microbatches}-z{config.zero}"
            + (f"-ep{config.ep}" if config.ep > 1 else ""),
            devices=config.pp,
            microbatches=config.microbatches,
            model=c.model,
            microbatch_size=config.microbatch_size,
            seq_len=c.seq_len,
            memory=c.memory,
            dp=config.dp,
            zero=config.zero,
            tp=config.tp,
            sequence_parallel=c.sequence_parallel,
            gpus_per_node=c.gpus_per_node,
            ep=config.ep,
            runtime=c.target,
        ).model_copy(
            update={
                name: value and not (name == "overlap_param_gather" and config.zero == 0)
                for name, value in c.runtime_fields
            }
        )
    except ValidationError as e:
        raise OctoError(f"{config}: {e.errors()[0]['msg']}") from None
    return Problem(
        tables(config.tp, config.microbatch_size, config.ep, Mesh.of(header).ep_ranks_per_node),
        header,
        c.node_link,
        c.recompute,
        inter_link=c.between_nodes,
    )


ZEROS = (0, 1, 2)
FIXED = {
    "tp": "--tp",
    "pp": "--devices",
    "microbatch_size": "--microbatch-size",
    "zero": "--zero",
    "ep": "--ep",
}
"""The choices a command line may fix, and their options."""


def ep_refusal(cluster: Cluster) -> str | None:
    """Why the fixed ep cannot spread the model's experts at any dp (None: it can, or ep is
    searched or 1): the model has no MoE layers, or ep does not divide their expert count."""
    if cluster.ep in (None, 1):
        return None
    spec = load_model(cluster.model)
    if not moe_layers(spec):
        return f"--ep {cluster.ep}: {spec.name} has no MoE layers, so no experts to spread; give --ep 1"
    why = experts_problem(spec, cluster.ep)
    return None if why is None else f"--ep {cluster.ep}: {why}"


def fixed_cause(cluster: Cluster) -> str | None:
    """When no configuration of the space exists: the fewest fixed choices that rule out every
    one (with them free some would exist), named as the options given; else None."""
    if next(configurations(cluster, tp_degrees(cluster)[0]), None) is not None:
        return None
    fixed = [n for n in FIXED if getattr(cluster, n) is not None]
    for k in range(1, len(fixed) + 1):
        for names in itertools.combinations(fixed, k):
            free = replace(cluster, **dict.fromkeys(names))  # type: ignore[arg-type]
            if next(configurations(free, tp_degrees(free)[0]), None) is not None:
                return " with ".join(f"{FIXED[n]} {getattr(cluster, n)}" for n in names)
    return None


def over_limits(pp: int, microbatches: int) -> str | None:
    """Why no plan of `pp` pipeline devices and `microbatches` stays within octodsl's limits, or
    None: more micro-batches than a plan may have, or more than MAX_OPS in the fewest ops such a
    plan has (`check_size`'s count; on one device F and a fused BW per micro-batch). Checked
    before the configuration's problem is built (its header would refuse it)."""
    if microbatches > limits.MAX_MICROBATCHES:
        return (
            f"{microbatches:,} micro-batches per pipeline, over octodsl's limit of "
            f"{limits.MAX_MICROBATCHES:,}"
        )
    ops = plan_ops(pp, microbatches)
    if ops > limits.MAX_OPS:
        return f"at least {ops:,} ops per plan, over octodsl's limit of {limits.MAX_OPS:,}"
    return None


def plan_ops(pp: int, microbatches: int) -> int:
    """The fewest ops a plan of `pp` devices and `microbatches` has: F and B and W per device
    and micro-batch, a fused BW on one device."""
    return (2 if pp == 1 else 3) * pp * microbatches


def infeasible(problem: Problem) -> str | None:
    """Why no plan of the problem can run, or None: over octodsl's limits, or no partition fits
    in memory (the cause alone, as the search gives it: the search tries the other levers)."""
    return over_limits(problem.devices, problem.microbatches) or problem.why_no_plan_fits(
        advice=False
    )


def fewest_gpus(cluster: Cluster, tables: Tables, above: int) -> Config | None:
    """The configuration with the fewest GPUs above `above` (up to MAX_GPUS) of which some plan
    may fit, or None: each mesh at the micro-batch size and ZeRO stage that need the least
    memory (the fewest sequences within octodsl's limits, or the fixed size; the highest stage, or
    the fixed one), since a larger micro-batch only adds activations and a lower stage only
    static bytes, with each ep (or the fixed one): a wider ep holds fewer experts but, routed
    imperfectly, more rows on the busiest rank (`octodsl.models.ep.busiest_share`)."""
    # every tp of the node, not only those dividing the cluster's own GPU count (on 6 GPUs tp 4
    # is out, on 8 it is in)
    tps, _ = tp_degrees(replace(cluster, gpus=cluster.gpus_per_node))
    spec = load_model(cluster.model)
    layers = len(spec.layers)
    meshes = sorted(
        (tp * pp * dp, tp, pp, dp)
        for tp in tps
        for pp in range(1, layers + 1)
        for dp in divisors(cluster.global_batch)
        if above < tp * pp * dp <= limits.MAX_GPUS and cluster.pp in (None, pp)
    )
    for _, tp, pp, dp in meshes:
        share = cluster.global_batch // dp
        # the fewest sequences per micro-batch that keep the plans within octodsl's limits
        mbs = cluster.microbatch_size or next(
            (m for m in divisors(share) if over_limits(pp, share // m) is None), share
        )
        zero = (
            (max(z for z in ZEROS if admits(cluster.target, z)) if dp > 1 else 0)
            if cluster.zero is None
            else cluster.zero
        )
        if share % mbs or (zero > 0 and dp == 1) or over_limits(pp, share // mbs):
            continue
        for ep in eps_that_fit(spec, dp):
            config = Config(tp, pp, dp, mbs, share // mbs, zero, ep)
            if (
                cluster.ep in (None, ep)
                and problem_of(cluster, config, tables).why_no_plan_fits() is None
            ):
                return config
    return None


def divisors(n: int) -> list[int]:
    """The divisors of n, smallest first."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))
