"""Model specs from Hugging Face `config.json` files: the architecture alone, no weights, no
network.

Four families: NemotronH (`hybrid_override_pattern`, or transformers 5's `layers_block_type`),
Jamba (`attn_layer_period/offset`, `expert_layer_period/offset`), Qwen3-Next (`layer_types` or
`full_attention_interval`, MoE on every `decoder_sparse_step`-th layer outside
`mlp_only_layers`) and Llama (uniform layers). With `transformers` installed (`pip install
octodsl[hf]`), its own config class reads the file first, so that what it fills in or renames
(defaults, legacy field names) is what the spec sees; without it, the file's fields are read as
they are and a missing one is an error naming it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .. import limits
from ..errors import OctoError
from ..inputs import kind_of, read_data
from .parse import SpecError, parse_model
from .spec import ModelSpec

MAX_CONFIG_BYTES = 1 << 24
"""A config.json is a few KB; a file past 16 MiB is not one (and is not read whole)."""

SUPPORTED = ("nemotron_h", "jamba", "qwen3_next", "llama")
"""The `model_type`s read."""

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
"""The `torch_dtype`s (`dtype` in transformers 5) read, and their spec dtype."""
_NEMOTRON_ACTIVATIONS = {
    "relu2": "relu2",
    "gelu": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_new": "gelu",
}
"""NemotronH's `mlp_hidden_act`s (its MLP is not gated: up, activation, down)."""


class HFConfigError(OctoError):
    """A config that cannot be read as a supported model; the message is for the user."""


def read_config(path: str | Path) -> dict:
    """The JSON object of a `config.json`, or of the `config.json` in folder `path`."""
    if not str(path):  # Path("") is the working folder
        raise HFConfigError("'': an empty path names no Hugging Face config.json")
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists() and not p.is_symlink():
        raise HFConfigError(
            f"{path}: no such file (a Hugging Face config.json, or a folder holding one)"
        )
    data = read_data(
        p, "config.json", max_bytes=MAX_CONFIG_BYTES, error=HFConfigError, json_file=True
    )
    if not isinstance(data, dict):
        raise HFConfigError(f"{p}: a config is a JSON object, not {kind_of(data)}")
    return data


def _through_transformers(data: dict, source: str) -> Mapping[str, Any]:
    """The config as transformers' own class reads it (defaults filled, legacy names mapped),
    or the file's fields unchanged when transformers is not installed."""
    try:
        from transformers import AutoConfig
    except ImportError:
        return data
    fields = {k: v for k, v in data.items() if k != "model_type"}
    try:
        cfg = AutoConfig.for_model(data["model_type"], **fields)
    except Exception as e:  # noqa: BLE001 -- its validators raise their own types
        raise HFConfigError(
            f"{source}: transformers refuses the config: {type(e).__name__}: "
            f"{str(e).splitlines()[-1].strip() if str(e) else e!r}"
        ) from None
    return {**data, **cfg.to_dict()}


