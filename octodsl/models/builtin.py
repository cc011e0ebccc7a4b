"""Built-in model specs, written in the pattern form a spec file uses.

Dimensions follow the published configs (docs: models-and-costs.md); the `-tiny` models keep the
hybrids' layer kinds and proportions at CPU size (fp32, for real runs on a laptop-class CPU).
Sequence length 4096 and one sequence per micro-batch are defaults a plan header overrides.
"""

from __future__ import annotations

_NEMOTRON_H_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
_NEMOTRON_H_56B = (
    "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*"
    "-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
)
_NEMOTRON_H_47B = (
    "M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M"
    "---MM---M-M*-M-M-M-M-M-"
)


def _jamba_pattern(layers: int) -> str:
    """Jamba: layer i is attention when i % 8 == 4 (else Mamba1), then MoE when i is odd (else
    a dense MLP); each Jamba layer is two sub-layers, mixer then MLP."""
    return "".join(("*" if i % 8 == 4 else "m") + ("E" if i % 2 else "-") for i in range(layers))


def _qwen3_next_pattern(layers: int) -> str:
    """Qwen3-Next: full gated attention every 4th layer, Gated DeltaNet otherwise; MoE always."""
    return "".join(("*" if (i + 1) % 4 == 0 else "G") + "E" for i in range(layers))


def _llama(*, name: str, layers: int, hidden: int, ffn: int, heads: int, description: str) -> dict:
    return {
        "name": name,
        "description": description,
        "hidden": hidden,
        "vocab": 128256,
        "seq_len": 4096,
        "pattern": "*-" * layers,
        "attention": {"heads": heads, "kv_heads": 8, "head_dim": 128, "rope_theta": 500000.0},
        "mlp": {"ffn": ffn, "activation": "swiglu"},
    }


def _nemotron_h(
    *,
    name: str,
    pattern: str,
    hidden: int,
    ffn: int,
    heads: int,
    mamba_heads: int,
    state: int,
    description: str,
) -> dict:
    return {
        "name": name,
        "description": description,
        "hidden": hidden,
        "vocab": 131072,
        "seq_len": 4096,
        "pattern": pattern,
        "mamba2": {
            "heads": mamba_heads,
            "head_dim": 64,
            "groups": 8,
            "state": state,
            "conv": 4,
            "chunk": 256,
        },
        "attention": {"heads": heads, "kv_heads": 8, "head_dim": 128},
        "mlp": {"ffn": ffn, "activation": "relu2"},
    }


