"""Model specs from Hugging Face configs: the four families give the layer pattern and sizes of
the published models, and the parameter count transformers itself reports for a model built on
the meta device from the same config (no memory, no download)."""

import builtins
import json
import shutil
from pathlib import Path

import pytest

from octodsl.models import SpecError, load_model
from octodsl.models.hf import SUPPORTED, load_hf

CONFIGS = Path(__file__).parent / "hf"
FAMILIES = ["nemotron-h-8b", "jamba-v0.1", "qwen3-next-80b", "llama3-70b"]


def _meta_params(folder: Path) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    data = json.loads((folder / "config.json").read_text())
    cfg = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", FAMILIES)
def test_parameters_match_what_transformers_builds(name):
    spec = load_hf(CONFIGS / name)
    assert spec.params() == pytest.approx(_meta_params(CONFIGS / name), rel=0.005)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_published_configs_give_the_builtin_models(name):
    """The built-ins were written from the papers and model cards; the configs agree."""
    spec, builtin = load_hf(CONFIGS / name), load_model(name)
    assert spec.pattern == builtin.pattern
    assert spec.params() == builtin.params()
    assert (
        spec.name == name
        and load_model(f"hf:{CONFIGS / name / 'config.json'}").pattern == spec.pattern
    )


def _hide_transformers(monkeypatch):
    real = builtins.__import__

    def no_transformers(module, *args, **kwargs):
        if module.split(".")[0] == "transformers":
            raise ImportError(module)
        return real(module, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)


@pytest.fixture(params=["transformers", "json"])
def reader(request, monkeypatch):
    """Each config read both ways: through transformers' config classes, and from its JSON
    fields alone (transformers not installed)."""
    if request.param == "json":
        _hide_transformers(monkeypatch)
    else:
        pytest.importorskip("transformers")
    return request.param


@pytest.mark.parametrize("name", FAMILIES)
def test_without_transformers_the_fields_are_read_as_written(name, monkeypatch):
    with_tf = load_hf(CONFIGS / name)
    _hide_transformers(monkeypatch)
    assert load_hf(CONFIGS / name) == with_tf


def _write(tmp_path, data) -> Path:
    path = tmp_path / "config.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize(
    "data,message",
    [
        (
            {"model_type": "gpt2"},
            "model_type 'gpt2' is not supported (supported: " + ", ".join(SUPPORTED),
        ),
        ({}, "model_type None is not supported"),
        (
            "{not json",
            "config.json: not valid JSON: Expecting property name enclosed in double quotes at line 1, column 2",
        ),
        ("[1, 2]", "a config is a JSON object, not a list"),
        (
            {
                "model_type": "llama",
                "hidden_size": 64,
                "vocab_size": 10,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": True,
            },
            "must be a whole number|transformers refuses the config: .*intermediate_size",
        ),
        (
            {
                "model_type": "llama",
                "hidden_size": 64,
                "vocab_size": 10,
                "num_hidden_layers": 10**9,
                "num_attention_heads": 4,
                "intermediate_size": 8,
            },
            "num_hidden_layers` must be a whole number from 0 to 32,767",
        ),
        (
            {"model_type": "qwen3_next", "num_hidden_layers": 10**9},
            "num_hidden_layers` must be a whole number from 0 to 32,767",
        ),
        (
            {"model_type": "nemotron_h", "hybrid_override_pattern": "M" * 70000},
            "70,000 layers; at most 65,536 layers",
        ),
        (
            {
                "model_type": "nemotron_h",
                "hybrid_override_pattern": "MQ",
                "hidden_size": 8,
                "vocab_size": 8,
            },
            "cannot read the layer pattern 'MQ'",
        ),
    ],
)
def test_bad_configs_are_clear_errors(tmp_path, reader, data, message):
    with pytest.raises(SpecError, match=message.replace("(s", r"\(s").replace(")", r"\)")):
        load_hf(_write(tmp_path, data))


def test_a_huge_file_is_not_read(tmp_path):
    path = tmp_path / "config.json"
    with open(path, "wb") as f:
        f.truncate((1 << 24) + 1)
    with pytest.raises(SpecError, match="is 16,777,217 bytes; a config.json is at most 16MiB"):
        load_hf(path)


def test_a_folder_without_a_config(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_hf(tmp_path)
    with pytest.raises(SpecError, match="no such file"):
        load_model(f"hf:{tmp_path / 'missing'}")


def test_a_missing_field_is_named(tmp_path, monkeypatch):
    """transformers fills in its defaults for what a config leaves out; without it, the field
    is named."""
    _hide_transformers(monkeypatch)
    data = json.loads((CONFIGS / "jamba-v0.1" / "config.json").read_text())
    del data["intermediate_size"]
    folder = tmp_path / "j"
    folder.mkdir()
    _write(folder, data)
    with pytest.raises(SpecError, match="the config has no `intermediate_size`"):
        load_hf(folder)


def test_qwen3_next_dense_layers_and_layer_types(tmp_path, reader):
    data = json.loads((CONFIGS / "qwen3-next-80b" / "config.json").read_text())
    data.update(num_hidden_layers=4, mlp_only_layers=[0], full_attention_interval=2)
    shutil.copytree(CONFIGS / "qwen3-next-80b", tmp_path / "q")
    _write(tmp_path / "q", data)
    assert load_hf(tmp_path / "q").pattern == "[G-*EGE*E]"
