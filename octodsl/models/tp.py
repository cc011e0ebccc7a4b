"""How tensor parallelism splits each layer kind (Megatron-LM's layouts), in one place: lint
checks a plan's `tp` against it, the cost model sizes one GPU's share of each layer with it, and
the tensor-parallel torch layers build their shards from it.

What each kind splits over a tp group of t GPUs (docs/models-and-costs.md, "Tensor parallelism"):
- attention: query heads / t (column-parallel Q, K, V; row-parallel output); KV heads / t, or,
  when there are fewer KV heads than t and t is a multiple of them, each KV head replicated on
  t / kv_heads GPUs (Megatron's GQA layout);
- mlp: the intermediate size / t (column-parallel up and gate, row-parallel down);
- moe: each expert's intermediate size / t, and the shared expert's (Megatron's expert tensor
  parallelism with expert-tensor-parallel size = tp); the router is replicated;
- mamba2: heads / t and B/C groups / t (in-projection column-parallel, conv and scan on the local
  heads, out-projection row-parallel), as Megatron's hybrid models do;
- mamba1: the inner channels / t (x-projection row-parallel: its small dt, B, C output is
  all-reduced);
- gated_deltanet: key and value heads / t;
- embedding and LM head: the vocabulary / t, padded up to a multiple of t when it does not
  divide (Megatron's `make-vocab-size-divisible-by`), with a vocab-parallel cross-entropy.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import (
    AttentionConfig, GatedDeltaNetConfig, LayerConfig, Mamba1Config, Mamba2Config, MLPConfig,
    ModelSpec, MoEConfig,
)


@dataclass(frozen=True, slots=True)
class TpProblem:
    """One size of a model that a tp degree does not split evenly."""

    kind: str
    """The layer kind (or `embedding` for the vocabulary)."""
    what: str
    """The size, as the spec names it (`heads`, `kv_heads`, `ffn`, ...)."""
    size: int
    fatal: bool
    """False when it is handled anyway (`remedy` says how), True when tp cannot be used."""
    remedy: str = ""

    @property
    def message(self) -> str:
        return f"{self.kind} {self.what} {self.size}" + (f": {self.remedy}" if self.remedy else "")


def _split(kind: str, fields: dict[str, int], tp: int) -> list[TpProblem]:
    return [TpProblem(kind, what, size, True, f"not divisible by tp {tp}")
            for what, size in fields.items() if size % tp]


def layer_problems(layer: LayerConfig, tp: int) -> list[TpProblem]:
    """What tp cannot split evenly in one layer."""
    if tp == 1:
        return []
    if isinstance(layer, AttentionConfig):
        out = _split("attention", {"heads": layer.heads}, tp)
        kv = layer.kv_heads
        if kv % tp and tp % kv == 0:
            out.append(TpProblem("attention", "kv_heads", kv, False,
                                 f"each KV head replicated on {tp // kv} GPUs of the tp group"))
        elif kv % tp:
            out.append(TpProblem("attention", "kv_heads", kv, True,
                                 f"neither divisible by tp {tp} nor a divisor of it"))
        return out
    if isinstance(layer, MLPConfig):
        return _split("mlp", {"ffn": layer.ffn}, tp)
    if isinstance(layer, MoEConfig):
        return _split("moe", {"expert_ffn": layer.expert_ffn, "shared_ffn": layer.shared_ffn}, tp)
    if isinstance(layer, Mamba2Config):
        return _split("mamba2", {"heads": layer.heads, "groups": layer.groups}, tp)
    if isinstance(layer, Mamba1Config):
        return _split("mamba1", {"inner": layer.inner}, tp)
    if isinstance(layer, GatedDeltaNetConfig):
        return _split("gated_deltanet", {"key_heads": layer.key_heads,
                                         "value_heads": layer.value_heads}, tp)
    return []


def tp_problems(spec: ModelSpec, tp: int) -> list[TpProblem]:
    """What tp cannot split evenly in the model, each distinct problem once, fatal ones first."""
    seen: dict[tuple[str, str, int], TpProblem] = {}
    for layer in spec.layers:
        for p in layer_problems(layer, tp):
            seen.setdefault((p.kind, p.what, p.size), p)
    if spec.vocab % tp:
        seen[("embedding", "vocab", spec.vocab)] = TpProblem(
            "embedding", "vocab", spec.vocab, False,
            f"padded to {padded_vocab(spec.vocab, tp)} ({tp} shards of "
            f"{padded_vocab(spec.vocab, tp) // tp})")
    return sorted(seen.values(), key=lambda p: not p.fatal)


def padded_vocab(vocab: int, tp: int) -> int:
    """The vocabulary rounded up to a multiple of tp."""
    return -(-vocab // tp) * tp


def local_vocab(vocab: int, tp: int) -> int:
    """Vocabulary rows one GPU of a tp group holds (the padded vocabulary / tp)."""
    return padded_vocab(vocab, tp) // tp


def local_params(spec: ModelSpec, i: int, tp: int) -> int:
    """Parameters of layer i on one GPU of a tp group (replicated ones, such as norms and the
    MoE router, counted whole)."""
    return local_layer(spec.layers[i], tp).params(spec.hidden, local_vocab(spec.vocab, tp),
                                                  spec.tie_embeddings)


def local_layer(layer: LayerConfig, tp: int) -> LayerConfig:
    """The part of `layer` one GPU of a tp group holds, as a layer of the same kind (sizes
    divided as the module says; KV heads at least 1: replicated). The layer must have no fatal
    problem at this tp."""
    if tp == 1:
        return layer
    update: dict[str, int]
    if isinstance(layer, AttentionConfig):
        update = {"heads": layer.heads // tp, "kv_heads": max(layer.kv_heads // tp, 1)}
    elif isinstance(layer, MLPConfig):
        update = {"ffn": layer.ffn // tp}
    elif isinstance(layer, MoEConfig):
        update = {"expert_ffn": layer.expert_ffn // tp, "shared_ffn": layer.shared_ffn // tp}
    elif isinstance(layer, Mamba2Config):
        update = {"heads": layer.heads // tp, "groups": layer.groups // tp}
    elif isinstance(layer, Mamba1Config):
        update = {"inner": layer.inner // tp}
    elif isinstance(layer, GatedDeltaNetConfig):
        update = {"key_heads": layer.key_heads // tp, "value_heads": layer.value_heads // tp}
    else:
        return layer
    return layer.model_copy(update=update)
