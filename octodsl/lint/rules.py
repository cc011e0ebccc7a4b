"""Lint rules: small registered classes, each checking one thing about a Plan.

A rule's `check(ctx)` yields Diagnostics of the codes it declares in `codes`. Rules marked
`needs_valid_structure` run only when no structural error was found (a deadlock search over a
plan with missing ops says nothing useful).
A rule names the sections it speaks about in `needs`; it does not run when one of them is
missing or stated nothing (no stages, no placement, no schedule block), as what it would report
only restates that error (docs/diagnostics.md, "One cause, one diagnostic").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

from ..costs.devices import get_device, get_link
from ..costs.param_bytes import accum_problem
from ..dag import deadlock, describe_cycle
from ..lang.codes import CODES
from ..lang.errors import Diagnostic, ranges_text
from ..limits import MAX_SEQ_LEN
from ..mesh import Mesh
from ..models import ModelSpec
from ..models.ep import ep_problem, eps_that_fit, moe_layers
from ..models.tp import tp_problems
from ..plan import (
    Op,
    OpKind,
    Plan,
    Span,
    plan_runtime,
    runtime_conflict,
    zero_without_copies,
)
from .memory import DEFAULT_DEVICE


@dataclass
class Context:
    plan: Plan
    num_layers: int | None = None
    """Layers of the plan's model, when it names one the linter could load."""
    pattern: str | None = None
    """The model's layer-pattern symbols, when known."""
    spec: ModelSpec | None = None
    """The plan's model, when it names one the linter could load."""
    extra: dict = field(default_factory=dict)

    @cached_property
    def sections(self) -> frozenset[str]:
        """The sections that state something: a partition of one stage or more, a placement
        (not an unknown or impossible shorthand: lowering leaves those out), a schedule (a
        plan from a generator, the tuner or a CSV has no spans and a schedule all the same)."""
        plan = self.plan
        present = {
            "partition": plan.num_stages > 0,
            "placement": plan.placement_span is not None or bool(plan.placement),
            "schedule": plan.schedule_span is not None or any(plan.schedule),
        }
        return frozenset(name for name, ok in present.items() if ok)

    @cached_property
    def stage_device(self) -> dict[int, int]:
        """Device of each stage placed exactly once on an existing device."""
        count: dict[int, list[int]] = defaultdict(list)
        for e in self.plan.placement:
            for s in e.stages:
                count[s].append(e.device)
        return {
            s: ds[0] for s, ds in count.items() if len(ds) == 1 and 0 <= ds[0] < self.plan.devices
        }


class Rule:
    codes: tuple[str, ...] = ()
    """The codes (octodsl.lang.codes.CODES) its check may report, and no other."""
    needs_valid_structure = False
    needs: tuple[str, ...] = ()
    """Sections ('partition', 'placement', 'schedule') without which the rule has nothing to say
    that their absence's error (E121, E130, E131, E205) did not."""

    def check(self, ctx: Context) -> Iterable[Diagnostic]:
        raise NotImplementedError


RULES: list[type[Rule]] = []


def rule(cls: type[Rule]) -> type[Rule]:
    """Register a rule; one that declares no code, or a code the registry lacks, is refused as
    the module loads (a programming error, which every test that lints meets first)."""
    unknown = [c for c in cls.codes if c not in CODES]
    if not cls.codes or unknown:
        what = f"unknown codes {', '.join(unknown)}" if unknown else "no code"
        raise TypeError(f"lint rule {cls.__name__} declares {what}")
    RULES.append(cls)
    return cls


def _span_text(r: range) -> str:
    """range(4, 7) -> '4..6', without listing it (layer indices can be large)."""
    return str(r[0]) if len(r) == 1 else f"{r[0]}..{r[-1]}"


def _layers(r: range) -> str:
    """'layer 4 is' / 'layers 4..6 are'."""
    return f"layer {r[0]} is" if len(r) == 1 else f"layers {_span_text(r)} are"


# -- partition ---------------------------------------------------------------------------------


