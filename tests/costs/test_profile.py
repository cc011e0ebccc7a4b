"""Profiles: the measured costs (on a tiny model), the file format, and the resolver."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from octodsl.cli import main
from octodsl.costs.profile import (
    ProfileError,
    load_profile,
    read_profile,
    write_profile,
)
from octodsl.costs.resolve import cost_table
from octodsl.errors import OctoError
from octodsl.models import SpecError, load_model

SHAPE = {"microbatch_size": 1, "seq_len": 32}


@pytest.fixture(scope="module")
def profile():
    from octodsl.costs.profiler import profile_model

    calls = []
    spec = load_model("nemotron-h-tiny").with_shape(**SHAPE)
    prof = profile_model(
        spec,
        threads=1,
        warmup=1,
        repeats=2,
        progress=lambda done, total, label: calls.append((done, total)),
    )
    assert calls == [(0, 2), (1, 2), (2, 2)]  # one step per round over the 5 layers
    return prof


def test_profile_measures_each_distinct_layer_once(profile):
    spec = profile.model
    assert [m.kind for m in profile.layers] == [
        "embedding",
        "mamba2",
        "mlp",
        "attention",
        "lm_head_loss",
    ]
    assert sorted(i for m in profile.layers for i in m.layers) == list(range(spec.num_layers))
    assert profile.threads == 1 and profile.device == "cpu" and profile.repeats == 2
    for m in profile.layers:
        assert len(m.f_samples) == 2 and m.f > 0 and m.w > 0
        assert m.params == spec.layer_params(m.layers[0])
        assert 0 <= m.act_w <= m.act
        if m.kind != "embedding":
            assert m.b > 0
            # at least the layer's input and its normed copy are saved
            assert m.act >= 2 * spec.tokens * spec.hidden * 4
    emb = profile.layers[0]
    assert emb.act == spec.tokens * 8  # the token ids


def test_profile_measures_what_selective_recompute_drops(profile):
    spec = profile.model
    norm_out = spec.tokens * spec.hidden * 4  # fp32
    for m in profile.layers:
        if m.kind == "embedding":  # nothing to drop
            assert m.sel_act == 0
        else:  # at least the norm output (which the next projection saves), never all of it
            assert norm_out <= m.sel_act < m.act, m
        assert m.sel_f >= 0


def test_an_older_profile_without_selective_figures_still_reads(profile, tmp_path):
    data = json.loads(profile.model_dump_json())
    for m in data["layers"]:
        del m["sel_f"], m["sel_act"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert all(layer.sel_act == 0 and layer.sel_f == 0 for layer in load_profile(path).layers)


def test_profile_file_round_trip(profile, tmp_path):
    path = tmp_path / "p.json"
    write_profile(profile, path)
    assert read_profile(path) == profile
    table = load_profile(path)
    assert len(table.layers) == profile.model.num_layers
    assert table.tokens_per_microbatch == 32 and str(path) in table.source
    assert table.meta["dtype"] == "fp32" and table.meta["threads"] == 1
    mamba = next(m for m in profile.layers if m.kind == "mamba2")
    assert all(table.layers[i].f == mamba.f for i in mamba.layers)
    assert table.layers[1].static == 16 * table.layers[1].params
    assert table.layers[1].sel_act == mamba.sel_act > 0 and table.layers[1].sel_f == mamba.sel_f


def test_resolver(profile, tmp_path):
    path = tmp_path / "p.json"
    write_profile(profile, path)
    assert cost_table(profile=str(path)).layers[1].f == profile.layers[1].f
    assert cost_table(model="nemotron-h-tiny", profile=str(path), **SHAPE).meta["profile"]
    with pytest.raises(ProfileError, match="sequence length 32, the plan asks for 64"):
        cost_table(profile=str(path), seq_len=64)
    with pytest.raises(ProfileError, match="not the plan's model jamba-tiny"):
        cost_table(model="jamba-tiny", profile=str(path))
    table = cost_table(model="nemotron-h-8b", device="H100", seq_len=1024)
    assert (
        table.source == "analytical nemotron-h-8b on H100" and table.tokens_per_microbatch == 1024
    )
    with pytest.raises(OctoError, match="need a model"):
        cost_table()
    with pytest.raises(SpecError):
        cost_table(model="no-such-model")


def test_invalid_profiles(profile, tmp_path):
    data = json.loads(profile.model_dump_json())
    data["layers"] = data["layers"][:-1]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="cover each of the model's 24 layers"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="missing.json: no such profile"):
        load_profile(tmp_path / "missing.json")


def test_profile_cli(tmp_path, capsys):
    out = tmp_path / "cli.json"
    assert (
        main(
            [
                "profile",
                "--model",
                "nemotron-h-tiny",
                "--seq-len",
                "16",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert read_profile(out).model.seq_len == 16  # the file records the shape it measured
    printed = capsys.readouterr().out
    assert f"wrote {out}, measured at micro-batch size 2, sequence length 16 (32 tokens)" in printed


def test_profile_cli_qwen3_next_tiny(tmp_path):
    # its gated DeltaNet layers have a torch layer: the profile measures every kind it has
    out = tmp_path / "qwen.json"
    assert (
        main(
            [
                "profile",
                "--model",
                "qwen3-next-tiny",
                "--seq-len",
                "16",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    prof = read_profile(out)
    assert [m.kind for m in prof.layers] == [
        "embedding",
        "gated_deltanet",
        "moe",
        "attention",
        "lm_head_loss",
    ]
    assert all(m.f > 0 and m.w > 0 for m in prof.layers)


def test_lint_path_does_not_import_torch():
    # `octodsl lint` on a plan that names a model and a memory limit: it loads the model, costs
    # it and simulates the plan's memory (E501), in a fresh interpreter; importing the profile
    # and models commands must not pull torch either (they import it when run).
    plan = Path(__file__).parents[1] / "sim" / "data" / "nemotron-1f1b.octo"
    code = (
        f"import sys; from octodsl.cli import main; rc = main(['lint', {str(plan)!r}]); "
        "import octodsl.cli.models, octodsl.cli.profile; "
        "print('imported:', sorted({'torch', 'deepspeed'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "error[E501]" in out.stderr  # the memory rule ran
    assert "imported: []" in out.stdout


def test_profiler_does_not_import_the_executor():
    code = (
        "import sys, octodsl.costs.profiler; "
        "print(sorted(m for m in sys.modules if m.startswith('octodsl.deepspeed_ext')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
