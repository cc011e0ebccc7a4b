"""`octodsl models`."""

from __future__ import annotations

import json

import yaml

from octodsl.cli import main
from octodsl.models import builtin_models, load_model, parse_model


def test_models_json(capsys):
    assert main(["models", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in out] == builtin_models()
    first = out[0]
    assert first["layers"]["mamba2"] == 24 and first["layers"]["attention"] == 4
    assert first["layers"]["mlp"] == 24 and first["layers"]["moe"] == 0
    assert first["params"] == load_model("nemotron-h-8b").params()


def test_models_table(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in builtin_models():
        assert name in out
    assert "51.57B" in out and "12.11B" in out  # jamba: total and active


def test_model_show(capsys):
    assert main(["models", "nemotron-h-8b", "--json", "--seq-len", "2048"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seq_len"] == 2048 and out["device"] == "H800"
    kinds = {k["kind"]: k for k in out["kinds"]}
    assert kinds["mamba2"]["count"] == 24 and kinds["lm_head_loss"]["f"] > kinds["mlp"]["f"]
    assert main(["models", "jamba-tiny"]) == 0
    assert "mamba1" in capsys.readouterr().out


def test_model_yaml_round_trip(capsys):
    assert main(["models", "jamba-v0.1", "--yaml"]) == 0
    data = yaml.safe_load(capsys.readouterr().out)
    assert data["pattern"] == load_model("jamba-v0.1").pattern
    assert parse_model(data, "yaml") == load_model("jamba-v0.1")


def test_unknown_model(capsys):
    assert main(["models", "gpt-5"]) == 2
    assert "no built-in model or spec file 'gpt-5'" in capsys.readouterr().err


def test_models_from_a_hugging_face_config(capsys):
    from pathlib import Path

    folder = Path(__file__).parent / "hf" / "jamba-v0.1"
    assert main(["models", "--from-hf", str(folder), "--yaml"]) == 0
    spec = parse_model(yaml.safe_load(capsys.readouterr().out), "printed")
    assert spec.pattern == load_model("jamba-v0.1").pattern
    assert main(["models", f"hf:{folder}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == load_model("jamba-v0.1").params()
    assert main(["models", "jamba-v0.1", "--from-hf", str(folder)]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["models", "--from-hf", str(folder / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err
