"""Plans -> Megatron-LM command-line arguments (`octodsl convert plan.octo --to megatron`).

The output is a bash array of arguments, with comments, for Megatron-LM's pretrain scripts. The
flags are those of Megatron-LM's `megatron/training/arguments.py` at main d98e8a6 (2026-08);
the layout strings are checked against megatron-core 0.16.1's own parsers (the PyPI release,
importable without a GPU) in tests/interop/test_megatron.py.

What maps:
- Partition. A GPT-style model (every layer a mixer, attention `*` or gated DeltaNet `G`, then
  an MLP `-` or MoE `E`: Llama, Qwen3-Next) takes `--pipeline-model-parallel-layout`, one
  `|`-separated segment per stage in stage order, `E` the embedding, `t` one transformer layer
  (mixer + MLP), `L` the loss (megatron-core's PipelineParallelLayerLayout; its `m` is a
  multi-token-prediction layer, which octodsl has not). A cut inside a transformer layer
  (between its mixer and its MLP) cannot be written there: an error. A hybrid model (Mamba2
  `M` layers: Nemotron-H) takes `--hybrid-layer-pattern`, octodsl's pattern less its `[` and `]`
  with `|` at each cut (Megatron-LM since PR #3377; megatron-core 0.16.1 called it
  `--hybrid-override-pattern` and took no `|`: the comment gives the 0.16 form where its
  even-or-first/last split can cut so). Mamba1 (`m`, Jamba) has no Megatron layer: an error.
- Placement. Megatron puts (virtual) stage s on pipeline rank s mod P, so only looped
  placements map: V stages per device are V virtual stages per rank, which Megatron derives from
  the layout's segment count (it refuses `--num-virtual-stages-per-pipeline-rank` next to a
  layout). A V placement, a map that is not s mod P or unequal stages per device: an error.
- Schedule. Megatron runs 1F1B with one stage per rank and interleaved 1F1B with more; the plan's
  order is either exactly that (`octodsl gen 1f1b` / `interleaved`'s) or named as having no
  Megatron equivalent (with split backwards, or any other order), Megatron then running the
  nearest, its 1F1B or interleaved 1F1B over the same stages.
- Header. tp -> `--tensor-model-parallel-size` and `--sequence-parallel`; dp is what the world
  size leaves (tp x P x dp GPUs); ep -> `--expert-model-parallel-size` with the alltoall token
  dispatcher (`--moe-token-dispatcher-type alltoall`); zero 1 -> `--use-distributed-optimizer` (zero 2 too, which
  shards the optimizer state only there); micro-batch size, seq_len and micro-batches ->
  `--micro-batch-size`, `--seq-length`, `--global-batch-size`.
- Recompute. Every stage full -> `--recompute-granularity full --recompute-method uniform
  --recompute-num-layers` the most layers of a stage (one group per stage: only its input is
  kept, as the plan's `full`); every stage selective -> `--recompute-granularity selective`
  (Megatron recomputes the attention core only: a note says so). Recompute on some stages
  only: Megatron applies one setting to every stage, so none is given and a warning says so.
"""

from __future__ import annotations

import re

from ..mesh import Mesh
from ..models.pattern import MIXERS, transformer_layers
from ..plan import DEEPSPEED, Plan, Recompute
from .export import (
    Cuts,
    Export,
    ExportError,
    is_generated,
    looped_chunks,
    placement_problem,
    plan_cuts,
)

HYBRID = "M*G-E"
"""Symbols of Megatron-LM's hybrid layer pattern (Mamba2, attention, gated DeltaNet, MLP, MoE)."""
HYBRID_0_16 = "M*-E"
"""Those megatron-core 0.16.1's `--hybrid-override-pattern` takes."""
ARRAY = "MEGATRON_ARGS"


def megatron_args(plan: Plan, source: str = "") -> Export:
    """The Megatron-LM arguments for a plan that lints clean; `source` names the plan file in
    the text. ExportError for a plan Megatron cannot place or cut as written."""
    cuts = plan_cuts(plan, "Megatron's layout")
    V = looped_chunks(plan)
    if V is None:
        raise ExportError(
            f"Megatron places virtual stage s on pipeline rank s mod {plan.devices} "
            f"and no other way, and this plan cannot be so: {placement_problem(plan)}; "
            "`octodsl gen interleaved` writes a looped plan"
        )
    body = cuts.spec.pattern[1:-1]
    if "m" in body:
        raise ExportError(
            f"{cuts.spec.name} has Mamba1 layers ('m'), which Megatron-LM has not "
            "(its Mamba layers are Mamba2, 'M')"
        )
    hybrid = "M" in body or not transformer_layers(body)
    out = _Args(
        plan,
        source,
        V,
        "pretrain_hybrid.py (pretrain_mamba.py before PR #3377)" if hybrid else "pretrain_gpt.py",
    )
    counts = out.partition_hybrid(cuts) if hybrid else out.partition_gpt(cuts)
    out.mesh()
    out.runtime()
    out.batch(cuts)
    out.recompute(counts)
    out.schedule()
    return Export(out.render(), out.warnings)


