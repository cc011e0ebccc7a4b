"""The registry of diagnostic codes: every code octodsl reports, its severity, a one-line title
and what docs/diagnostics.md says of it.

A Diagnostic takes its severity from here, a lint rule declares the codes it reports from here
(`Rule.codes`), and the code tables of docs/diagnostics.md are generated from here
(`python .ci/diagnostics_doc.py`). The letter of a code is its severity: E an error (lint exits
1, and the plan reaches no command that runs it), W a warning. Numbering: E1xx the text and its
header, E2xx the partition and placement, E3xx the schedule, W4xx/E4xx the runtime fields, E5xx
memory, E6xx/W6xx PyTorch's action CSV, E7xx/W7xx tensor and expert parallelism, W8xx the
suppression comments themselves.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"


_SEVERITY = {"E": Severity.ERROR, "W": Severity.WARNING}


class Topic(str, enum.Enum):
    """Which table of docs/diagnostics.md lists a code."""

    PLAN = "plan"
    """What lint reports of a .octo plan."""
    CSV = "csv"
    """What reading or writing PyTorch's action CSV reports."""
    SUPPRESSION = "suppression"
    """What lint reports of the suppression comments (`# octodsl: ignore[...]`)."""


@dataclass(frozen=True, slots=True)
class Code:
    id: str
    title: str
    """One line: what the problem is."""
    detail: str = ""
    """What docs/diagnostics.md adds after the title: examples, limits, what the hint says."""
    topic: Topic = Topic.PLAN

    @property
    def severity(self) -> Severity:
        return _SEVERITY[self.id[0]]

    @property
    def ignorable(self) -> bool:
        """Whether a suppression comment may silence it: a warning, other than one about the
        suppression comments themselves (which would silence its own complaint)."""
        return self.severity is Severity.WARNING and self.topic is not Topic.SUPPRESSION


_CSV, _SUPPRESSION = Topic.CSV, Topic.SUPPRESSION

