"""The model spec: an ordered list of atomic sub-layers with their dimensions, plus the shape of
one micro-batch (sequence length, sequences per micro-batch), the dtype and the vocabulary.

Every layer except the embedding is pre-normed (RMSNorm) and residual: y = x + f(norm(x)); the
LM head layer holds the final norm. All layers but the embedding take and return one
[batch, seq, hidden] tensor. Parameter counts here match the torch layers in `octodsl.layers`.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .. import limits
from ..inputs import kind_of
from .pattern import KIND_SYMBOL, LAYER_KINDS, SYMBOL_KIND, normalize_pattern

Dtype = Literal["bf16", "fp16", "fp32"]
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}
"""Bytes per element of each dtype."""


Activation = Literal["swiglu", "relu2", "gelu"]

Width = Annotated[int, Field(ge=1, le=limits.MAX_WIDTH)]
"""A model's or a layer's dimension (hidden, heads, ffn, ...): bounded, so that no typo makes
a cost model of 10^13-wide matrices."""

DEFAULT_IMBALANCE = 1.25
"""`MoEConfig.imbalance` unless a spec says: a capacity factor Switch Transformer trains with
(Fedus et al. 2022, whose Table 1 compares 1.0, 1.25 and 2.0; a capacity is the most tokens an expert takes, as a
multiple of the mean, and dropping few tokens at 1.25 puts the busiest expert near it). One rank
of an ep group pools E / ep experts, so its excess is at most its busiest expert's: a round,
stated figure, not a measurement of any model here; set the spec's `imbalance` from a run's
router statistics (max over mean tokens per ep rank) where you have them."""


def _ffn_matrices(activation: str) -> int:
    """Weight matrices of an h x F feed-forward block: SwiGLU has gate, up and down."""
    return 3 if activation == "swiglu" else 2


class LayerConfig(BaseModel):
    """Base of the per-kind layer configurations; `hidden` is the model's."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    kind: str

    @property
    def symbol(self) -> str:
        """This layer's pattern symbol."""
        return KIND_SYMBOL[self.kind]

    def params(self, hidden: int, vocab: int, tied: bool) -> int:
        """Trainable parameters of this layer (its norm included)."""
        raise NotImplementedError

    def active_params(self, hidden: int, vocab: int, tied: bool) -> int:
        """Parameters used per token (differs from `params` for MoE only)."""
        return self.params(hidden, vocab, tied)


class EmbeddingConfig(LayerConfig):
    """Token embedding (layer 0); its input is token ids."""

    kind: Literal["embedding"] = "embedding"

    def params(self, hidden, vocab, tied):
        return vocab * hidden


class AttentionConfig(LayerConfig):
    """Causal self-attention with grouped-query heads."""

    kind: Literal["attention"] = "attention"
    heads: Width
    """Query heads."""
    kv_heads: Width
    """Key/value heads (GQA groups); divides `heads`."""
    head_dim: Width
    rope_theta: float | None = None
    """Rotary position embedding base; None for no positional encoding (Nemotron-H, Jamba)."""
    output_gate: bool = False
    """Sigmoid gate on the attention output, projected with the queries (Qwen3-Next)."""
    flash: bool = True
    """A fused attention kernel (FlashAttention, cuDNN's): the s x s scores never reach memory.
    false: they are written, softmaxed and read back (Megatron-LM's fused softmax, before
    FlashAttention in 2022); a cost-model setting, the torch layers run
    `scaled_dot_product_attention` either way."""

    @model_validator(mode="after")
    def _check(self):
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        return self

    @property
    def q_out(self) -> int:
        """Width of the query projection (twice the query width with an output gate)."""
        return self.heads * self.head_dim * (2 if self.output_gate else 1)

    @property
    def kv_out(self) -> int:
        return 2 * self.kv_heads * self.head_dim

    def params(self, hidden, vocab, tied):
        return hidden + hidden * (self.q_out + self.kv_out) + self.heads * self.head_dim * hidden


