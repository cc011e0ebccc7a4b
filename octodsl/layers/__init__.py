"""PyTorch implementations of every layer kind (CPU and CUDA), built from a model spec.

Between layers flows one tensor [batch, seq, hidden]; the embedding takes token ids; the LM head
returns logits and `lm_loss(logits, labels)` is the loss (DeepSpeed's `loss_fn`). MoE layers
feed their load-balancing loss into the gradients themselves (see `moe`). `split_backward` splits
any module's backward into B (input gradients) and W (weight gradients): the executor runs it,
the profiler times it.
"""

from .attention import Attention
from .build import (
    TORCH_DTYPES,
    LayerFactory,
    TiedHead,
    build_layers,
    layer_factories,
    pipeline_specs,
)
from .embedding import Embedding, LMHead, TiedEmbeddingHead, lm_loss, tied_head_forward
from .gated_deltanet import GatedDeltaNet
from .mamba1 import Mamba1, selective_scan
from .mamba2 import Mamba2, ssd_scan
from .mlp import MLP
from .moe import MoE, aux_loss_scale, set_aux_loss_scale

__all__ = [
    "TORCH_DTYPES",
    "Attention",
    "Embedding",
    "GatedDeltaNet",
    "LayerFactory",
    "LMHead",
    "Mamba1",
    "Mamba2",
    "MLP",
    "MoE",
    "TiedEmbeddingHead",
    "TiedHead",
    "aux_loss_scale",
    "build_layers",
    "layer_factories",
    "lm_loss",
    "pipeline_specs",
    "selective_scan",
    "set_aux_loss_scale",
    "ssd_scan",
    "tied_head_forward",
]
