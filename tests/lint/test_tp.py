"""Lint's tensor-parallel checks: sequence parallelism without tp (E701), tp against the model's
sizes (E702 where it cannot split them, W701 where they are replicated or padded), and tp
groups that span nodes (W702, with the links' bandwidths)."""

from __future__ import annotations

import pytest

from octodsl.costs import devices
from octodsl.costs.devices import INTER_NODE_LINK, get_device
from octodsl.lint.memory import DEFAULT_DEVICE
from octodsl.models import load_model
from octodsl.models.tp import tp_problems

from .header_plans import lint

INTRA_NODE_LINK = get_device(DEFAULT_DEVICE).node_link


def codes(*entries: str) -> list[str]:
    return [d.code for d in lint(*entries)[0]]


def line_of(src: str, text: str) -> int:
    return src[: src.index(text)].count("\n") + 1


# -- E701 ----------------------------------------------------------------------------------------


def test_sequence_parallel_needs_a_tp_group():
    diags, src = lint("sequence_parallel true")
    (d,) = diags
    assert (d.code, d.is_error) == ("E701", True)
    assert d.message.startswith("sequence_parallel true with tp 1")
    assert (d.span.line, d.span.col) == (line_of(src, "sequence_parallel"), 21)
    assert codes("tp 1", "sequence_parallel true") == ["E701"]
    # off, or on with a group, or left to the default: nothing to say
    assert codes("sequence_parallel false") == []
    assert codes("tp 2", "sequence_parallel true") == []
    assert codes("tp 2") == []


# -- E703 ----------------------------------------------------------------------------------------


def test_sequence_parallelism_needs_a_sequence_tp_divides():
    diags, src = lint("tp 4", "seq_len 4094")
    (d,) = diags
    assert d.code == "E703" and "its length 4094 is not a multiple of 4" in d.message
    assert d.span.line == line_of(src, "seq_len") and "4092 or 4096" in d.hint
    assert codes("tp 4", "seq_len 4094", "sequence_parallel false") == []
    assert codes("tp 4", "seq_len 4096") == []
    assert codes("seq_len 4095") == []  # tp 1
    # the model's own sequence length when the header gives none (nemotron-h-tiny: 256)
    assert codes('model "nemotron-h-tiny"', "tp 2") == []


# -- E702 / W701 ---------------------------------------------------------------------------------


def test_every_fatal_problem_is_an_error_at_the_tp_line():
    spec = load_model("nemotron-h-8b")
    fatal = [p for p in tp_problems(spec, 3) if p.fatal]
    assert len(fatal) > 1  # mamba2 heads and groups, attention heads and KV heads
    diags, src = lint('model "nemotron-h-8b"', "tp 3")
    errors = [d for d in diags if d.code == "E702"]
    assert len(errors) == len(fatal)
    for d, p in zip(errors, fatal, strict=True):
        assert d.is_error and (d.span.line, d.span.col) == (line_of(src, "tp 3"), 6)
        assert (
            d.message
            == f"tp 3 does not split the {p.kind} {p.what} of nemotron-h-8b: {p.size} is {p.remedy}"
        )
    assert errors[0].message == (
        "tp 3 does not split the mamba2 heads of nemotron-h-8b: 128 is not divisible by tp 3"
    )
    # one hint, on the first: which tp inside a node split every size
    assert (
        errors[0].hint == "of the tp that divide gpus_per_node 8, tp 1, 2, 4 or 8 split every size"
    )
    assert [d.hint for d in errors[1:]] == [None] * (len(errors) - 1)
    # and the vocabulary (131072) padded to a multiple of 3 is a warning
    (w,) = [d for d in diags if d.code == "W701"]
    assert not w.is_error and w.message == (
        "nemotron-h-8b's embedding vocab 131072 with tp 3: padded to 131073 (3 shards of 43691)"
    )


