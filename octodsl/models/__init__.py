"""Model specs: hybrid models as ordered lists of atomic sub-layers (no torch needed)."""

from .load import SpecError, builtin_models, load_model, parse_model
from .pattern import KIND_SYMBOL, LAYER_KINDS, SYMBOL_KIND, normalize_pattern
from .spec import (
    DTYPE_BYTES,
    AttentionConfig,
    EmbeddingConfig,
    GatedDeltaNetConfig,
    LayerConfig,
    LMHeadLossConfig,
    Mamba1Config,
    Mamba2Config,
    MLPConfig,
    ModelSpec,
    MoEConfig,
)

__all__ = [
    "DTYPE_BYTES",
    "KIND_SYMBOL",
    "LAYER_KINDS",
    "SYMBOL_KIND",
    "AttentionConfig",
    "EmbeddingConfig",
    "GatedDeltaNetConfig",
    "LayerConfig",
    "LMHeadLossConfig",
    "Mamba1Config",
    "Mamba2Config",
    "MLPConfig",
    "ModelSpec",
    "MoEConfig",
    "SpecError",
    "builtin_models",
    "load_model",
    "normalize_pattern",
    "parse_model",
]