class _Fields:
    """Config fields by name, with the error a missing or ill-typed one gets."""

    def __init__(self, data: Mapping[str, Any], source: str):
        self.data, self.source = data, source

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def count(self, key: str, default: int | None = None, high: int = limits.MAX_INT) -> int:
        value = self.data.get(key, default)
        if value is None:
            raise HFConfigError(f"{self.source}: the config has no `{key}`")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            raise HFConfigError(
                f"{self.source}: `{key}` must be a whole number from 0 to {high:,}, not {value!r}"
            )
        return value

    def layers(self) -> int:
        """`num_hidden_layers`, each of which is two of our layers (mixer, then MLP)."""
        return self.count("num_hidden_layers", high=(limits.MAX_LAYERS - 2) // 2)

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def number(self, key: str, default: float | None = None) -> float | None:
        """A finite number (JSON reads 1e999 as infinity), or `default` when absent."""
        value = self.get(key, default)
        if value is None:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise HFConfigError(
                f"{self.source}: `{key}` must be a finite number, not {value!r:.40}"
            )
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        """true or false (the text "false" is neither: it is refused, not read as true)."""
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise HFConfigError(f"{self.source}: `{key}` must be true or false, not {value!r:.40}")
        return value

    def choice(self, key: str, default: str, names: Mapping[str, str]) -> str:
        """`names`' value for the field's text: an unknown one is refused, not replaced."""
        value = self.get(key, default)
        if isinstance(value, str) and value.removeprefix("torch.") in names:
            return names[value.removeprefix("torch.")]
        raise HFConfigError(
            f"{self.source}: `{key}` {value!r:.40} is not supported (supported: {', '.join(names)})"
        )

    def whole_numbers(self, key: str) -> list[int]:
        """A list of whole numbers (layer indices), empty when absent."""
        value = self.get(key, [])
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise HFConfigError(
                f"{self.source}: `{key}` must be a list of layer numbers, not {value!r:.40}"
            )
        return value


def _attention(c: _Fields, **extra) -> dict:
    heads = c.count("num_attention_heads")
    head_dim = (
        c.count("head_dim")
        if c.has("head_dim")
        else (
            c.count("attention_head_dim")
            if c.has("attention_head_dim")
            else c.count("hidden_size") // max(heads, 1)
        )
    )
    return {
        "heads": heads,
        "kv_heads": c.count("num_key_value_heads", heads),
        "head_dim": head_dim,
        **extra,
    }


def _rope_theta(c: _Fields) -> float | None:
    if c.has("rope_theta"):
        return c.number("rope_theta")
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    return _Fields(rope, c.source).number("rope_theta") if isinstance(rope, dict) else None


_NEMOTRON_KINDS = {
    "M": "M",
    "*": "*",
    "-": "-",
    "E": "E",
    "mamba": "M",
    "linear_attention": "M",
    "attention": "*",
    "full_attention": "*",
    "mlp": "-",
    "moe": "E",
}


def _nemotron_symbols(pattern: Any, source: str) -> str:
    """Our pattern symbols of NemotronH's pattern string or layer-type list."""
    if pattern is None:
        raise HFConfigError(f"{source}: the config has no `hybrid_override_pattern`")
    if not isinstance(pattern, (str, list)):
        raise HFConfigError(
            f"{source}: the layer pattern must be a string or a list of layer "
            f"types, not {pattern!r:.40}"
        )
    if len(pattern) > limits.MAX_LAYERS - 2:
        raise HFConfigError(
            f"{source}: {len(pattern):,} layers; {limits.at_most(limits.MAX_LAYERS, 'layers')}"
        )
    try:
        return "".join(_NEMOTRON_KINDS[k] for k in pattern)
    except (KeyError, TypeError):
        raise HFConfigError(
            f"{source}: cannot read the layer pattern {pattern!r} "
            "(M, *, -, E or mamba / attention / mlp / moe)"
        ) from None


def _nemotron_h(c: _Fields) -> dict:
    symbols = _nemotron_symbols(
        c.get("hybrid_override_pattern") or c.get("layers_block_type"), c.source
    )
    act = c.choice("mlp_hidden_act", "relu2", _NEMOTRON_ACTIVATIONS)
    out: dict = {
        "pattern": symbols,
        "mamba2": {
            "heads": c.count("mamba_num_heads"),
            "head_dim": c.count("mamba_head_dim"),
            "groups": c.count("n_groups"),
            "state": c.count("ssm_state_size"),
            "conv": c.count("conv_kernel", 4),
            "chunk": c.count("chunk_size", 256),
        },
        "attention": _attention(c),
        "mlp": {"ffn": c.count("intermediate_size"), "activation": act},
        "norm_eps": c.number("layer_norm_epsilon", 1e-5),
    }
    if "E" in symbols:
        out["moe"] = {
            "experts": c.count("n_routed_experts"),
            "top_k": c.count("num_experts_per_tok"),
            "expert_ffn": c.count("moe_intermediate_size"),
            "activation": act,
            "shared_ffn": c.count("n_shared_experts", 0)
            * c.count("moe_shared_expert_intermediate_size", 0),
        }
    return _used(out, symbols)


def _used(out: dict, symbols: str) -> dict:
    """`out` without the blocks of kinds the pattern does not use (a spec refuses those)."""
    block = {
        "mamba2": "M",
        "mamba1": "m",
        "attention": "*",
        "mlp": "-",
        "moe": "E",
        "gated_deltanet": "G",
    }
    return {k: v for k, v in out.items() if k not in block or block[k] in symbols}


def _jamba(c: _Fields) -> dict:
    layers = c.layers()
    attn_p, attn_o = c.count("attn_layer_period"), c.count("attn_layer_offset")
    exp_p, exp_o = c.count("expert_layer_period"), c.count("expert_layer_offset")
    if not attn_p or not exp_p:
        raise HFConfigError(
            f"{c.source}: `attn_layer_period` and `expert_layer_period` must be at least 1"
        )
    experts = c.count("num_experts", 1)
    symbols = "".join(
        ("*" if i % attn_p == attn_o else "m")
        + ("E" if experts > 1 and i % exp_p == exp_o else "-")
        for i in range(layers)
    )
    hidden = c.count("hidden_size")
    dt_rank = c.get("mamba_dt_rank", "auto")
    out = {
        "pattern": symbols,
        "mamba1": {
            "inner": c.count("mamba_expand", 2) * hidden,
            "state": c.count("mamba_d_state", 16),
            "conv": c.count("mamba_d_conv", 4),
            "dt_rank": -(-hidden // 16) if dt_rank == "auto" else c.count("mamba_dt_rank"),
            "inner_norms": True,
        },
        "attention": _attention(c),
        "mlp": {"ffn": c.count("intermediate_size"), "activation": "swiglu"},
        "moe": {
            "experts": experts,
            "top_k": c.count("num_experts_per_tok", 1),
            "expert_ffn": c.count("intermediate_size"),
            "aux_loss_coef": c.number("router_aux_loss_coef", 0.001),
        },
        "norm_eps": c.number("rms_norm_eps", 1e-6),
    }
    return _used(out, symbols)


def _qwen3_next(c: _Fields) -> dict:
    layers = c.layers()
    types = c.get("layer_types")
    if types is None:
        interval = c.count("full_attention_interval", 4)
        types = [
            "full_attention" if (i + 1) % max(interval, 1) == 0 else "linear_attention"
            for i in range(layers)
        ]
    if (
        not isinstance(types, list)
        or len(types) != layers
        or not all(t in ("full_attention", "linear_attention") for t in types)
    ):
        raise HFConfigError(
            f"{c.source}: `layer_types` must list full_attention or "
            f"linear_attention for each of the {layers} layers"
        )
    dense = set(c.whole_numbers("mlp_only_layers"))
    step, experts = c.count("decoder_sparse_step", 1), c.count("num_experts", 0)
    moe = [experts > 0 and i not in dense and (i + 1) % max(step, 1) == 0 for i in range(layers)]
    symbols = "".join(
        ("*" if t == "full_attention" else "G") + ("E" if m else "-")
        for t, m in zip(types, moe, strict=True)
    )
    out = {
        "pattern": symbols,
        "gated_deltanet": {
            "key_heads": c.count("linear_num_key_heads"),
            "value_heads": c.count("linear_num_value_heads"),
            "key_head_dim": c.count("linear_key_head_dim"),
            "value_head_dim": c.count("linear_value_head_dim"),
            "conv": c.count("linear_conv_kernel_dim", 4),
        },
        "attention": _attention(c, rope_theta=_rope_theta(c), output_gate=True),
        "mlp": {"ffn": c.count("intermediate_size"), "activation": "swiglu"},
        "moe": {
            "experts": max(experts, 1),
            "top_k": c.count("num_experts_per_tok", 1),
            "expert_ffn": c.count("moe_intermediate_size", 0) or 1,
            "shared_ffn": c.count("shared_expert_intermediate_size", 0),
            "aux_loss_coef": c.number("router_aux_loss_coef", 0.001),
        },
        "norm_eps": c.number("rms_norm_eps", 1e-6),
    }
    return _used(out, symbols)


def _llama(c: _Fields) -> dict:
    return {
        "pattern": "*-" * c.layers(),
        "attention": _attention(c, rope_theta=_rope_theta(c)),
        "mlp": {"ffn": c.count("intermediate_size"), "activation": "swiglu"},
        "norm_eps": c.number("rms_norm_eps", 1e-5),
    }


_FAMILIES: dict[str, Callable[[_Fields], dict]] = {
    "nemotron_h": _nemotron_h,
    "jamba": _jamba,
    "qwen3_next": _qwen3_next,
    "llama": _llama,
}


def spec_fields(data: dict, source: str, name: str | None = None) -> dict:
    """The model-spec fields (octodsl.models.spec, pattern form) of a parsed config."""
    kind = data.get("model_type")
    if not isinstance(kind, str) or kind not in _FAMILIES:
        raise HFConfigError(
            f"{source}: model_type {kind!r:.40} is not supported (supported: "
            f"{', '.join(SUPPORTED)})"
        )
    # what transformers would expand first: a layer count or pattern past our limit
    if "num_hidden_layers" in data:
        _Fields(data, source).layers()
    if kind == "nemotron_h" and "hybrid_override_pattern" in data:
        _nemotron_symbols(data["hybrid_override_pattern"], source)
    c = _Fields(_through_transformers(data, source), source)
    dtype_key = "torch_dtype" if c.has("torch_dtype") else "dtype"
    if kind != "nemotron_h":  # a gated MLP: SiLU is SwiGLU; another is not what the spec costs
        c.choice("hidden_act", "silu", {"silu": "swiglu"})
    return {
        "name": name or Path(source).parent.name or kind,
        "description": f"from {source} ({kind})",
        "hidden": c.count("hidden_size"),
        "vocab": c.count("vocab_size"),
        "seq_len": 4096,
        "dtype": c.choice(dtype_key, "bfloat16", _DTYPES),
        "tie_embeddings": c.flag("tie_word_embeddings", False),
        **_FAMILIES[kind](c),
    }


def load_hf(path: str | Path, name: str | None = None) -> ModelSpec:
    """The model spec of a Hugging Face config (a config.json, or a folder holding one).
    Raises SpecError."""
    source = str(Path(path) / "config.json" if Path(path).is_dir() else path)
    try:
        fields = spec_fields(read_config(path), source, name)
    except HFConfigError as e:
        raise SpecError(str(e)) from None
    return parse_model(fields, source)