class MLPConfig(LayerConfig):
    """Dense feed-forward block."""

    kind: Literal["mlp"] = "mlp"
    ffn: Width
    """Intermediate size F."""
    activation: Activation = "swiglu"
    """`swiglu` (gate, up, down), `relu2` (squared ReLU, up and down) or `gelu` (GPT-3's, up
    and down)."""

    def params(self, hidden, vocab, tied):
        return hidden + _ffn_matrices(self.activation) * hidden * self.ffn


class MoEConfig(LayerConfig):
    """Token-choice top-k mixture of experts, dropless, with an optional shared expert."""

    kind: Literal["moe"] = "moe"
    experts: Width
    top_k: Width
    expert_ffn: Width
    """Intermediate size of one expert."""
    shared_ffn: Annotated[int, Field(ge=0, le=limits.MAX_WIDTH)] = 0
    """Intermediate size of the shared expert every token goes through; 0 for none."""
    activation: Activation = "swiglu"
    aux_loss_coef: float = Field(default=0.01, ge=0)
    """Weight of the load-balancing loss (Switch Transformer form)."""
    imbalance: float = Field(default=DEFAULT_IMBALANCE, ge=1.0, le=limits.MAX_DP)
    """Under expert parallelism, the rows the busiest rank of an ep group receives over the
    mean (max over mean tokens per rank): every rank waits for it at the combine, so the
    all-to-alls and the expert GEMMs are costed at its load (`octodsl.models.ep`). A property
    of the router's balancing, so it lives with `aux_loss_coef`; no effect at ep 1."""

    @model_validator(mode="after")
    def _check(self):
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds experts ({self.experts})")
        return self

    def _expert_params(self, hidden: int) -> int:
        return _ffn_matrices(self.activation) * hidden * self.expert_ffn

    def routed_params(self, hidden: int) -> int:
        """Parameters of the routed experts (all of them; not the router, norm or shared
        expert): what expert parallelism divides."""
        return self.experts * self._expert_params(hidden)

    def params(self, hidden, vocab, tied):
        shared = _ffn_matrices(self.activation) * hidden * self.shared_ffn
        return hidden + hidden * self.experts + self.experts * self._expert_params(hidden) + shared

    def active_params(self, hidden, vocab, tied):
        return self.params(hidden, vocab, tied) - (self.experts - self.top_k) * self._expert_params(
            hidden
        )


class Mamba2Config(LayerConfig):
    """Mamba2 mixer (SSD): multi-head scalar-decay SSM, B and C shared within groups."""

    kind: Literal["mamba2"] = "mamba2"
    heads: Width
    head_dim: Width
    groups: Width
    """B/C groups; divides `heads`."""
    state: Width
    """SSM state size N."""
    conv: Width = 4
    """Depthwise causal convolution width."""
    chunk: Width = 256
    """Chunk length of the SSD scan."""

    @model_validator(mode="after")
    def _check(self):
        if self.heads % self.groups:
            raise ValueError(f"heads ({self.heads}) must be a multiple of groups ({self.groups})")
        return self

    @property
    def inner(self) -> int:
        """d_in = heads x head_dim (expand x hidden)."""
        return self.heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        """Channels through the convolution: x, B and C."""
        return self.inner + 2 * self.groups * self.state

    @property
    def in_proj_out(self) -> int:
        """Input projection width: z, x, B, C and one dt per head."""
        return self.inner + self.conv_channels + self.heads

    def params(self, hidden, vocab, tied):
        return (
            hidden
            + hidden * self.in_proj_out
            + self.conv_channels * (self.conv + 1)
            + 3 * self.heads
            + self.inner
            + self.inner * hidden
        )


