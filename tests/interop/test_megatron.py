"""`octodsl convert --to megatron`: golden outputs, the layouts read back by megatron-core's own
parsers, the schedules compared with megatron-core's own schedule table, and the plans it refuses.

megatron-core 0.16.1 (PyPI, in the [test] extra) imports on a CPU without CUDA, apex or
Transformer Engine (it warns that they are missing), so the GPT layout is parsed and validated
by its PipelineParallelLayerLayout and the hybrid pattern's 0.16 form by its allocate_layers and
MambaStack's own stage selection. Megatron-LM's newer `--hybrid-layer-pattern` with `|` (PR
#3377, after 0.16.1 and not on PyPI) is checked against its grammar as read in
megatron/core/ssm/mamba_hybrid_layer_allocation.py (Megatron-LM main d98e8a6): the pattern split
at `|` gives a number of segments that pp divides, and segment vp * pp + rank is the layers of
virtual stage vp on pipeline rank `rank`.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octodsl.gen import generate, phased_schedule
from octodsl.interop.export import ExportError
from octodsl.interop.megatron import layout_string, megatron_args
from octodsl.lang import parse_plan

from ..conftest import check_golden

GOLDEN = Path(__file__).parent / "golden"
PLANS = sorted(GOLDEN.glob("*.octo"))


def plan_of(path: Path):
    return parse_plan(path.read_text(), str(path))


def argv(text: str) -> list[str]:
    """The arguments the output's bash array holds, as bash itself expands them."""
    out = subprocess.run(
        ["bash", "-c", text + '\nprintf "%s\\0" "${MEGATRON_ARGS[@]}"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split("\0")[:-1]


def value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


@pytest.fixture(scope="module")
def mcore():
    layout = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.ssm import mamba_block, mamba_hybrid_layer_allocation

    return SimpleNamespace(
        Layout=layout.PipelineParallelLayerLayout,
        schedules=schedules,
        allocation=mamba_hybrid_layer_allocation,
        block=mamba_block,
    )


@pytest.mark.parametrize("path", PLANS, ids=lambda p: p.stem)
def test_golden(path):
    export = megatron_args(plan_of(path), path.name)
    check_golden(path.with_suffix(".megatron.sh"), export.text)


def test_gpt_layout_read_back_by_megatron_core(mcore):
    path = GOLDEN / "llama3-8b-1f1b-p4-m8.octo"
    plan = plan_of(path)
    args = argv(megatron_args(plan).text)
    layout = mcore.Layout(value(args, "--pipeline-model-parallel-layout"), plan.devices)
    assert layout.virtual_pipeline_model_parallel_size == 1
    layout.validate_layer_layout(int(value(args, "--num-layers")), None)
    from megatron.core.transformer.enums import LayerType

    decoder = [layout.layout[s][0].count(LayerType.decoder) for s in range(plan.devices)]
    assert decoder == [8, 9, 8, 7]  # the transformer layers of each stage, as the plan cuts them


def test_interleaved_gpt_layout_places_stage_s_on_rank_s_mod_p(mcore):
    plan = generate("interleaved", 4, 8, chunks=2)
    symbols = ["[" + "*-" * 3, *["*-" * 4] * 6, "*-" * 5 + "]"]  # 32 transformer layers
    from megatron.core.transformer.enums import LayerType

    layout = mcore.Layout(layout_string(symbols), plan.devices)
    assert layout.virtual_pipeline_model_parallel_size == 2
    layout.validate_layer_layout(32, None)
    for s, sym in enumerate(symbols):
        assert layout.layout[s % 4][s // 4].count(LayerType.decoder) == sym.count("*")
    assert (
        layout.layout[0][0][0] is LayerType.embedding and layout.layout[3][1][-1] is LayerType.loss
    )


@given(st.data())
def test_any_whole_layer_cuts_are_read_back_by_megatron_core(mcore, data):
    """layout_string for any P, V and cuts between transformer layers (the first and last stage
    may hold only the embedding or the loss): megatron-core's parser finds each stage's layers on
    rank s mod P, virtual stage s // P, and its validation passes."""
    from megatron.core.transformer.enums import LayerType

    P, V = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3))
    n = data.draw(st.integers(max(1, P * V - 1), 40))
    cuts = sorted(data.draw(st.sets(st.integers(0, n), min_size=P * V - 1, max_size=P * V - 1)))
    bounds = [0, *cuts, n]
    # strict=False: consecutive pairs, bounds[1:] is one shorter
    counts = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    symbols = [
        ("[" if s == 0 else "") + "*-" * c + ("]" if s == len(counts) - 1 else "")
        for s, c in enumerate(counts)
    ]
    layout = mcore.Layout(layout_string(symbols), P)
    assert layout.virtual_pipeline_model_parallel_size == V
    layout.validate_layer_layout(n, None)
    for s, c in enumerate(counts):
        assert layout.layout[s % P][s // P].count(LayerType.decoder) == c


def _segment(pattern: str, pp: int, rank: int, vp: int) -> str:
    """Megatron-LM main's select_pipeline_segment, as read (see the module docstring)."""
    segments = pattern.split("|")
    assert len(segments) % pp == 0
    return segments[vp * pp + rank]


def test_hybrid_pattern_segments_are_the_stages():
    path = GOLDEN / "nemotron-h-8b-interleaved-p4-m8.octo"
    plan = plan_of(path)
    pattern = value(argv(megatron_args(plan).text), "--hybrid-layer-pattern")
    spec_body = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"  # nemotron-h-8b
    assert pattern.replace("|", "") == spec_body
    for s, stage in enumerate(plan.stages):
        expected = stage.symbols.strip("[]")
        assert _segment(pattern, 4, s % 4, s // 4) == expected
    assert "--num-virtual-stages-per-pipeline-rank" not in megatron_args(plan).text


def test_hybrid_older_form_cut_by_megatron_core_0_16(mcore):
    """The 0.16 form in the comment, run through megatron-core 0.16.1's MambaStack stage
    selection for each rank, gives the plan's stages."""
    plan = plan_of(GOLDEN / "nemotron-h-56b-tp8-p8-dp2.octo")
    comment = next(
        line
        for line in megatron_args(plan).text.splitlines()
        if "--hybrid-override-pattern" in line
    )
    words = shlex.split(comment.split("there, ", 1)[1].rsplit(" cuts", 1)[0])
    old = dict(zip(words[::2], words[1::2], strict=True))
    pattern = old["--hybrid-override-pattern"]
    layers = mcore.allocation.allocate_layers(len(pattern), 0.0, 0.0, pattern)
    first = old.get("--decoder-first-pipeline-num-layers")
    last = old.get("--decoder-last-pipeline-num-layers")
    config = SimpleNamespace(
        num_layers=len(pattern),
        virtual_pipeline_model_parallel_size=None,
        num_layers_in_first_pipeline_stage=first and int(first),
        num_layers_in_last_pipeline_stage=last and int(last),
    )
    for rank in range(plan.devices):
        stack = SimpleNamespace(
            config=config,
            pp_group=SimpleNamespace(rank=lambda rank=rank: rank, size=lambda: plan.devices),
        )
        _, chosen = mcore.block.MambaStack._select_layers_for_pipeline_parallel(stack, layers)
        assert "".join(chosen) == plan.stages[rank].symbols.strip("[]")


def _megatron_order(mcore, P: int, M: int, V: int, rank: int) -> list[tuple[str, int, int]]:
    """Rank `rank`'s compute order in megatron-core's 1F1B (V = 1) or interleaved 1F1B: its
    schedule table (get_schedule_table, groups of P), its warm-up count (the formula of
    get_pp_rank_microbatches), then one forward and one backward per step; backwards take the
    chunks in reverse and each chunk's micro-batches in order."""
    table = mcore.schedules.get_schedule_table(M, V, P)
    total = M * V
    warm = min((P - rank - 1) * (2 if V > 1 else 1) + (V - 1) * P, total)
    done = [0] * V
    fwd = [("F", c * P + rank, m) for m, c in table]

    def bwd(k: int):
        c = V - 1 - table[k][1]
        m = [mb for mb, ch in table if ch == c][done[c]]
        done[c] += 1
        return ("BW", c * P + rank, m)

    order = fwd[:warm]
    for k in range(total - warm):
        order += [fwd[warm + k], bwd(k)]
    return order + [bwd(k) for k in range(total - warm, total)]


@pytest.mark.parametrize(("P", "M", "V"), [(4, 8, 1), (4, 3, 1), (4, 8, 2), (2, 6, 3), (3, 9, 2)])
def test_octodsl_orders_are_megatron_cores(mcore, P, M, V):
    """What makes the output say "the plan's order exactly"."""
    name = "1f1b" if V == 1 else "interleaved"
    orders = phased_schedule(name, P, M, V if V > 1 else None).orders()[0]
    for rank in range(P):
        ours = [(op.kind.value, op.stage, op.mb) for slot in orders[rank] for op in slot.ops]
        assert ours == _megatron_order(mcore, P, M, V, rank)


def test_other_orders_are_named_with_the_nearest_schedule():
    export = megatron_args(_with_model(generate("zb-h1", 4, 8), "nemotron-h-8b"))
    assert any(
        "(it splits backwards into B and W) has no Megatron equivalent: Megatron runs its 1F1B" in w
        for w in export.warnings
    )
    assert "# WARNING: the plan's order" in export.text
    gpipe = megatron_args(_with_model(generate("gpipe", 4, 8), "nemotron-h-8b"))
    assert any("has no Megatron equivalent" in w for w in gpipe.warnings)


def test_interleaved_groups_other_than_p_are_named():
    export = megatron_args(_with_model(generate("interleaved", 4, 10, chunks=2), "nemotron-h-8b"))
    assert any(
        "groups of 5 micro-batches" in w and "microbatch_group_size_per_vp_stage = 5" in w
        for w in export.warnings
    )


def _with_model(plan, model: str):
    """The plan with the model's layers cut evenly into its stages (an abstract plan in)."""
    from octodsl.models import load_model
    from octodsl.partition import equal_layers
    from octodsl.plan import Stage

    pattern = load_model(model).pattern
    plan.header = plan.header.model_copy(update={"model": model})
    plan.stages = [
        Stage(a, b, pattern[a : b + 1]) for a, b in equal_layers(len(pattern), plan.num_stages)
    ]
    return plan


# -- what Megatron cannot express ---------------------------------------------------------------


def test_v_placement_is_refused():
    with pytest.raises(ExportError, match="placement is a V") as e:
        megatron_args(_with_model(generate("zb-v", 4, 8), "nemotron-h-8b"))
    assert e.value.exit_code == 1


def test_abstract_plan_and_plan_without_model_are_refused():
    with pytest.raises(ExportError, match="the plan names no model"):
        megatron_args(generate("1f1b", 4, 8))
    plan = generate("1f1b", 4, 8)
    plan.header = plan.header.model_copy(update={"model": "llama3-8b"})
    with pytest.raises(ExportError, match=r"stages name no layers \(`stages 4`\)"):
        megatron_args(plan)


def test_a_cut_inside_a_transformer_layer_is_refused():
    plan = generate("1f1b", 4, 8, model="llama3-8b")  # balanced time cuts after an attention
    with pytest.raises(ExportError, match="between whole transformer layers only"):
        megatron_args(plan)


def test_mamba1_is_refused():
    with pytest.raises(ExportError, match="Mamba1"):
        megatron_args(_with_model(generate("1f1b", 4, 8), "jamba-v0.1"))


def test_interleaved_with_fewer_microbatches_than_ranks_is_refused():
    plan = _with_model(generate("interleaved", 4, 4, chunks=2), "nemotron-h-8b")
    plan.header = plan.header.model_copy(update={"microbatches": 3})
    with pytest.raises(ExportError, match="at least as many micro-batches as pipeline ranks"):
        megatron_args(plan)


def test_recompute_mapping():
    plan = _with_model(generate("1f1b", 4, 8), "nemotron-h-8b")
    from octodsl.plan import Recompute

    for s in plan.stages:
        s.recompute = Recompute.SELECTIVE
    args = argv(megatron_args(plan).text)
    assert value(args, "--recompute-granularity") == "selective"
    plan.stages[0].recompute = Recompute.NONE
    export = megatron_args(plan)
    assert "--recompute-granularity" not in argv(export.text)
    assert any("one recompute setting to every stage" in w for w in export.warnings)


def test_qwen3_next_layout_and_linear_attention():
    plan = _with_model(generate("1f1b", 2, 4), "qwen3-next-80b")  # 98 layers: even halves
    args = argv(megatron_args(plan).text)
    assert value(args, "--pipeline-model-parallel-layout") == "Et*24|t*24L"
    assert value(args, "--experimental-attention-variant") == "gated_delta_net"
    assert value(args, "--linear-attention-freq") == "4"


def test_ep_becomes_the_expert_model_parallel_size():
    """The header's ep is Megatron's --expert-model-parallel-size, with the alltoall token
    dispatcher octodsl costs; a plan without ep names neither."""
    plan = generate("1f1b", 4, 8, model="qwen3-next-80b", partition="megatron", mesh={"dp": 8})
    args = argv(megatron_args(plan).text)
    assert "--expert-model-parallel-size" not in args
    assert "--moe-token-dispatcher-type" not in args
    ep = generate(
        "1f1b", 4, 8, model="qwen3-next-80b", partition="megatron", mesh={"dp": 8, "ep": 4}
    )
    args = argv(megatron_args(ep).text)
    assert value(args, "--expert-model-parallel-size") == "4"
    assert value(args, "--moe-token-dispatcher-type") == "alltoall"
    assert value(args, "--global-batch-size") == str(8 * 8)  # ep is carved from dp: no change
