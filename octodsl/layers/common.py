"""Pieces the layers share: initialisation, the feed-forward block, causal convolution."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .recompute import recomputable
from .tensor_parallel import TpGroup, column_parallel, row_parallel

INIT_STD = 0.02
"""Standard deviation of the normal init of projection weights."""


def linear(n_in: int, n_out: int, bias: bool = False) -> nn.Linear:
    """A Linear with the small normal init LLMs use (nn.Linear's default is for narrow nets)."""
    layer = nn.Linear(n_in, n_out, bias=bias)
    nn.init.normal_(layer.weight, std=INIT_STD)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


def activate(hidden: torch.Tensor, activation: str) -> torch.Tensor:
    """The feed-forward nonlinearity: SwiGLU on [gate | up] halves, squared ReLU, or GELU (its
    tanh form, as GPT-2/3 and Megatron-LM's fused bias-GELU)."""
    if activation == "swiglu":
        gate, up = hidden.chunk(2, dim=-1)
        return F.silu(gate) * up
    if activation == "gelu":
        return F.gelu(hidden, approximate="tanh")
    return torch.relu(hidden).square()


def ffn_width(ffn: int, activation: str) -> int:
    """Width of the first projection: SwiGLU projects to gate and up at once."""
    return 2 * ffn if activation == "swiglu" else ffn


class FeedForward(nn.Module):
    """h -> F -> h feed-forward block without norm or residual (dense MLP, shared expert)."""

    def __init__(self, hidden: int, ffn: int, activation: str):
        super().__init__()
        self.activation = activation
        self.up = linear(hidden, ffn_width(ffn, activation))
        self.down = linear(ffn, hidden)

    def shard(self, tp: TpGroup) -> None:
        """Keep this rank's 1/tp of the inner size: the up projection column-parallel (each
        SwiGLU half), the down projection row-parallel (its output is then a partial sum)."""
        if tp.size > 1:
            up = self.up.out_features
            column_parallel(self.up, tp, [up // 2] * 2 if self.activation == "swiglu" else None)
            row_parallel(self.down, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # selective recompute drops the activation function's output
        return self.down(recomputable(activate, self.up(x), self.activation))


def causal_conv(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """Depthwise causal convolution over the sequence of x [batch, seq, channels]; `conv` is
    padded by width - 1 on both sides, so keeping the first `seq` outputs makes it causal."""
    return conv(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)


def conv_silu(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """SiLU of the causal convolution of x (the Mamba mixers')."""
    return F.silu(causal_conv(conv, x))


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least fp32: scans, router softmax and the loss need the range and precision."""
    return torch.promote_types(dtype, torch.float32)