@rule
class PartitionCoverage(Rule):
    """Every layer in exactly one stage, in order, no empty stage."""

    codes = ("E201", "E202", "E204")

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        stages = ctx.plan.stages
        if (
            stages
            and stages[0].abstract
            and ctx.num_layers is not None
            and len(stages) > ctx.num_layers
        ):
            yield Diagnostic(
                "E202",
                f"{len(stages)} stages for a model of {ctx.num_layers} layers: "
                f"{len(stages) - ctx.num_layers} of them would be empty",
                ctx.plan.partition_span,
                hint=f"at most {ctx.num_layers} stages, one layer or more each",
            )
        if not stages or stages[0].abstract:
            return
        expected = 0
        for i, st in enumerate(stages):
            first, last = st.bounds  # the grammar makes every stage abstract or none
            if last < first:
                if st.symbols is None:  # an empty pattern piece is reported by the parser
                    yield Diagnostic(
                        "E202", f"stage {i} is empty: layers {first}..{last} run backwards", st.span
                    )
                continue
            if first > expected:
                yield Diagnostic(
                    "E201",
                    f"{_layers(range(expected, first))} in no stage",
                    st.span,
                    hint=f"stage {i} should start at layer {expected}",
                )
            elif first < expected:
                yield Diagnostic(
                    "E201",
                    f"stage {i} starts at layer {first}, but layers "
                    f"{_span_text(range(first, expected))} already belong to an earlier stage",
                    st.span,
                    hint=f"stage {i} should start at layer {expected}",
                )
            expected = max(expected, last + 1)
        if ctx.num_layers is not None:
            if expected < ctx.num_layers:
                yield Diagnostic(
                    "E201",
                    f"{_layers(range(expected, ctx.num_layers))} in no stage",
                    stages[-1].span,
                    hint=f"the model has {ctx.num_layers} layers (0..{ctx.num_layers - 1})",
                )
            elif expected > ctx.num_layers:
                yield Diagnostic(
                    "E201",
                    f"the partition names layers up to {expected - 1}, but the model "
                    f"has {ctx.num_layers} (0..{ctx.num_layers - 1})",
                    stages[-1].span,
                )
        if ctx.pattern is not None and stages[0].symbols is not None:
            written = "".join(st.symbols or "" for st in stages)
            if written != ctx.pattern:
                at = next(
                    (
                        k
                        for k, (a, b) in enumerate(zip(written, ctx.pattern, strict=False))
                        if a != b
                    ),
                    min(len(written), len(ctx.pattern)),
                )  # or where the shorter ends
                yield Diagnostic(
                    "E204",
                    f"the partition's layer pattern differs from the model's at layer {at}",
                    ctx.plan.partition_span,
                    hint=f'the model\'s pattern is "{ctx.pattern}"',
                )


# -- placement ---------------------------------------------------------------------------------


@rule
class PlacementValid(Rule):
    """Every stage on exactly one existing device."""

    codes = ("E210", "E211", "E212", "E213")
    needs = ("partition", "placement")

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        plan = ctx.plan
        seen: dict[int, int] = {}
        for e in plan.placement:
            if not 0 <= e.device < plan.devices:
                yield Diagnostic(
                    "E212",
                    f"device {e.device} does not exist: the plan has {plan.devices} "
                    f"devices (0..{plan.devices - 1})",
                    e.span,
                )
            for s in e.stages:
                if not 0 <= s < plan.num_stages:
                    yield Diagnostic(
                        "E213",
                        f"stage {s} does not exist: the partition has {plan.num_stages} "
                        f"stages (0..{plan.num_stages - 1})",
                        e.span,
                    )
                elif s in seen:
                    yield Diagnostic(
                        "E210",
                        f"stage {s} is placed on device {seen[s]} and again on device {e.device}",
                        e.span,
                        hint="a stage lives on exactly one device",
                    )
                else:
                    seen[s] = e.device
        missing = [s for s in range(plan.num_stages) if s not in seen]
        if missing:
            yield Diagnostic(
                "E211",
                f"stage{'s' if len(missing) > 1 else ''} {ranges_text(missing)} "
                f"{'are' if len(missing) > 1 else 'is'} on no device",
                plan.placement_span,
            )


# -- ops ---------------------------------------------------------------------------------------


