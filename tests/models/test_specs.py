"""Model specs: built-ins against the published shapes, the pattern form, files."""

from __future__ import annotations

import json

import pytest
import yaml

from octodsl.models import (
    ModelSpec,
    SpecError,
    builtin_models,
    load_model,
    normalize_pattern,
    parse_model,
)
from octodsl.models.builtin import PUBLISHED_PARAMS

NEMOTRON_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
NEMOTRON_47B = (
    "M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---"
    "M-M*-M-M-M-M-M-"
)


def counts(name: str) -> dict[str, int]:
    return {k: v for k, v in load_model(name).kind_counts().items() if v}


def test_builtin_names():
    assert builtin_models() == [
        "nemotron-h-8b",
        "nemotron-h-47b",
        "nemotron-h-56b",
        "jamba-v0.1",
        "qwen3-next-80b",
        "llama3-8b",
        "llama3-70b",
        "nemotron-h-tiny",
        "jamba-tiny",
        "qwen3-next-tiny",
    ]


def test_nemotron_patterns():
    assert load_model("nemotron-h-8b").pattern == f"[{NEMOTRON_8B}]"
    assert load_model("nemotron-h-47b").pattern == f"[{NEMOTRON_47B}]"
    edge = {"embedding": 1, "lm_head_loss": 1}
    assert counts("nemotron-h-8b") == {**edge, "mamba2": 24, "attention": 4, "mlp": 24}
    assert counts("nemotron-h-47b") == {**edge, "mamba2": 45, "attention": 5, "mlp": 48}
    assert counts("nemotron-h-56b") == {**edge, "mamba2": 54, "attention": 10, "mlp": 54}
    spec = load_model("nemotron-h-8b")
    m = spec.layers[1]
    assert (spec.hidden, m.heads, m.head_dim, m.groups, m.state, m.chunk) == (
        4096,
        128,
        64,
        8,
        128,
        256,
    )
    assert spec.layers[2].ffn == 21504 and spec.layers[2].activation == "relu2"


def test_jamba_layout():
    spec = load_model("jamba-v0.1")
    assert spec.num_layers == 66
    for i in range(32):
        mixer, mlp = spec.layers[1 + 2 * i], spec.layers[2 + 2 * i]
        assert mixer.kind == ("attention" if i % 8 == 4 else "mamba1")
        assert mlp.kind == ("moe" if i % 2 == 1 else "mlp")
    assert spec.layers[4].experts == 16 and spec.layers[4].top_k == 2


def test_qwen3_next_and_llama_layout():
    q = load_model("qwen3-next-80b")
    assert q.num_layers == 98
    assert [l.kind for l in q.layers[1:-1:2]] == [
        "attention" if (i + 1) % 4 == 0 else "gated_deltanet" for i in range(48)
    ]
    assert all(l.kind == "moe" for l in q.layers[2:-1:2])
    assert load_model("llama3-8b").pattern == "[" + "*-" * 32 + "]"
    assert load_model("llama3-70b").pattern == "[" + "*-" * 80 + "]"


@pytest.mark.parametrize("name", list(PUBLISHED_PARAMS))
def test_parameter_counts_match_published(name):
    assert load_model(name).params() == pytest.approx(PUBLISHED_PARAMS[name], rel=0.03)


def test_active_parameters():
    assert load_model("jamba-v0.1").active_params() == pytest.approx(12e9, rel=0.03)
    assert load_model("llama3-8b").active_params() == load_model("llama3-8b").params()


@pytest.mark.parametrize(
    "tiny,full",
    [
        ("nemotron-h-tiny", "nemotron-h-8b"),
        ("jamba-tiny", "jamba-v0.1"),
        ("qwen3-next-tiny", "qwen3-next-80b"),
    ],
)
def test_tiny_models_keep_the_kinds_and_proportions(tiny, full):
    t, f = load_model(tiny), load_model(full)
    assert 12 <= t.num_layers <= 24 and 128 <= t.hidden <= 512
    tc, fc = counts(tiny), counts(full)
    assert tc.keys() == fc.keys()
    for kind in tc:
        if kind not in ("embedding", "lm_head_loss"):
            assert tc[kind] / (t.num_layers - 2) == pytest.approx(
                fc[kind] / (f.num_layers - 2), abs=0.05
            )


def test_pattern_normalisation():
    assert normalize_pattern(" M- M*-\n") == "[M-M*-]"
    assert normalize_pattern("[M-]") == "[M-]"
    with pytest.raises(ValueError, match="unknown layer symbol 'x' at position 3"):
        normalize_pattern("M-x")
    with pytest.raises(ValueError, match="may only open and close"):
        normalize_pattern("M[-")