class Mamba1Config(LayerConfig):
    """Mamba1 mixer: selective scan with a per-channel diagonal state."""

    kind: Literal["mamba1"] = "mamba1"
    inner: Width
    """d_in (expand x hidden)."""
    state: Width = 16
    conv: Width = 4
    dt_rank: Width
    inner_norms: bool = False
    """RMSNorms on dt, B and C after the x projection (Jamba)."""

    def params(self, hidden, vocab, tied):
        norms = self.dt_rank + 2 * self.state if self.inner_norms else 0
        return (
            hidden
            + hidden * 2 * self.inner
            + self.inner * (self.conv + 1)
            + self.inner * (self.dt_rank + 2 * self.state)
            + (self.dt_rank + 1) * self.inner
            + self.inner * self.state
            + self.inner
            + self.inner * hidden
            + norms
        )


class GatedDeltaNetConfig(LayerConfig):
    """Gated DeltaNet linear attention (Qwen3-Next); torch layer: octodsl.layers.gated_deltanet."""

    kind: Literal["gated_deltanet"] = "gated_deltanet"
    key_heads: Width
    value_heads: Width
    key_head_dim: Width
    value_head_dim: Width
    conv: Width = 4
    chunk: Width = 64

    @property
    def key_dim(self) -> int:
        return self.key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.value_heads * self.value_head_dim

    @property
    def in_proj_out(self) -> int:
        """q, k, v, output gate z, and per value head a decay and a beta."""
        return 2 * self.key_dim + 2 * self.value_dim + 2 * self.value_heads

    @property
    def conv_channels(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def params(self, hidden, vocab, tied):
        return (
            hidden
            + hidden * self.in_proj_out
            + self.conv_channels * self.conv
            + 2 * self.value_heads
            + self.value_head_dim
            + self.value_dim * hidden
        )


class LMHeadLossConfig(LayerConfig):
    """Final norm, LM head projection and cross-entropy (the last layer)."""

    kind: Literal["lm_head_loss"] = "lm_head_loss"

    def params(self, hidden, vocab, tied):
        return hidden + (0 if tied else vocab * hidden)


Layer = Annotated[
    EmbeddingConfig
    | AttentionConfig
    | MLPConfig
    | MoEConfig
    | Mamba2Config
    | Mamba1Config
    | GatedDeltaNetConfig
    | LMHeadLossConfig,
    Field(discriminator="kind"),
]
"""One layer's configuration, told apart by `kind`."""

_BLOCK_KINDS = tuple(k for k in LAYER_KINDS if k not in ("embedding", "lm_head_loss"))


class ModelSpec(BaseModel):
    """A model: its layers in order (embedding first, LM head + loss last) and the shape of a
    micro-batch.

    In a file, `layers` may be written as a `pattern` string (e.g. `"M-M*-"`, the `[` and `]`
    ends optional) plus one block per layer kind it uses (`mamba2: {...}`, `attention: {...}`),
    every layer of a kind then sharing that block's dimensions."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    hidden: Width
    """Width of the activation between layers."""
    vocab: Width
    seq_len: int = Field(ge=1, le=limits.MAX_SEQ_LEN)
    """Tokens per sequence."""
    microbatch_size: int = Field(default=1, ge=1, le=limits.MAX_MICROBATCH_SIZE)
    """Sequences per micro-batch."""
    dtype: Dtype = "bf16"
    """Compute and parameter dtype."""
    tie_embeddings: bool = False
    """Share the embedding matrix with the LM head."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout after the mixers' and MLPs' outputs and, with unfused attention, on the attention
    probabilities (Megatron-LM's `--hidden-dropout` and `--attention-dropout`, 0.1 in its GPT
    runs; 0 in most pre-training since). The analytical model costs its masks; the torch layers
    cannot train with it."""
    norm_eps: float = Field(default=1e-5, gt=0)
    description: str = ""
    layers: list[Layer] = Field(max_length=limits.MAX_LAYERS)

    @model_validator(mode="before")
    @classmethod
    def _expand_pattern(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "pattern" not in data:
            return data
        data = dict(data)
        if "layers" in data:
            raise ValueError("give the layers either as `pattern` or as `layers`, not both")
        pattern = data.pop("pattern")
        if not isinstance(pattern, str):
            raise ValueError(
                f'pattern: must be a string of layer symbols such as "M-M*-", '
                f"not {kind_of(pattern)}"
            )
        if len(pattern) > limits.MAX_LAYERS:
            raise ValueError(
                f"pattern: {len(pattern):,} symbols; {limits.at_most(limits.MAX_LAYERS, 'layers')}"
            )
        pattern = normalize_pattern(pattern)
        blocks = {kind: data.pop(kind) for kind in _BLOCK_KINDS if kind in data}
        for kind, block in blocks.items():
            if not isinstance(block, dict):
                raise ValueError(
                    f"{kind}: must be a mapping of the {kind} layers' dimensions "
                    f"({{field: value, ...}}), not {kind_of(block)}"
                )
        used = {SYMBOL_KIND[s] for s in pattern}
        for kind in used & set(_BLOCK_KINDS) - set(blocks):
            raise ValueError(
                f"the pattern has '{KIND_SYMBOL[kind]}' layers ({kind}) but the "
                f"spec has no `{kind}:` block with their dimensions"
            )
        for kind in set(blocks) - used:
            raise ValueError(
                f"`{kind}:` block given but the pattern has no '{KIND_SYMBOL[kind]}' layer"
            )
        data["layers"] = [
            {**blocks.get(SYMBOL_KIND[s], {}), "kind": SYMBOL_KIND[s]} for s in pattern
        ]
        return data

    @model_validator(mode="after")
    def _check_ends(self):
        kinds = [layer.kind for layer in self.layers]
        if len(kinds) < 2 or kinds[0] != "embedding" or kinds[-1] != "lm_head_loss":
            raise ValueError("the first layer must be the embedding and the last the LM head")
        if kinds.count("embedding") != 1 or kinds.count("lm_head_loss") != 1:
            raise ValueError("a model has exactly one embedding and one LM head layer")
        return self

    @property
    def pattern(self) -> str:
        """The layer-pattern string, one symbol per layer, e.g. `[M-M*-]`."""
        return "".join(layer.symbol for layer in self.layers)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch."""
        return self.microbatch_size * self.seq_len

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def layer_params(self, i: int) -> int:
        """Parameters of layer i."""
        return self.layers[i].params(self.hidden, self.vocab, self.tie_embeddings)

    def params(self) -> int:
        """Total trainable parameters (a tied embedding counted once)."""
        return sum(self.layer_params(i) for i in range(self.num_layers))

    def active_params(self) -> int:
        """Parameters each token goes through (top-k experts only)."""
        return sum(
            layer.active_params(self.hidden, self.vocab, self.tie_embeddings)
            for layer in self.layers
        )

    def kind_counts(self) -> dict[str, int]:
        """Number of layers of each kind, every kind listed (0 when absent)."""
        counts: Counter[str] = Counter(layer.kind for layer in self.layers)
        return {kind: counts.get(kind, 0) for kind in LAYER_KINDS}

    def with_shape(
        self, microbatch_size: int | None = None, seq_len: int | None = None
    ) -> ModelSpec:
        """This spec with the micro-batch size and/or sequence length replaced (None keeps)."""
        update = {
            k: v
            for k, v in (("microbatch_size", microbatch_size), ("seq_len", seq_len))
            if v is not None
        }
        return self.model_validate({**self.model_dump(), **update}) if update else self

    def compact(self) -> dict:
        """The spec as a file would write it: the pattern form when every layer of a kind has
        the same dimensions, otherwise the explicit layer list."""
        out = self.model_dump(exclude={"layers"})
        blocks: dict[str, dict] = {}
        for layer in self.layers:
            if layer.kind in _BLOCK_KINDS:
                block = layer.model_dump(exclude={"kind"})
                if blocks.setdefault(layer.kind, block) != block:
                    return self.model_dump()
        return {**out, "pattern": self.pattern, **blocks}