@rule
class OpsComplete(Rule):
    """One F, and one B + W or one BW, per stage and micro-batch; each on its stage's device."""

    codes = ("E301", "E302", "E303", "E304", "E305")
    needs = ("partition", "schedule")

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        plan = ctx.plan
        S, M = plan.num_stages, plan.microbatches
        seen: dict[tuple, Op] = {}
        kinds_of_stage: dict[int, set[OpKind]] = defaultdict(set)
        # Problems are gathered per op as written (a range, an op in a loop body), then reported
        # once each, naming the micro-batches it covers: `F0:0..3: stage 0 does not exist`.
        problems: dict[tuple, list[int]] = defaultdict(list)
        firsts: dict[tuple, Op] = {}
        for d, _, op in plan.ops():
            if not 0 <= op.stage < S:
                problems["stage", op.kind, op.stage, op.span].append(op.mb)
                continue
            if not 0 <= op.mb < M:
                problems["mb", op.kind, op.stage, op.span].append(op.mb)
                continue
            key = op.key()
            first = seen.get(key)
            if first is not None:
                where = ("twice", op.kind, op.stage, op.span)
                problems[where].append(op.mb)
                firsts.setdefault(where, first)
                continue
            seen[key] = op
            kinds_of_stage[op.stage].add(op.kind)
            home = ctx.stage_device.get(op.stage)
            if home is not None and home != d:
                problems["device", op.kind, op.stage, op.span, d, home].append(op.mb)
        for (what, kind, stage, span, *devices), mbs in problems.items():
            label = f"{kind}{stage}:{ranges_text(mbs)}"
            if what == "stage":
                yield Diagnostic(
                    "E303", f"{label}: stage {stage} does not exist ({_stages(S)})", span
                )
            elif what == "mb":
                out = sorted(set(mbs))
                yield Diagnostic(
                    "E303",
                    f"{label}: micro-batch{'es' * (len(out) > 1)} "
                    f"{ranges_text(out)} do{'es' * (len(out) == 1)} not exist "
                    f"(micro-batches 0..{M - 1})",
                    span,
                )
            elif what == "twice":
                first = firsts[what, kind, stage, span]
                yield Diagnostic(
                    "E302",
                    f"{label} {_again(mbs)}",
                    span,
                    hint=f"first at line {first.span.line}" if first.span else None,
                )
            else:
                d, home = devices
                yield Diagnostic(
                    "E305",
                    f"{label} runs on device {d}, but stage {stage} is on device {home}",
                    span,
                    hint=f"move it to device {home}'s schedule",
                )
        for s in range(S):
            kinds = kinds_of_stage.get(s, set())
            if OpKind.BW in kinds and kinds & {OpKind.B, OpKind.W}:
                yield Diagnostic(
                    "E304",
                    f"stage {s} mixes fused backward (BW) with split backward (B/W)",
                    self._where(ctx, s),
                    hint="a stage either splits its backward for every "
                    "micro-batch or fuses it for every micro-batch",
                )
                continue
            split = OpKind.B in kinds or OpKind.W in kinds
            wanted = [OpKind.F] + ([OpKind.B, OpKind.W] if split else [OpKind.BW])
            for kind in wanted:
                missing = [m for m in range(M) if (kind, s, m) not in seen]
                if missing:
                    yield Diagnostic(
                        "E301",
                        f"stage {s} has no {kind} for micro-batch{'es' if len(missing) > 1 else ''} "
                        f"{ranges_text(missing)}",
                        self._where(ctx, s),
                        hint=self._hint(kind, split),
                    )

    @staticmethod
    def _where(ctx: Context, stage: int) -> Span | None:
        d = ctx.stage_device.get(stage)
        spans = ctx.plan.schedule_spans
        if d is not None and d < len(spans) and spans[d] is not None:
            return spans[d]
        return ctx.plan.placement_span

    @staticmethod
    def _hint(kind: OpKind, split: bool) -> str | None:
        if kind is OpKind.W:
            return "a stage with B ops needs a W op for each micro-batch (or use fused BW)"
        if kind is OpKind.B:
            return "a stage with W ops needs a B op for each micro-batch"
        return None


def _stages(n: int) -> str:
    """'stages 0..3', 'stage 0 only'."""
    return f"stages 0..{n - 1}" if n > 1 else "stage 0 only"


def _again(mbs: list[int]) -> str:
    """How often the ops of micro-batches `mbs` (one entry per repeat) were given before."""
    distinct = len(set(mbs))
    if len(mbs) == distinct:
        return "appears twice" if distinct == 1 else "appear twice"
    if distinct == 1:
        return f"appears {len(mbs) + 1:,} times"
    return "appear more than twice"


# -- executability -----------------------------------------------------------------------------