def small(**extra) -> dict:
    return {
        "name": "s",
        "hidden": 64,
        "vocab": 100,
        "seq_len": 32,
        "pattern": "M-*-",
        "mamba2": {"heads": 4, "head_dim": 32, "groups": 1, "state": 16},
        "attention": {"heads": 4, "kv_heads": 2, "head_dim": 16},
        "mlp": {"ffn": 128},
        **extra,
    }


def test_pattern_form_expands_to_layers():
    spec = parse_model(small(), "test")
    assert spec.pattern == "[M-*-]"
    assert [l.kind for l in spec.layers] == [
        "embedding",
        "mamba2",
        "mlp",
        "attention",
        "mlp",
        "lm_head_loss",
    ]
    assert spec.layers[2] == spec.layers[4]


@pytest.mark.parametrize(
    "change,message",
    [
        ({"mlp": None}, "no `mlp:` block"),
        ({"moe": {"experts": 2, "top_k": 1, "expert_ffn": 8}}, "no 'E' layer"),
        ({"layers": []}, "either as `pattern` or as `layers`"),
        ({"attention": {"heads": 3, "kv_heads": 2, "head_dim": 16}}, "multiple of kv_heads"),
        ({"seq_len": 0}, "seq_len"),
        ({"pattern": "M-Q"}, "unknown layer symbol"),
    ],
)
def test_invalid_specs(change, message):
    data = small(**change)
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(SpecError, match=message):
        parse_model(data, "test")


def test_a_blocks_bad_field_is_reported_once_for_all_its_layers():
    pattern = "*-" * 40
    data = small(
        pattern=pattern,
        attention={"heads": 4, "kv_heads": 2, "head_dim": 16, "flash": [True]},
        hidden=-1,
    )
    data.pop("mamba2")
    with pytest.raises(SpecError) as e:
        parse_model(data, "test")
    message = str(e.value)
    # the 40 attention layers are at 1, 3, 5, ...; the top-level field keeps its own place
    assert (
        "attention.flash (layers 1, 3, 5 and 37 more): Input should be a valid boolean" in message
    )
    assert "hidden: Input should be greater than or equal to 1" in message
    assert message.count("flash") == 1 and len(message) < 300


def test_explicit_layers_must_start_and_end_right():
    with pytest.raises(SpecError, match="first layer must be the embedding"):
        parse_model(
            {
                "name": "x",
                "hidden": 8,
                "vocab": 8,
                "seq_len": 8,
                "layers": [{"kind": "mlp", "ffn": 8}, {"kind": "lm_head_loss"}],
            },
            "test",
        )


def test_files_yaml_and_json(tmp_path):
    y = tmp_path / "mine.yaml"
    y.write_text(yaml.safe_dump({k: v for k, v in small().items() if k != "name"}))
    spec = load_model(str(y))
    assert spec.name == "mine" and spec.pattern == "[M-*-]"
    j = tmp_path / "mine.json"
    j.write_text(json.dumps(spec.model_dump()))
    assert load_model(str(j)) == spec
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(SpecError, match="mapping"):
        load_model(str(bad))
    with pytest.raises(SpecError, match="no built-in model or spec file"):
        load_model(str(tmp_path / "missing.yaml"))


def test_a_spec_file_is_read_again_once_changed(tmp_path):
    """A file's spec is parsed once while the file stays the same (the cluster search asks for
    it hundreds of times), and read again once it changes; a dangling link says why in one
    line."""
    y = tmp_path / "mine.yaml"
    y.write_text(yaml.safe_dump({k: v for k, v in small().items() if k != "name"}))
    first = load_model(str(y))
    assert load_model(str(y)) is first
    y.write_text(yaml.safe_dump({**small(), "hidden": 2 * small()["hidden"]}))
    again = load_model(str(y))
    assert again.hidden == 2 * first.hidden
    link = tmp_path / "gone.yaml"
    link.symlink_to(tmp_path / "nowhere.yaml")
    with pytest.raises(SpecError):
        load_model(str(link))


@pytest.mark.parametrize("name", builtin_models())
def test_compact_form_round_trips(name):
    spec = load_model(name)
    compact = spec.compact()
    assert "pattern" in compact
    assert ModelSpec.model_validate(compact) == spec


def test_shape_override_and_tied_embeddings():
    spec = load_model("nemotron-h-8b")
    other = spec.with_shape(microbatch_size=2, seq_len=1024)
    assert (other.microbatch_size, other.seq_len, other.tokens) == (2, 1024, 2048)
    assert spec.with_shape() is spec and spec.seq_len == 4096
    untied = parse_model(small(), "t")
    tied = parse_model(small(tie_embeddings=True), "t")
    assert untied.params() - tied.params() == 100 * 64