_TABLE = (
    # -- the text and its header ---------------------------------------------------------------
    Code(
        "E101",
        "syntax error: an unexpected token or character",
        "the message says what was expected",
    ),
    Code("E102", "the file ends in the middle of something"),
    Code(
        "E103",
        "a malformed or negative number",
        "such as `1e8`, `1.5` without a unit, `80Gib` or `4devices` (numbers are decimal "
        "digits; sizes a number and a unit); `dp -1` is \"'-1' is not a number: a plan's "
        'numbers have no sign", hint "\'dp\' is at least 1"',
    ),
    Code(
        "E104",
        "a number larger than `MAX_INT`",
        "see [limits](language.md#limits); it is never converted",
    ),
    Code(
        "E105",
        "nested too deep",
        "`for` loops or parentheses nested deeper than `MAX_NESTING`, or an expression of "
        "more operators",
    ),
    Code("E110", "unknown header field", 'with a "did you mean"'),
    Code(
        "E111",
        "a header value of the wrong type",
        '`tp "2"` ("\'tp\' must be a whole number, not "2""), `sequence_parallel yes` or '
        '`1` ("must be true or false")',
    ),
    Code("E112", "a required header field (`devices`, `microbatches`) is missing"),
    Code("E113", "a header field is given twice"),
    Code(
        "E114",
        "a header value out of range",
        "e.g. `devices 0`, or `devices 5000`: the message names the limit; `zero 3`: \"'zero' "
        'must be 0, 1 or 2, not 3", the hint says what each shards',
    ),
    Code("E120", "a section (partition, placement, recompute, schedule) given twice"),
    Code("E121", "a section is missing"),
    Code("E130", "unknown placement shorthand", "use `loop`, `v` or an explicit block"),
    Code("E131", "`placement v` with a stage count other than 2 x devices"),
    Code("E140", "a character in a layer pattern that is no layer symbol"),
    Code("E150", "a name in an op that is no enclosing loop variable"),
    Code("E151", "an empty or backward range (`3..1`)"),
    Code("E153", "two schedule blocks for the same device"),
    Code("E154", "a schedule block for a device the plan does not have"),
    Code("E155", "a range inside an overlap group"),
    Code("E156", "a loop variable that hides an outer one"),
    Code(
        "E157",
        "past `MAX_OPS`",
        "the range that would unroll the plan past it, or stages x micro-batches too many for "
        "any complete plan",
    ),
    Code("E158", "past `MAX_LOOP_ITERATIONS`", "the loop that would take all loops past it"),
    Code("E159", "an index expression whose value passes `MAX_INT`", "as `i*1000000000000`"),
    Code(
        "E170",
        "an unknown recompute mode",
        'with a "did you mean": `stage 3: ful` (the modes are `none`, `full`, `selective`)',
    ),
    Code(
        "E171",
        "a recompute line for a stage the partition does not have",
        '`stage 9: full` with `stages 4` ("the partition has 4 stages (0..3)")',
    ),
    Code(
        "E172",
        "a stage named twice in the recompute section",
        "`stage 3: full ... stage 3: selective`; the hint gives the first one's line",
    ),
    # -- partition and placement ---------------------------------------------------------------
    Code("E201", "the partition leaves layers out, or gives a layer to two stages"),
    Code(
        "E202",
        "an empty stage",
        "or more abstract stages (`stages N`) than the plan's model has layers",
    ),
    Code("E203", "stages declared out of order"),
    Code("E204", "a layer-pattern partition that differs from the plan's model"),
    Code("E205", "a partition with no stages", "`partition { }`, `stages 0`"),
    Code("E206", "the plan's model cannot be loaded"),
    Code(
        "E207",
        "too many stages or layers",
        "more stages than `MAX_STAGES`, or a layer number of `MAX_LAYERS` or more",
    ),
    Code("E210", "a stage placed on two devices"),
    Code("E211", "a stage placed on no device"),
    Code("E212", "a placement entry for a device the plan does not have"),
    Code("E213", "a placement entry for a stage the partition does not have"),
    # -- the schedule --------------------------------------------------------------------------
    Code("E301", "a stage lacks an op for some micro-batches", "F; B and W, or BW"),
    Code("E302", "an op appears twice"),
    Code("E303", "an op names a stage or micro-batch that does not exist"),
    Code("E304", "a stage mixes fused (BW) and split (B/W) backward"),
    Code("E305", "an op on a device other than its stage's"),
    Code("E310", "the schedule deadlocks", "the notes list the wait-for cycle op by op"),
    # -- the runtime fields --------------------------------------------------------------------
    Code("W401", "a device holds no stage"),
    Code("W402", "fewer micro-batches than devices"),
    Code("W403", "an overlap group of two ops of the same direction"),
    Code(
        "W404",
        "`zero 1` or `zero 2` with `dp 1` (or no `dp`)",
        "there are no other copies to shard over",
    ),
    Code(
        "E405",
        "`overlap_param_gather true` with `zero 0`",
        "only ZeRO's sharded parameters are gathered (Megatron requires the distributed "
        "optimizer for `--overlap-param-gather`)",
    ),
    Code(
        "W405",
        "`overlap_grad_reduce true` with `dp 1`",
        "there is no data-parallel reduction to overlap",
    ),
    Code(
        "W406",
        "`reduce_scatter false` with `zero 0`",
        "without ZeRO the gradients are all-reduced whatever it says",
    ),
    Code(
        "E407",
        "`runtime deepspeed` with what only Megatron-LM runs",
        "an overlap of tp, dp or parameter-gather communication, scattered messages, fused "
        "gradient accumulation or `zero 2`: DeepSpeed's pipeline engine runs none of them",
    ),
    Code(
        "E408",
        "`grad_accum_dtype` the runtime does not accumulate in",
        "Megatron-LM accumulates a bf16 model's gradients in fp32, DeepSpeed in the model's "
        "dtype, or in fp32 at zero 1 with `reduce_scatter false` (its BF16 optimizer)",
    ),
    # -- memory --------------------------------------------------------------------------------
    Code(
        "E501",
        "a device's simulated peak memory exceeds the plan's `memory` limit",
        "needs `model`; names the op at the peak",
    ),
    # -- PyTorch's action CSV ------------------------------------------------------------------
    Code(
        "E601",
        "a cell that is no action",
        "`0F1`, `3I0`, `3W0`, `2B5`, `(0F7;7B3)OVERLAP_F_B` are actions",
        _CSV,
    ),
    Code("E602", "an action without a micro-batch", topic=_CSV),
    Code("E603", "a stage on two rows (devices)", topic=_CSV),
    Code("E604", "an op given twice", topic=_CSV),
    Code("E605", "a stage, an op or a micro-batch missing", topic=_CSV),
    Code("E606", "an empty file", topic=_CSV),
    Code(
        "E607",
        "a number past a limit",
        "a stage or micro-batch number (at its digits), more rows than `MAX_DEVICES`, or "
        "stages x micro-batches too many for `MAX_OPS`",
        _CSV,
    ),
    Code("W601", "SEND/RECV actions dropped", "octodsl derives messages from the plan", _CSV),
    Code(
        "W602",
        "a stage mixing fused (`B`) and split (`I`/`W`) backward",
        "its fused ones are split into B then W",
        _CSV,
    ),
    Code(
        "W603",
        "what a CSV has no place for is dropped",
        "written to a CSV (`octodsl convert plan.octo -o plan.csv`): the plan's `zero`, `tp`, "
        "`sequence_parallel`, `ep` or `gpus_per_node` (each when not its default) or the stages of "
        "its recompute section, one warning each, at where the plan states them; a CSV read "
        "back states `tp 1`",
        _CSV,
    ),
    # -- tensor parallelism --------------------------------------------------------------------
    Code(
        "E701",
        "`sequence_parallel true` with `tp 1` (or no `tp`)",
        "there is no tensor-parallel group to split the sequence over",
    ),
    Code(
        "E702",
        "`tp` does not split a size of the plan's model",
        'needs `model`; one error per size at the `tp` line: "tp 3 does not split the '
        "attention heads of nemotron-h-8b: 32 is not divisible by tp 3\"; the first one's hint "
        'names the tp inside a node that would ("of the tp that divide gpus_per_node 8, tp 1, '
        '2, 4 or 8 split every size")',
    ),
    Code(
        "E703",
        "a sequence length that `tp` does not divide, with sequence parallelism",
        "the header's `seq_len`, else the model's: each GPU holds 1/tp of the sequence; the "
        "hint names the nearest lengths that split",
    ),
    Code(
        "E704",
        "`overlap_tp_comm true` with `sequence_parallel false`",
        "Megatron's `--tp-comm-overlap` overlaps the all-gathers and reduce-scatters of "
        "sequence-parallel layers only",
    ),
    Code(
        "W701",
        "a size of the plan's model that `tp` does not divide but that is handled anyway",
        'the message says how: KV heads fewer than tp and dividing it ("each KV head '
        'replicated on 2 GPUs of the tp group"), a vocabulary padded to a multiple of tp '
        '("padded to 131073 (3 shards of 43691)")',
    ),
    Code(
        "W702",
        "a tp group spans nodes",
        "tp exceeds `gpus_per_node` or does not divide it: its collectives run on the "
        "inter-node link instead of NVLink; the message gives both bandwidths and the ratio "
        "(ib-ndr 45 GB/s against nvlink 160 GB/s: about 3.6x slower per collective)",
    ),
    Code(
        "W703",
        "`overlap_tp_comm true` with `tp 1`",
        "there are no tensor-parallel collectives to overlap",
    ),
    Code(
        "E705",
        "`ep` does not divide `dp`",
        "the ep group is `ep` of the dp copies (Megatron-core carves expert parallelism out of "
        "data parallelism); the hint names the ep that divide both dp and the model's expert "
        "counts",
    ),
    Code(
        "E706",
        "`ep` does not divide the expert count of the plan's MoE layers",
        "needs `model`; each rank of the ep group holds experts / ep of every MoE layer",
    ),
    Code(
        "W704",
        "`ep` greater than 1 for a model without MoE layers",
        "needs `model`; there are no experts to spread, so ep changes nothing",
    ),
    # -- the suppression comments ----------------------------------------------------------------
    Code(
        "W801",
        "a suppression comment names a code octodsl does not have",
        "`# octodsl: ignore[W999]`; for a code in the wrong case the hint gives the right one",
        _SUPPRESSION,
    ),
    Code(
        "W802",
        "a suppression comment names a code that cannot be ignored",
        "an error (the error is still reported: a plan with errors is never run), or one of "
        "these W8xx",
        _SUPPRESSION,
    ),
    Code(
        "W803",
        "a suppression that silences nothing",
        "no such warning on its line (or, for `ignore-file`, in the file), or a code named "
        "twice; not reported while the file has errors, as some checks then do not run",
        _SUPPRESSION,
    ),
    Code(
        "W804",
        "a malformed suppression comment",
        "a comment starting `# octodsl:` that is not `ignore[CODE, ...]` or "
        "`ignore-file[CODE, ...]`, that names no code (`ignore[]`, an empty item between "
        "commas), an `ignore` on a line of its own, or an `ignore-file` below the start of the "
        "plan",
        _SUPPRESSION,
    ),
)

CODES: dict[str, Code] = {c.id: c for c in _TABLE}
"""Every code octodsl reports, by its id."""