@rule
class NoDeadlock(Rule):
    """The devices' orders together admit an execution."""

    codes = ("E310",)
    needs_valid_structure = True

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        result = deadlock(ctx.plan)
        if not result:
            return
        first = result[0]
        what = (
            f"device {first.device} waits for an op it runs later"
            if len(result) == 1
            else f"devices {', '.join(str(w.device) for w in result)} wait on each other in a cycle"
        )
        yield Diagnostic(
            "E310",
            f"the schedule deadlocks: {what}",
            first.op.span,
            notes=tuple(describe_cycle(result).splitlines()),
            hint="reorder the ops so that each op's inputs are computed earlier",
        )


# -- warnings ----------------------------------------------------------------------------------


@rule
class IdleDevice(Rule):
    """A device that holds no stage or runs nothing."""

    codes = ("W401",)
    needs = ("partition", "placement")

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        plan = ctx.plan
        held = {e.device for e in plan.placement if e.stages}
        for d in range(plan.devices):
            if d not in held and plan.placement:
                yield Diagnostic(
                    "W401", f"device {d} holds no stage and stays idle", plan.placement_span
                )


@rule
class FewMicrobatches(Rule):
    """Fewer micro-batches than devices: the pipeline is never full."""

    codes = ("W402",)

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        h = ctx.plan.header
        if h.microbatches < h.devices:
            yield Diagnostic(
                "W402",
                f"{h.microbatches} micro-batches for {h.devices} devices: the pipeline "
                "is never full, and most of each device's time is bubble",
                h.spans.get("microbatches"),
                hint="use at least as many micro-batches as devices",
            )


@rule
class OverlapSameDirection(Rule):
    """An overlap group of two forwards (or two backwards) gains nothing over running them in turn."""

    codes = ("W403",)

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        for slots in ctx.plan.schedule:
            for slot in slots:
                if len(slot.ops) == 1:  # not `overlapped`: a property call per op of a large plan
                    continue
                fwd = [op.kind is OpKind.F for op in slot.ops]
                if all(fwd) or not any(fwd):
                    yield Diagnostic(
                        "W403",
                        f"overlap group {slot} pairs ops of the same direction",
                        slot.span,
                        hint="overlap pays off between a forward and a backward",
                    )


@rule
class ZeroWithoutCopies(Rule):
    """ZeRO shards over the data-parallel copies: with one copy there is nothing to shard."""

    codes = ("W404",)

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        h = ctx.plan.header
        message = zero_without_copies(h.zero, h.dp)
        if message:
            yield Diagnostic(
                "W404",
                message,
                h.spans.get("zero"),
                hint="give the data-parallel copies ('dp 8'), or drop 'zero'",
            )


@rule
class DeepSpeedRunsNoMegatronField(Rule):
    """A plan for DeepSpeed's pipeline engine (octodsl's executor) that asks for what only
    Megatron-LM runs would be costed for a run that cannot happen."""

    codes = ("E407",)

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        h = ctx.plan.header
        message = runtime_conflict(h)
        if message:
            yield Diagnostic(
                "E407",
                message,
                h.spans.get("runtime"),
                hint="give 'runtime megatron', or drop what it does not run "
                '(docs/models-and-costs.md, "Overlaps")',
            )


@rule
class AccumulationDtype(Rule):
    """A `grad_accum_dtype` the plan's runtime does not accumulate its model's gradients in
    (`param_bytes.accum_problem`): the plan would be costed for a run that cannot happen."""

    codes = ("E408",)

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        h, spec = ctx.plan.header, ctx.spec
        if spec is None or h.grad_accum_dtype is None:
            return
        why = accum_problem(
            spec.dtype, plan_runtime(h), h.zero, h.reduce_scatter, h.grad_accum_dtype
        )
        if why:
            yield Diagnostic(
                "E408",
                why,
                h.spans.get("grad_accum_dtype"),
                hint="leave 'grad_accum_dtype' out for the runtime's own "
                '(docs/models-and-costs.md, "Bytes per parameter and ZeRO")',
            )


@rule
class ReduceScatterWithoutZero(Rule):
    """`reduce_scatter` chooses how ZeRO reduces the gradients to their shards: without ZeRO
    they are all-reduced whatever it says."""

    codes = ("W406",)

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        h = ctx.plan.header
        if not h.reduce_scatter and h.zero == 0:
            yield Diagnostic(
                "W406",
                "reduce_scatter false with zero 0: without ZeRO the "
                "gradients are all-reduced anyway",
                h.spans.get("reduce_scatter"),
                hint="give 'zero 1' (each copy then updates its shard of the "
                "optimizer state), or drop 'reduce_scatter'",
            )