def test_the_hint_names_only_the_tp_that_fit():
    # nemotron-h-tiny has 2 mamba2 groups: tp 4 and 8 cannot split them
    diags, _ = lint('model "nemotron-h-tiny"', "tp 4")
    errors = [d for d in diags if d.code == "E702"]
    assert [d.message for d in errors] == [
        "tp 4 does not split the mamba2 groups of nemotron-h-tiny: 2 is not divisible by tp 4"
    ]
    assert errors[0].hint == "of the tp that divide gpus_per_node 8, tp 1 or 2 split every size"
    diags, _ = lint('model "nemotron-h-tiny"', "tp 4", "gpus_per_node 6")
    hint = next(d.hint for d in diags if d.code == "E702")
    assert hint == "of the tp that divide gpus_per_node 6, tp 1 or 2 split every size"


def test_replicated_kv_heads_are_a_warning_saying_so():
    # jamba-tiny: 2 KV heads, tp 4: each replicated on 2 GPUs; nothing fatal
    diags, src = lint('model "jamba-tiny"', "tp 4")
    assert [d.code for d in diags] == ["W701"]
    (d,) = diags
    assert d.message == (
        "jamba-tiny's attention kv_heads 2 with tp 4: each KV head replicated on "
        "2 GPUs of the tp group"
    )
    assert d.span.line == line_of(src, "tp 4")
    assert codes('model "jamba-tiny"', "tp 2") == []


def test_big_models_split_cleanly_at_tp_8():
    for model in ("nemotron-h-56b", "jamba-v0.1", "llama3-70b"):
        assert codes(f'model "{model}"', "tp 8") == []
    assert codes('model "qwen3-next-80b"', "tp 8") == ["W701"]  # 2 KV heads, each on 4 GPUs


def test_a_model_that_does_not_load_is_reported_once():
    assert codes('model "no-such-model"', "tp 3") == ["E206"]


def test_without_a_model_tp_is_not_checked_against_sizes():
    assert codes("tp 3", "gpus_per_node 3") == []


# -- W702 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entries, why",
    [
        (("tp 16",), "tp 16 exceeds gpus_per_node 8"),
        (("tp 3", "dp 2"), "tp 3 does not divide gpus_per_node 8"),  # ranks 6..8: nodes 0 and 1
        (("tp 4", "gpus_per_node 6"), "tp 4 does not divide gpus_per_node 6"),
    ],
)
def test_a_tp_group_spanning_nodes_is_a_warning_with_its_cost(entries, why):
    diags, src = lint(*entries)
    (d,) = diags
    intra, inter = devices.LINKS[INTRA_NODE_LINK], devices.LINKS[INTER_NODE_LINK]
    assert (d.code, d.is_error, d.span.line) == ("W702", False, line_of(src, "tp "))
    assert d.message == (
        f"{why}: some tp groups span two nodes, so their collectives run on the "
        "inter-node link (ib-ndr: 46 GB/s) instead of NVLink (nvlink: 160 GB/s), "
        f"about {intra.bandwidth / inter.bandwidth:.1f}x slower per collective"
    )
    assert "3.5x" in d.message
    assert d.hint.startswith("tp 1, 2")


def test_the_cost_comes_from_the_links_table(monkeypatch):
    monkeypatch.setitem(devices.LINKS, INTER_NODE_LINK, devices.Link(INTER_NODE_LINK, 1e-5, 20e9))
    (d,) = lint("tp 16")[0]
    assert "(ib-ndr: 20 GB/s)" in d.message and "about 8.0x slower" in d.message


def test_tp_groups_inside_nodes_are_fine():
    assert codes("tp 8") == []
    assert codes("tp 4", "gpus_per_node 4") == []
    # tp 3 on nodes of 8 with 2 devices: ranks 0..5 all sit in node 0, no group spans
    assert codes("tp 3") == []
    assert codes("tp 3", "dp 2", "gpus_per_node 6") == []
