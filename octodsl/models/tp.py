"""How tensor parallelism splits each layer kind (Megatron-LM's layouts), in one place: lint
checks a plan's `tp` against it, the cost model sizes one GPU's share of each layer with it, and
the tensor-parallel torch layers build their shards from it. `SPLIT_FIELDS` is the table of
which fields each kind divides; `kv_split` is how GQA's KV heads go over the group.

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
from enum import Enum
from typing import NamedTuple

from .ep import local_routed_params
from .spec import LayerConfig, ModelSpec


class Split(Enum):
    """How tp divides one field of a layer."""

    DIVIDE = "divide"
    """size / tp on each GPU; tp must divide it."""
    KV_HEADS = "kv_heads"
    """GQA's KV heads: divided, or, when tp is a multiple of them, each replicated (`kv_split`)."""


SPLIT_FIELDS: dict[str, dict[str, Split]] = {
    "attention": {"heads": Split.DIVIDE, "kv_heads": Split.KV_HEADS},
    "mlp": {"ffn": Split.DIVIDE},
    "moe": {"expert_ffn": Split.DIVIDE, "shared_ffn": Split.DIVIDE},
    "mamba2": {"heads": Split.DIVIDE, "groups": Split.DIVIDE},
    "mamba1": {"inner": Split.DIVIDE},
    "gated_deltanet": {"key_heads": Split.DIVIDE, "value_heads": Split.DIVIDE},
}
"""The fields tp divides, per layer kind (the module's docstring says why each); every other
field, and every field of the kinds not listed (embedding, LM head: the vocabulary, split by
`local_vocab`), is whole on every GPU."""


class KvSplit(NamedTuple):
    """How a tp group of `tp` GPUs holds an attention layer's `kv_heads` KV heads."""

    per_gpu: int
    """KV heads each GPU holds: kv_heads / tp, or 1 when there are fewer than tp."""
    sharers: int
    """GPUs holding each KV head: tp / kv_heads when replicated, else 1."""

    @property
    def replicated(self) -> bool:
        return self.sharers > 1

    def first_head(self, rank: int) -> int:
        """The first KV head GPU `rank` holds (its query heads use it and the next
        `per_gpu - 1`)."""
        return rank // self.sharers * self.per_gpu


def kv_split(kv_heads: int, tp: int) -> KvSplit:
    """The KV heads one GPU of a tp group holds, and how many GPUs share each (Megatron's GQA
    layout); for a layer with no fatal problem at this tp (`layer_problems`)."""
    return KvSplit(max(kv_heads // tp, 1), max(tp // kv_heads, 1))


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


def _field_problem(kind: str, what: str, size: int, split: Split, tp: int) -> TpProblem | None:
    if size % tp == 0:
        return None
    if split is Split.DIVIDE:
        return TpProblem(kind, what, size, True, f"not divisible by tp {tp}")
    if tp % size == 0:
        return TpProblem(
            kind,
            what,
            size,
            False,
            f"each KV head replicated on {kv_split(size, tp).sharers} GPUs of the tp group",
        )
    return TpProblem(kind, what, size, True, f"neither divisible by tp {tp} nor a divisor of it")


def layer_problems(layer: LayerConfig, tp: int) -> list[TpProblem]:
    """What tp cannot split evenly in one layer."""
    if tp == 1:
        return []
    found = (
        _field_problem(layer.kind, what, getattr(layer, what), split, tp)
        for what, split in SPLIT_FIELDS.get(layer.kind, {}).items()
    )
    return [p for p in found if p is not None]


def tp_problems(spec: ModelSpec, tp: int) -> list[TpProblem]:
    """What tp cannot split evenly in the model, each distinct problem once, fatal ones first."""
    seen: dict[tuple[str, str, int], TpProblem] = {}
    for layer in spec.layers:
        for p in layer_problems(layer, tp):
            seen.setdefault((p.kind, p.what, p.size), p)
    if spec.vocab % tp:
        seen[("embedding", "vocab", spec.vocab)] = TpProblem(
            "embedding",
            "vocab",
            spec.vocab,
            False,
            f"padded to {padded_vocab(spec.vocab, tp)} ({tp} shards of "
            f"{local_vocab(spec.vocab, tp)})",
        )
    return sorted(seen.values(), key=lambda p: not p.fatal)


def padded_vocab(vocab: int, tp: int) -> int:
    """The vocabulary rounded up to a multiple of tp."""
    return -(-vocab // tp) * tp


def local_vocab(vocab: int, tp: int) -> int:
    """Vocabulary rows one GPU of a tp group holds (the padded vocabulary / tp)."""
    return padded_vocab(vocab, tp) // tp


def local_params(spec: ModelSpec, i: int, tp: int, ep: int = 1) -> int:
    """Parameters of layer i on one GPU of a tp group (replicated ones, such as norms and the
    MoE router, counted whole), and of an ep group: 1 / ep of the routed experts
    (`octodsl.models.ep.local_routed_params`)."""
    layer = local_layer(spec.layers[i], tp)
    whole = layer.params(spec.hidden, local_vocab(spec.vocab, tp), spec.tie_embeddings)
    if ep == 1:
        return whole
    return (
        whole
        - local_routed_params(layer, spec.hidden, 1)
        + local_routed_params(layer, spec.hidden, ep)
    )


def _local_size(size: int, split: Split, tp: int) -> int:
    return size // tp if split is Split.DIVIDE else kv_split(size, tp).per_gpu


def local_layer(layer: LayerConfig, tp: int) -> LayerConfig:
    """The part of `layer` one GPU of a tp group holds, as a layer of the same kind (the fields
    of `SPLIT_FIELDS` divided). The layer must have no fatal problem at this tp."""
    fields = SPLIT_FIELDS.get(layer.kind)
    if tp == 1 or not fields:
        return layer
    return layer.model_copy(
        update={
            what: _local_size(getattr(layer, what), split, tp) for what, split in fields.items()
        }
    )