@rule
class OverlapsNeedTheirCommunication(Rule):
    """An overlap field with nothing to overlap, or without what Megatron needs to overlap it."""

    codes = ("E405", "W405", "W703", "E704")

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        h = ctx.plan.header
        if h.overlap_param_gather and h.zero == 0:
            yield Diagnostic(
                "E405",
                "overlap_param_gather true with zero 0: the parameters are "
                "gathered only when ZeRO shards them",
                h.spans.get("overlap_param_gather"),
                hint="give 'zero 1' (Megatron's distributed optimizer), or drop "
                "'overlap_param_gather'",
            )
        if h.overlap_grad_reduce and h.dp == 1:
            yield Diagnostic(
                "W405",
                "overlap_grad_reduce true with dp 1: there are no gradients "
                "to reduce over data-parallel copies",
                h.spans.get("overlap_grad_reduce"),
                hint="give 'dp 8' or more, or drop 'overlap_grad_reduce'",
            )
        if h.overlap_tp_comm and h.tp == 1:
            yield Diagnostic(
                "W703",
                "overlap_tp_comm true with tp 1: there are no tensor-parallel "
                "collectives to overlap",
                h.spans.get("overlap_tp_comm"),
                hint="give 'tp 2' or more, or drop 'overlap_tp_comm'",
            )
        elif h.overlap_tp_comm and not h.sp:
            yield Diagnostic(
                "E704",
                "overlap_tp_comm true without sequence parallelism: Megatron "
                "overlaps the all-gathers and reduce-scatters of sequence-parallel "
                "layers only",
                h.spans.get("overlap_tp_comm"),
                hint="drop 'sequence_parallel false', or 'overlap_tp_comm'",
            )


# -- tensor parallelism ------------------------------------------------------------------------


@rule
class SequenceParallelNeedsTp(Rule):
    """Sequence parallelism splits the sequence over the tp group: with tp 1 there is none."""

    codes = ("E701",)

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        h = ctx.plan.header
        if h.sequence_parallel and h.tp == 1:
            yield Diagnostic(
                "E701",
                "sequence_parallel true with tp 1: sequence parallelism splits "
                "the sequence over a tensor-parallel group, and there is none",
                h.spans.get("sequence_parallel"),
                hint="give 'tp 2' or more, or drop 'sequence_parallel'",
            )


@rule
class TpSplitsModel(Rule):
    """tp must split every size of the model it divides (octodsl.models.tp): an error where it
    cannot, a warning where it is handled another way (KV heads replicated, vocab padded)."""

    codes = ("E702", "W701")

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        h, spec = ctx.plan.header, ctx.spec
        if spec is None or h.tp == 1:
            return
        problems = tp_problems(spec, h.tp)  # fatal ones first
        for i, p in enumerate(problems):
            if p.fatal:
                # One hint for them all: the errors stand together at the tp line.
                yield Diagnostic(
                    "E702",
                    f"tp {h.tp} does not split the {p.kind} {p.what} of "
                    f"{spec.name}: {p.size} is {p.remedy}",
                    h.spans.get("tp"),
                    hint=None if i else _tp_that_fit(spec, h.gpus_per_node),
                )
            else:
                yield Diagnostic(
                    "W701",
                    f"{spec.name}'s {p.kind} {p.what} {p.size} with tp {h.tp}: {p.remedy}",
                    h.spans.get("tp"),
                )


def _node_tps(gpus_per_node: int) -> list[int]:
    """The tp whose groups stay inside a node: the divisors of gpus_per_node (at most 32 of
    them up to MAX_GPUS_PER_NODE)."""
    return [t for t in range(1, gpus_per_node + 1) if gpus_per_node % t == 0]


def _tp_that_fit(spec: ModelSpec, gpus_per_node: int) -> str:
    """Which tp inside one node split every size of `spec` (tp 1 always does)."""
    fit = [t for t in _node_tps(gpus_per_node) if not any(p.fatal for p in tp_problems(spec, t))]
    return (
        f"of the tp that divide gpus_per_node {gpus_per_node}, tp {_or_list(fit)} "
        f"split{'s' if len(fit) == 1 else ''} every size"
    )


def _or_list(values: list[int]) -> str:
    """'1, 2 or 4'."""
    return (
        ", ".join(map(str, values[:-1])) + f" or {values[-1]}"
        if len(values) > 1
        else str(values[0])
    )