def layout_string(symbols: list[str]) -> str:
    """megatron-core's --pipeline-model-parallel-layout of stages holding these layer symbols
    (whole transformer layers of a GPT-style model), e.g. `Et*3|t*4|t*4|t*3L`."""
    segments = []
    for s in symbols:
        n = sum(sym in MIXERS for sym in s)
        layers = "t" if n == 1 else f"t*{n}" if n else ""
        segments.append(("E" if "[" in s else "") + layers + ("L" if "]" in s else ""))
    return "|".join(segments)


def hybrid_pattern(symbols: list[str]) -> str:
    """Megatron-LM's --hybrid-layer-pattern of stages holding these layer symbols: the pattern
    with `|` at each cut, the embedding and the LM head left out (Megatron puts them on the first
    and last stage by itself)."""
    return "|".join(s.replace("[", "").replace("]", "") for s in symbols)


def _quoted(text: str) -> str:
    """`text` as one bash word inside double quotes (a layout holds `*`, `|`, `(`)."""
    return '"' + re.sub(r'(["\\$`])', r"\\\1", text) + '"'


class _Args:
    """The arguments and comments, in the order they are printed."""

    def __init__(self, plan: Plan, source: str, chunks: int, script: str) -> None:
        self.plan, self.source, self.V, self.script = plan, source, chunks, script
        self.lines: list[str] = []
        self.warnings: list[str] = []

    def flag(self, name: str, value: str | int | None = None, comment: str | None = None) -> None:
        if comment:
            self.lines.append(f"  # {comment}")
        self.lines.append(f"  {name}" + ("" if value is None else f" {value}"))

    def comment(self, text: str) -> None:
        self.lines.append(f"  # {text}")

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        self.comment(f"WARNING: {text}")

    # -- partition and placement ---------------------------------------------------------------

    def partition_gpt(self, cuts: Cuts) -> list[int]:
        """The layout of a GPT-style model; its decoder layers per stage."""
        at = 0
        for s, symbols in enumerate(cuts.symbols):
            at += len(symbols)
            # A cut must fall after an MLP (or the embedding): layer `at` then opens a layer.
            if s < len(cuts.symbols) - 1 and symbols[-1] in MIXERS:
                raise ExportError(
                    f"stage {s} ends at layer {at - 1}, the mixer of a transformer layer whose "
                    f"MLP is layer {at} on stage {s + 1}: Megatron's layout cuts between whole "
                    f"transformer layers only (move the cut to layer {at - 1} or {at + 1})"
                )
        layout = layout_string(cuts.symbols)
        P = self.plan.devices
        self.flag("--pipeline-model-parallel-size", P)
        self.flag("--num-layers", sum(sym in MIXERS for sym in cuts.spec.pattern))
        self.flag(
            "--pipeline-model-parallel-layout",
            _quoted(layout),
            f"{self.plan.num_stages} stages in stage order: E embedding, t a transformer "
            "layer (mixer + MLP), L the loss"
            + (
                f"; {self.V} virtual stages per rank, which Megatron derives from the "
                f"{self.plan.num_stages} segments"
                if self.V > 1
                else ""
            ),
        )
        if "G" in cuts.spec.pattern:
            self.gated_deltanet(cuts.spec.pattern)
        return [sum(sym in MIXERS for sym in s) for s in cuts.symbols]

    def gated_deltanet(self, pattern: str) -> None:
        """Qwen3-Next: which transformer layers mix with gated DeltaNet (1) or attention (0)."""
        linear = [int(sym == "G") for sym in pattern if sym in MIXERS]
        self.flag("--experimental-attention-variant", "gated_delta_net")
        n = next(
            (
                n
                for n in range(2, len(linear) + 1)
                if linear == [int((i + 1) % n != 0) for i in range(len(linear))]
            ),
            None,
        )
        self.flag(
            "--linear-attention-freq",
            n if n else _quoted(str(linear).replace(" ", "")),
            "transformer layers mixing with gated DeltaNet (the rest with attention)",
        )

    def partition_hybrid(self, cuts: Cuts) -> list[int]:
        """The hybrid pattern of a Mamba hybrid; its layers per stage."""
        bad = sorted(set(cuts.spec.pattern[1:-1]) - set(HYBRID))
        if bad:
            raise ExportError(
                f"{cuts.spec.name}'s layers {', '.join(repr(b) for b in bad)} have no "
                f"symbol in Megatron's hybrid layer pattern ({HYBRID})"
            )
        counts = [len(s.strip("[]")) for s in cuts.symbols]
        P = self.plan.devices
        self.flag("--pipeline-model-parallel-size", P)
        self.flag(
            "--hybrid-layer-pattern",
            _quoted(hybrid_pattern(cuts.symbols)),
            f"{cuts.spec.name}'s {sum(counts)} layers, '|' at each of the plan's cuts "
            "(Megatron-LM since PR #3377; the embedding and the loss go on the first and "
            "last stage by themselves)"
            + (
                f"; {self.V} virtual stages per rank, which Megatron derives from the "
                f"{self.plan.num_stages} segments"
                if self.V > 1
                else ""
            ),
        )
        self.comment(self.older_hybrid(cuts, counts))
        return counts

    def older_hybrid(self, cuts: Cuts, counts: list[int]) -> str:
        """What megatron-core 0.16.1 (PyPI) takes for the same cuts, or why it takes none: its
        MambaStack has no virtual stages and cuts evenly, or with the first and last stage's
        layer counts given and the stages between them equal."""
        old = "megatron-core <= 0.16 (PyPI 0.16.1) takes no '|'"
        plain = _quoted(cuts.spec.pattern[1:-1])
        bad = set(cuts.spec.pattern[1:-1]) - set(HYBRID_0_16)
        if bad:
            return f"{old} and no {', '.join(sorted(bad))} layers in its hybrid pattern"
        if self.V > 1:
            return f"{old} and no virtual stages for hybrid models: it cannot run this plan"
        P = len(counts)
        flags = f"--hybrid-override-pattern {plain}"
        if len(set(counts)) == 1:
            return f"{old}: there, --hybrid-override-pattern {plain} cuts these equal stages"
        middle = set(counts[1:-1])
        if len(middle) > 1:
            return (
                f"{old}, and its split (first and last stage given, those between equal) "
                f"cannot give these stages of {', '.join(map(str, counts))} layers"
            )
        m = middle.pop() if middle else None
        if m is None or counts[0] != m:
            flags += f" --decoder-first-pipeline-num-layers {counts[0]}"
        if m is None or counts[-1] != m:
            flags += f" --decoder-last-pipeline-num-layers {counts[-1]}"
        return f"{old}: there, {flags} cuts the same {P} stages"

    # -- header --------------------------------------------------------------------------------

    def runtime(self) -> None:
        """The header's runtime fields as Megatron's flags (its defaults: p2p overlap and
        gradient-accumulation fusion on, the other overlaps off)."""
        h = self.plan.header
        if h.overlap_param_gather and not h.overlap_grad_reduce:
            raise ExportError(
                "the plan has overlap_param_gather without overlap_grad_reduce; "
                "Megatron-LM takes --overlap-param-gather only with "
                "--overlap-grad-reduce"
            )
        if h.overlap_tp_comm:
            self.flag(
                "--tp-comm-overlap",
                comment="overlap_tp_comm: Transformer Engine's "
                "userbuffers overlap of the tp collectives with the GEMMs",
            )
        if h.overlap_grad_reduce:
            self.flag("--overlap-grad-reduce")
        if h.overlap_param_gather:
            self.flag("--overlap-param-gather")
        if not h.overlap_p2p_comm:
            self.flag(
                "--no-overlap-p2p-communication",
                comment="overlap_p2p_comm false: each op waits for its pipeline sends and receives",
            )
        if not h.grad_accumulation_fusion:
            self.flag(
                "--no-gradient-accumulation-fusion",
                comment="grad_accumulation_fusion "
                "false: weight gradients are added to the buffer by a pass of their own",
            )
        if h.zero > 0 and not h.reduce_scatter:
            self.comment(
                "reduce_scatter false: Megatron-LM's distributed optimizer "
                "reduce-scatters the gradients to their shards anyway"
            )
        if h.runtime == DEEPSPEED:
            self.comment(
                "runtime deepspeed: the plan is costed for DeepSpeed's bytes per parameter; "
                "Megatron-LM holds others (`octodsl simulate --target megatron`)"
            )
        if h.tp > 1 and not h.sp and not h.scatter_gather_messages:
            self.comment(
                "scatter_gather_messages false: Megatron-LM scatters and gathers the "
                "pipeline messages of a tp group anyway (1/tp from each GPU)"
            )

    def mesh(self) -> None:
        h = self.plan.header
        self.flag("--tensor-model-parallel-size", h.tp)
        if h.sp:
            self.flag("--sequence-parallel")
        gpus = Mesh.of(h).world
        self.comment(
            f"data-parallel size {h.dp}: Megatron takes it from the world size, "
            f"tp {h.tp} x pp {h.devices} x dp {h.dp} = {gpus} GPUs"
        )
        if h.ep > 1:
            self.flag(
                "--expert-model-parallel-size",
                h.ep,
                comment=f"ep {h.ep}: each MoE layer's experts spread over {h.ep} of the "
                f"{h.dp} data-parallel copies (the expert-tensor-parallel size is tp's, "
                "Megatron's default)",
            )
            self.flag(
                "--moe-token-dispatcher-type",
                "alltoall",
                comment="tokens to their experts' ranks and back by all-to-alls, as octodsl "
                "costs them",
            )
        if h.zero:
            self.flag(
                "--use-distributed-optimizer",
                comment=None
                if h.zero == 1
                else "zero 2: Megatron's distributed optimizer shards the optimizer state "
                "(zero 1); each rank still holds all of its gradients",
            )
            if h.zero == 2:
                self.warnings.append(
                    "zero 2 becomes Megatron's distributed optimizer, which "
                    "shards the optimizer state only (zero 1)"
                )

    def batch(self, cuts: Cuts) -> None:
        h = self.plan.header
        mbs = h.microbatch_size or cuts.spec.microbatch_size
        self.flag("--micro-batch-size", mbs)
        copies = f", on each of {h.dp} data-parallel copies" if h.dp > 1 else ""
        self.flag(
            "--global-batch-size",
            mbs * h.microbatches * h.dp,
            f"{h.microbatches} micro-batches of {mbs} per iteration{copies}",
        )
        self.flag("--seq-length", h.seq_len or cuts.spec.seq_len)

    def recompute(self, counts: list[int]) -> None:
        modes = set(self.plan.recompute())
        if modes == {Recompute.NONE}:
            return
        if modes == {Recompute.FULL}:
            self.flag(
                "--recompute-granularity",
                "full",
                "every stage recomputes in full: one uniform group per stage keeps "
                "only the stage's input",
            )
            self.flag("--recompute-method", "uniform")
            self.flag("--recompute-num-layers", max(1, max(counts)))
        elif modes == {Recompute.SELECTIVE}:
            self.flag(
                "--recompute-granularity",
                "selective",
                "Megatron's selective recompute redoes the attention core (core_attn); "
                "the plan's also drops norm and activation outputs and Mamba chunk states, "
                "which Megatron keeps",
            )
        else:
            shown = ", ".join(
                f"stage {i}: {m}"
                for i, m in enumerate(self.plan.recompute())
                if m is not Recompute.NONE
            )
            self.warn(
                f"the recompute section ({shown}) is not given: Megatron applies one "
                "recompute setting to every stage"
            )

    def schedule(self) -> None:
        P, M, V = self.plan.devices, self.plan.microbatches, self.V
        name = "1F1B" if V == 1 else "interleaved 1F1B"
        if V > 1 and M < P:
            raise ExportError(
                f"Megatron's interleaved schedule needs at least as many "
                f"micro-batches as pipeline ranks ({P}); the plan has {M}"
            )
        exact = (
            is_generated(self.plan, "1f1b") if V == 1 else is_generated(self.plan, "interleaved", V)
        )
        group = next(k for k in range(P, M + 1) if M % k == 0) if V > 1 else P
        if exact and group == P:
            self.comment(f"schedule: Megatron's {name}, the plan's order exactly")
        elif exact:
            self.warn(
                f"the plan's order is interleaved 1F1B in groups of {group} micro-batches; "
                f"Megatron's default groups are {P} (set microbatch_group_size_per_vp_stage"
                f" = {group} in its ModelParallelConfig for this order)"
            )
        else:
            split = any(self.plan.split_stages())
            why = " (it splits backwards into B and W)" if split else ""
            self.warn(
                f"the plan's order{why} has no Megatron equivalent: Megatron runs its "
                f"{name} over these stages instead"
            )

    def render(self) -> str:
        h = self.plan.header
        title = (
            f'Megatron-LM arguments for plan "{h.name}"'
            + (f" ({self.source})" if self.source else "")
            + ", by `octodsl convert --to megatron`."
        )
        return "\n".join(
            [
                f"# {title}",
                f"# Model {h.model}: give its sizes (hidden, heads, ...) as for any Megatron run.",
                f'# Use: torchrun ... {self.script} "${{{ARRAY}[@]}}" ...',
                f"{ARRAY}=(",
                *self.lines,
                ")",
                "",
            ]
        )
