"""From a model spec to torch modules: one factory per layer, usable by DeepSpeed's pipeline
(`pipeline_specs`) or directly (`build_layers`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..models.spec import ModelSpec
from .attention import Attention
from .embedding import Embedding, LMHead, TiedEmbeddingHead, tied_head_forward
from .gated_deltanet import GatedDeltaNet
from .mamba1 import Mamba1
from .mamba2 import Mamba2
from .mlp import MLP
from .moe import MoE

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
"""Spec dtype name -> torch dtype."""

_BLOCKS: dict[str, type[nn.Module]] = {
    "attention": Attention,
    "mlp": MLP,
    "moe": MoE,
    "mamba2": Mamba2,
    "mamba1": Mamba1,
    "gated_deltanet": GatedDeltaNet,
}


@dataclass(frozen=True)
class LayerFactory:
    """How to build one layer: `module(*args)`. Layers with the same `tie_key` share one module
    (tied embeddings); a layer with a `forward_fn` runs as `forward_fn(module, x)`."""

    module: type[nn.Module]
    args: tuple = ()
    tie_key: str | None = None
    forward_fn: Callable | None = field(default=None, compare=False)

    def build(self) -> nn.Module:
        return self.module(*self.args)


def layer_factories(spec: ModelSpec) -> list[LayerFactory]:
    """One factory per layer of the spec, in order. Raises NotImplementedError for layer kinds
    that have no torch implementation, and for dropout (a cost-model setting only)."""
    if spec.dropout:
        raise NotImplementedError(
            f"{spec.name} has dropout {spec.dropout:g}: octodsl's torch "
            "layers train without dropout (the analytical model costs it)"
        )
    out = []
    for layer in spec.layers:
        if layer.kind == "embedding":
            out.append(
                LayerFactory(TiedEmbeddingHead, (spec.vocab, spec.hidden, spec.norm_eps), "embed")
                if spec.tie_embeddings
                else LayerFactory(Embedding, (spec.vocab, spec.hidden))
            )
        elif layer.kind == "lm_head_loss":
            out.append(
                LayerFactory(
                    TiedEmbeddingHead,
                    (spec.vocab, spec.hidden, spec.norm_eps),
                    "embed",
                    tied_head_forward,
                )
                if spec.tie_embeddings
                else LayerFactory(LMHead, (spec.vocab, spec.hidden, spec.norm_eps))
            )
        elif layer.kind in _BLOCKS:
            out.append(LayerFactory(_BLOCKS[layer.kind], (layer, spec.hidden, spec.norm_eps)))
        else:
            raise NotImplementedError(
                f"{spec.name}: {layer.kind} layers have no torch "
                "implementation; they are costed analytically only"
            )
    return out


class TiedHead(nn.Module):
    """The LM-head position of a tied model in `build_layers`: calls the shared module's head.
    The shared module is not registered here (it already is at layer 0), so parameters are not
    listed twice."""

    def __init__(self, shared: TiedEmbeddingHead):
        super().__init__()
        self._shared = [shared]

    @property
    def shared(self) -> TiedEmbeddingHead:
        """The module shared with the embedding (owner of the parameters)."""
        return self._shared[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tied_head_forward(self.shared, x)


def build_layers(
    spec: ModelSpec,
    device: torch.device | str | None = None,
    seed: int | None = None,
    layers: range | None = None,
) -> list[nn.Module]:
    """Build the spec's layers (all, or the indices in `layers`) in the spec's dtype.

    With a seed, layer i is initialised from `seed + i` alone, so a pipeline stage builds the
    same weights as a whole-model run (DeepSpeed's `seed_layers` with `base_seed=seed` does the
    same). A tied LM head shares layer 0's module when both are built."""
    dtype = TORCH_DTYPES[spec.dtype]
    factories = layer_factories(spec)
    shared: dict[str, nn.Module] = {}
    out: list[nn.Module] = []
    for i in layers if layers is not None else range(len(factories)):
        f = factories[i]
        if f.tie_key is not None and f.tie_key in shared:
            module = shared[f.tie_key]
        else:
            if seed is not None:
                torch.manual_seed(seed + i)
            module = f.build().to(device=device, dtype=dtype)
            if f.tie_key is not None:
                shared[f.tie_key] = module
        if f.forward_fn is not None:  # only the tied LM head has one (layer_factories)
            assert isinstance(module, TiedEmbeddingHead)
            out.append(TiedHead(module))
        else:
            out.append(module)
    return out


def pipeline_specs(spec: ModelSpec) -> list:
    """The layers as DeepSpeed `LayerSpec` / `TiedLayerSpec`s for `PipelineModule(layers=...,
    loss_fn=lm_loss)`."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    return [
        TiedLayerSpec(
            f.tie_key, f.module, *f.args, forward_fn=f.forward_fn, tied_weight_attr=["weight"]
        )
        if f.tie_key is not None
        else LayerSpec(f.module, *f.args)
        for f in layer_factories(spec)
    ]