@rule
class SequenceSplits(Rule):
    """Sequence parallelism gives each GPU of the tp group 1/tp of the sequence: the sequence
    length must divide (Megatron requires it too)."""

    codes = ("E703",)

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        h = ctx.plan.header
        seq = h.seq_len if h.seq_len is not None else (ctx.spec.seq_len if ctx.spec else None)
        if h.tp == 1 or not h.sp or seq is None or seq % h.tp == 0:
            return
        where = "seq_len" if h.seq_len is not None else "tp"
        yield Diagnostic(
            "E703",
            f"sequence parallelism splits the sequence over tp {h.tp}, but "
            f"its length {seq} is not a multiple of {h.tp}",
            h.spans.get(where),
            hint=f"a seq_len of {_or_list(_multiples_near(seq, h.tp))}, or "
            "'sequence_parallel false'",
        )


def _multiples_near(value: int, step: int) -> list[int]:
    """The multiples of `step` just below and above `value` (not a multiple), each at least
    `step` and within MAX_SEQ_LEN: one of them only, when the other is not."""
    below = value - value % step
    return [m for m in (below, below + step) if step <= m <= MAX_SEQ_LEN] or [step]


@rule
class TpGroupSpansNodes(Rule):
    """A tp group with GPUs in two nodes: its collectives leave NVLink for the inter-node link."""

    codes = ("W702",)

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        h = ctx.plan.header
        if not Mesh.of(h).tp_spans_nodes:
            return
        device = get_device(DEFAULT_DEVICE)
        intra, inter = get_link(device.node_link), get_link(device.inter_node_link)
        why = f"tp {h.tp} exceeds" if h.tp > h.gpus_per_node else f"tp {h.tp} does not divide"
        yield Diagnostic(
            "W702",
            f"{why} gpus_per_node {h.gpus_per_node}: some tp groups span two nodes, so their "
            f"collectives run on the inter-node link ({inter.name}: {inter.bandwidth / 1e9:g} GB/s) "
            f"instead of NVLink ({intra.name}: {intra.bandwidth / 1e9:g} GB/s), about "
            f"{intra.bandwidth / inter.bandwidth:.1f}x slower per collective",
            h.spans.get("tp"),
            hint=f"tp {_or_list(_node_tps(h.gpus_per_node))} stay inside a node of "
            f"{h.gpus_per_node} GPUs",
        )


# -- expert parallelism ------------------------------------------------------------------------


@rule
class EpSplits(Rule):
    """`ep` spreads every MoE layer's experts over ep of the dp copies (octodsl.models.ep): it
    must divide dp and the expert counts; on a model without experts it does nothing."""

    codes = ("E705", "E706", "W704")

    def check(self, ctx: Context) -> Iterator[Diagnostic]:
        h, spec = ctx.plan.header, ctx.spec
        if h.ep == 1:
            return
        if spec is not None and not moe_layers(spec):
            yield Diagnostic(
                "W704",
                f"ep {h.ep} for {spec.name}, which has no MoE layers: there are no experts "
                "to spread, so ep changes nothing",
                h.spans.get("ep"),
                hint="drop 'ep', or name a model with MoE layers",
            )
            return
        problem = ep_problem(spec, h.ep, h.dp)
        if problem is None:
            return
        where, message = problem
        fit = [e for e in eps_that_fit(spec, h.dp) if e > 1]
        yield Diagnostic(
            "E705" if where == "dp" else "E706",
            message,
            h.spans.get("ep"),
            hint=f"with dp {h.dp}, ep {_or_list(fit)} divide{'s' * (len(fit) == 1)} "
            f"{'dp and every expert count' if spec else 'dp'}"
            if fit
            else f"with dp {h.dp}, only ep 1 fits: give a dp that ep {h.ep} divides, "
            f"such as dp {h.ep * max(1, -(-h.dp // h.ep))}",
        )


def run_rules(
    ctx: Context, extra: Iterable[Callable[[Context], Iterable[Diagnostic]]] = ()
) -> list[Diagnostic]:
    """Run every rule; rules that need a sound structure run only when there is one."""
    diags: list[Diagnostic] = []
    rules = [cls for cls in RULES if ctx.sections.issuperset(cls.needs)]
    for cls in rules:
        if not cls.needs_valid_structure:
            diags.extend(cls().check(ctx))
    if not any(d.is_error for d in diags):
        for cls in rules:
            if cls.needs_valid_structure:
                diags.extend(cls().check(ctx))
        for check in extra:
            diags.extend(check(ctx))
    return diags
