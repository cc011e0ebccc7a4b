"""Hostile model specs and Hugging Face configs: every one is refused with one line naming the
file and the field (exit 2, as every bad input), never an internal error, a hang or a blow-up
of memory. Each case is a class of input the last round's campaign found, not one file."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal

import pytest
import yaml

from octodsl.cli import main
from octodsl.models.builtin import BUILTINS

from .test_hf import _hide_transformers

TINY = BUILTINS["nemotron-h-tiny"]


def _error(capsys, *argv: str) -> str:
    """The one line a refused command prints (exit 2, nothing on standard output)."""
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("octodsl: error: ") and captured.err.count("\n") == 1, (
        captured.err
    )
    assert "internal error" not in captured.err and "Traceback" not in captured.err
    return captured.err.removeprefix("octodsl: error: ").rstrip("\n")


def _spec(**changes) -> dict:
    return {**TINY, **changes}


SPECS = [  # (file name, its contents: a dict for YAML, or str / bytes as they are; message)
    (
        "block-list.yaml",
        _spec(mlp=[1, 2]),
        "block-list.yaml: invalid model spec: mlp: must be a mapping of the mlp layers' dimensions",
    ),
    (
        "block-int.json",
        _spec(mamba2=3),
        "block-int.json: invalid model spec: mamba2: must be a mapping of the mamba2 layers' "
        "dimensions ({field: value, ...}), not int",
    ),
    (
        "pattern-list.yaml",
        _spec(pattern=["M", "-"]),
        "pattern-list.yaml: invalid model spec: pattern: must be a string of layer symbols",
    ),
    (
        "pattern-int.yaml",
        _spec(pattern=5),
        "pattern-int.yaml: invalid model spec: pattern: must be",
    ),
    (
        "long-pattern.yaml",
        _spec(pattern="M-" * 40_000),
        "long-pattern.yaml: invalid model spec: pattern: 80,000 symbols; at most 65,536 layers",
    ),
    (
        "seq-len.yaml",
        _spec(seq_len=10**11),
        "seq-len.yaml: invalid model spec: seq_len: 100000000000 is too large: must be at most "
        "16,777,216 (docs/language.md#limits)",
    ),
    ("hidden.json", _spec(hidden=10**13), "hidden.json: invalid model spec: hidden: "),
    (
        "heads.yaml",
        _spec(attention={**TINY["attention"], "heads": 2**40}),
        "heads.yaml: invalid model spec: attention.heads (layers ",
    ),
    (
        "microbatch.yaml",
        _spec(microbatch_size=10**6),
        "microbatch.yaml: invalid model spec: "
        "microbatch_size: 1000000 is too large: must be at most 65,536",
    ),
    (
        "text-number.json",
        _spec(seq_len="abc"),
        "text-number.json: invalid model spec: seq_len: Input should be a valid integer",
    ),
    (
        "infinite.json",
        json.dumps(_spec(norm_eps=1.0))[:-1] + ', "dropout": 1e999}',
        "infinite.json: invalid model spec: dropout: Input should be a finite number",
    ),
    (
        "digits.yaml",
        "seq_len: " + "9" * 5000 + "\n",
        "digits.yaml: not valid YAML: a number of 4,300 digits or more",
    ),
    (
        "digits.json",
        '{"seq_len": ' + "9" * 5000 + "}",
        "digits.json: not valid JSON: a number of 4,300",
    ),
    ("binary.yaml", b"name: \xff\xfe\n", "binary.yaml: not UTF-8 text (byte 6 is 0xff)"),
    (
        "syntax.yaml",
        "name: x\nhidden: [1,\n",
        "syntax.yaml: not valid YAML: expected the node "
        "content, but found '<stream end>' at line 3, column 1",
    ),
    (
        "syntax.json",
        '{"name": "x",}',
        "syntax.json: not valid JSON: Expecting property name "
        "enclosed in double quotes at line 1, column 14",
    ),
    ("deep.json", "[" * 100_000 + "]" * 100_000, "deep.json: not valid JSON: nested too deep"),
    ("deep.yaml", "[" * 100_000 + "]" * 100_000, "deep.yaml: not valid YAML: nested too deep"),
    ("list.yaml", "- 1\n- 2\n", "list.yaml: a model spec is a mapping of fields, not a list"),
]


@pytest.mark.parametrize("name,content,message", SPECS, ids=[c[0] for c in SPECS])
def test_a_hostile_spec_is_one_line_naming_the_file_and_the_field(
    here, capsys, name, content, message
):
    path = here / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content) if name.endswith(".json") else yaml.safe_dump(content))
    assert _error(capsys, "models", name).startswith(message)
    assert _error(capsys, "simulate", _plan(here, capsys), "--model", name).startswith(message)


def _plan(here, capsys) -> str:
    if not (here / "plan.octo").exists():
        assert main(["gen", "1f1b", "-p", "2", "-m", "4", "-o", "plan.octo"]) == 0
        capsys.readouterr()
    return "plan.octo"


def test_the_text_false_is_false_not_true(here, capsys):
    (here / "tied.yaml").write_text(yaml.safe_dump(_spec(tie_embeddings="false")))
    assert main(["models", "tied.yaml", "--yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["tie_embeddings"] is False


def test_a_spec_wrong_in_every_layer_is_one_short_line(here, capsys):
    """20,000 layers of the wrong type are one problem said once, and a file wrong in many
    fields lists the first ten: the line stays readable (it was 1.6 MB)."""
    dims = {k: TINY[k] for k in ("hidden", "vocab", "seq_len")}
    (here / "many.yaml").write_text(yaml.safe_dump({**dims, "layers": ["a"] * 20_000}))
    assert _error(capsys, "models", "many.yaml") == (
        "many.yaml: invalid model spec: layers 0, 1, 2 and 19,997 more: Input should be a valid "
        "dictionary or object to extract fields from"
    )
    (here / "wide.yaml").write_text(yaml.safe_dump({f"extra{i}": i for i in range(50)}))
    line = _error(capsys, "models", "wide.yaml")
    assert line.endswith("; and 44 more problems") and line.count(";") == 10, line  # 54 in all


def test_a_yaml_alias_bomb_is_refused_without_expanding_it(here, capsys):
    """Each alias level repeats the one before ten times: 10^9 strings if anything walked the
    expansion. YAML shares an alias's object; the spec's check refuses the unknown field
    without walking into it (this test would run out of time or memory otherwise)."""
    levels = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        levels.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]")
    spec = yaml.safe_dump(_spec()) + "\n".join(levels) + "\n"
    (here / "bomb.yaml").write_text(spec)
    with deadline(60):
        line = _error(capsys, "models", "bomb.yaml")
    assert line.startswith("bomb.yaml: invalid model spec: a: Extra inputs are not permitted"), line


# --- Files that are not files -----------------------------------------------------------------


@pytest.fixture
def fifo(here):
    """A FIFO, and 30 s to finish the test: opening one waits for a writer forever, and a
    reader that did would hang the test run instead of failing it."""
    path = here / "fifo.yaml"
    os.mkfifo(path)
    with deadline(30):
        yield "fifo.yaml"


@contextlib.contextmanager
def deadline(seconds: int):
    """TimeoutError in the main thread after `seconds` (which interrupts a blocking open)."""

    def expire(*_):
        raise TimeoutError(f"still running after {seconds} s: a read that hangs")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("form", ["{}", "hf:{}"])
def test_a_fifo_or_a_device_is_refused_before_it_is_read(here, capsys, fifo, form):
    """Opening a FIFO would wait for a writer forever, /dev/zero never ends: both are refused
    at the stat, before any read (the test would hang otherwise)."""
    for path in (fifo, "/dev/zero"):
        assert _error(capsys, "models", form.format(path)) == (
            f"{path}: is not a regular file (a FIFO or a device cannot be read as a "
            f"{'config.json' if form.startswith('hf') else 'model spec'})"
        )


def test_an_empty_path_is_named(here, capsys):
    assert _error(capsys, "models", "").startswith("an empty name ('') names no model")
    assert _error(capsys, "models", "hf:") == "'': an empty path names no Hugging Face config.json"
    assert (
        _error(capsys, "models", "--from-hf", "")
        == "'': an empty path names no Hugging Face config.json"
    )


# --- Hugging Face configs ---------------------------------------------------------------------

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "vocab_size": 100,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
}
NEMOTRON = {
    "model_type": "nemotron_h",
    "hidden_size": 64,
    "vocab_size": 100,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "hybrid_override_pattern": "M-*-",
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "n_groups": 1,
    "ssm_state_size": 16,
}
QWEN = {
    "model_type": "qwen3_next",
    "hidden_size": 64,
    "vocab_size": 100,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "num_experts": 0,
}

CONFIGS = [  # (the config, a message both readers give, or (transformers', JSON-only's))
    ({**LLAMA, "model_type": ["llama"]}, "model_type ['llama'] is not supported"),
    ({**LLAMA, "model_type": 3}, "model_type 3 is not supported"),
    ({**LLAMA, "rope_theta": "x"}, "`rope_theta` must be a finite number, not 'x'"),
    ({**LLAMA, "rope_theta": [1]}, "`rope_theta` must be a finite number, not [1]"),
    ({**LLAMA, "rms_norm_eps": float("inf")}, "`rms_norm_eps` must be a finite number, not inf"),
    ({**LLAMA, "hidden_act": "tanh"}, "`hidden_act` 'tanh' is not supported (supported: silu)"),
    (
        {**LLAMA, "torch_dtype": "int8"},
        "`torch_dtype` 'int8' is not supported (supported: bfloat16, float16, float32)",
    ),
    (
        {**LLAMA, "tie_word_embeddings": "false"},
        (
            "transformers refuses the config: .*tie_word_embeddings",
            "`tie_word_embeddings` must be true or false, not 'false'",
        ),
    ),
    (
        {**LLAMA, "hidden_size": "64"},
        ("transformers refuses the config: .*hidden_size", "`hidden_size` must be a whole number"),
    ),
    ({**NEMOTRON, "mlp_hidden_act": "tanh"}, "`mlp_hidden_act` 'tanh' is not supported"),
    ({**NEMOTRON, "hybrid_override_pattern": 5}, "the layer pattern must be a string or a list"),
    (
        {**QWEN, "layer_types": 7},
        (
            "transformers refuses the config: .*layer_types",
            "`layer_types` must list full_attention or linear_attention",
        ),
    ),
    (
        {**QWEN, "layer_types": [{"a": 1}, []]},
        (
            "transformers refuses the config: .*layer_types",
            "`layer_types` must list full_attention",
        ),
    ),
    (
        {
            **QWEN,
            "num_experts": 2,
            "num_experts_per_tok": 1,
            "moe_intermediate_size": 8,
            "mlp_only_layers": [[0]],
        },
        (
            "transformers refuses the config: .*mlp_only_layers",
            "`mlp_only_layers` must be a list of layer numbers",
        ),
    ),
]


@pytest.mark.parametrize("config,message", CONFIGS, ids=[f"{i}" for i in range(len(CONFIGS))])
@pytest.mark.parametrize("through", ["transformers", "json"])
def test_a_hostile_hf_config_is_one_line_naming_the_file_and_the_field(
    here, capsys, monkeypatch, config, message, through
):
    if through == "json":
        _hide_transformers(monkeypatch)
    else:
        pytest.importorskip("transformers")
    # a pair: (transformers' refusal, a regular expression; the JSON reader's, text)
    if isinstance(message, tuple):
        message = message[0] if through == "transformers" else re.escape(message[1])
    else:
        message = re.escape(message)
    (here / "config.json").write_text(json.dumps(config))
    line = _error(capsys, "models", "--from-hf", "config.json")
    assert line.startswith("config.json: ") and re.search(message, line), line


_LLAMA_TEXT = json.dumps(LLAMA)[:-1]  # without its closing brace


@pytest.mark.parametrize(
    "text,message",
    [
        (_LLAMA_TEXT + ', "rope_theta": 1e999}', "`rope_theta` must be a finite number, not inf"),
        (
            _LLAMA_TEXT + ', "rope_theta": ' + "9" * 5000 + "}",
            "not valid JSON: a number of 4,300 digits or more",
        ),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON: nested too deep"),
        (b'{"model_type": "\xff"}', "not UTF-8 text (byte 16 is 0xff)"),
    ],
    ids=["infinity", "digits", "deep", "binary"],
)
def test_a_hostile_hf_file_is_one_line(here, capsys, monkeypatch, text, message):
    _hide_transformers(monkeypatch)
    path = here / "config.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    assert _error(capsys, "models", "hf:config.json") == f"config.json: {message}"