BUILTINS: dict[str, dict] = {
    "nemotron-h-8b": _nemotron_h(
        name="nemotron-h-8b",
        pattern=_NEMOTRON_H_8B,
        hidden=4096,
        ffn=21504,
        heads=32,
        mamba_heads=128,
        state=128,
        description="NVIDIA Nemotron-H-8B: 24 Mamba2, 4 attention, 24 squared-ReLU MLP layers",
    ),
    "nemotron-h-47b": _nemotron_h(
        name="nemotron-h-47b",
        pattern=_NEMOTRON_H_47B,
        hidden=8192,
        ffn=30720,
        heads=64,
        mamba_heads=256,
        state=256,
        description="NVIDIA Nemotron-H-47B: 45 Mamba2, 5 attention, 48 squared-ReLU MLP layers",
    ),
    "nemotron-h-56b": _nemotron_h(
        name="nemotron-h-56b",
        pattern=_NEMOTRON_H_56B,
        hidden=8192,
        ffn=32768,
        heads=64,
        mamba_heads=256,
        state=256,
        description="NVIDIA Nemotron-H-56B: 54 Mamba2, 10 attention, 54 squared-ReLU MLP layers",
    ),
    "jamba-v0.1": {
        "name": "jamba-v0.1",
        "hidden": 4096,
        "vocab": 65536,
        "seq_len": 4096,
        "description": "AI21 Jamba v0.1: 32 layers (Mamba1:attention 7:1, MoE every other layer)",
        "pattern": _jamba_pattern(32),
        "mamba1": {"inner": 8192, "state": 16, "conv": 4, "dt_rank": 256, "inner_norms": True},
        "attention": {"heads": 32, "kv_heads": 8, "head_dim": 128},
        "mlp": {"ffn": 14336, "activation": "swiglu"},
        "moe": {"experts": 16, "top_k": 2, "expert_ffn": 14336, "aux_loss_coef": 0.001},
    },
    "qwen3-next-80b": {
        "name": "qwen3-next-80b",
        "hidden": 2048,
        "vocab": 151936,
        "seq_len": 4096,
        "norm_eps": 1e-6,
        "description": "Qwen3-Next-80B-A3B: 36 Gated DeltaNet, 12 gated attention, 48 MoE "
        "(512 experts, top-10, shared expert)",
        "pattern": _qwen3_next_pattern(48),
        "gated_deltanet": {
            "key_heads": 16,
            "value_heads": 32,
            "key_head_dim": 128,
            "value_head_dim": 128,
            "conv": 4,
            "chunk": 64,
        },
        "attention": {
            "heads": 16,
            "kv_heads": 2,
            "head_dim": 256,
            "rope_theta": 10000000.0,
            "output_gate": True,
        },
        "moe": {
            "experts": 512,
            "top_k": 10,
            "expert_ffn": 512,
            "shared_ffn": 512,
            "aux_loss_coef": 0.001,
        },
    },
    "llama3-8b": _llama(
        name="llama3-8b",
        layers=32,
        hidden=4096,
        ffn=14336,
        heads=32,
        description="Meta Llama 3 8B (homogeneous control)",
    ),
    "llama3-70b": _llama(
        name="llama3-70b",
        layers=80,
        hidden=8192,
        ffn=28672,
        heads=64,
        description="Meta Llama 3 70B (homogeneous control)",
    ),
    "nemotron-h-tiny": {
        "name": "nemotron-h-tiny",
        "hidden": 256,
        "vocab": 8192,
        "seq_len": 256,
        "microbatch_size": 2,
        "dtype": "fp32",
        "description": "CPU-sized Nemotron-H: the first 22 layers of the 8B pattern",
        "pattern": _NEMOTRON_H_8B[:22],
        "mamba2": {"heads": 16, "head_dim": 32, "groups": 2, "state": 32, "conv": 4, "chunk": 64},
        "attention": {"heads": 8, "kv_heads": 2, "head_dim": 32},
        "mlp": {"ffn": 1344, "activation": "relu2"},
    },
    "jamba-tiny": {
        "name": "jamba-tiny",
        "hidden": 256,
        "vocab": 8192,
        "seq_len": 256,
        "microbatch_size": 2,
        "dtype": "fp32",
        "description": "CPU-sized Jamba: one 8-layer Jamba block (16 sub-layers)",
        "pattern": _jamba_pattern(8),
        "mamba1": {"inner": 512, "state": 16, "conv": 4, "dt_rank": 16, "inner_norms": True},
        "attention": {"heads": 8, "kv_heads": 2, "head_dim": 32},
        "mlp": {"ffn": 896, "activation": "swiglu"},
        "moe": {"experts": 16, "top_k": 2, "expert_ffn": 896, "aux_loss_coef": 0.001},
    },
    "qwen3-next-tiny": {
        "name": "qwen3-next-tiny",
        "hidden": 256,
        "vocab": 8192,
        "seq_len": 256,
        "microbatch_size": 2,
        "dtype": "fp32",
        "norm_eps": 1e-6,
        "description": "CPU-sized Qwen3-Next: two 4-layer blocks (3 DeltaNet, 1 attention, "
        "each then MoE with a shared expert)",
        "pattern": _qwen3_next_pattern(8),
        "gated_deltanet": {
            "key_heads": 2,
            "value_heads": 4,
            "key_head_dim": 64,
            "value_head_dim": 64,
            "conv": 4,
            "chunk": 64,
        },
        "attention": {
            "heads": 8,
            "kv_heads": 2,
            "head_dim": 32,
            "rope_theta": 10000000.0,
            "output_gate": True,
        },
        "moe": {
            "experts": 16,
            "top_k": 4,
            "expert_ffn": 128,
            "shared_ffn": 128,
            "aux_loss_coef": 0.001,
        },
    },
}
"""Built-in specs by name, in `octodsl models` order."""

PUBLISHED_PARAMS: dict[str, float] = {
    "nemotron-h-8b": 8e9,
    "nemotron-h-47b": 47e9,
    "nemotron-h-56b": 56e9,
    "jamba-v0.1": 52e9,
    "qwen3-next-80b": 80e9,
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9,
}
"""Total parameter counts as published (model cards, papers), for comparison."""
