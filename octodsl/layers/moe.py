"""Top-k mixture of experts with a load-balancing loss that reaches the gradients.

The pipeline carries one activation tensor between layers, so the auxiliary loss cannot be
returned next to it. Instead (as Megatron's MoEAuxLossAutoScaler does) the layer output is
passed through `_AuxLossGrad`, which is the identity forward and, in backward, hands the aux
loss a gradient of `aux_loss_scale()`: the parameters then get the gradient of
main loss + aux loss, exactly as if the aux loss had been added to the loss. The executor sets
the scale to whatever it scales the main loss by (1 / micro-batches when the loss is averaged
over gradient-accumulation steps, times any loss scale). The value of the last forward's aux
loss is kept in `MoE.last_aux_loss` for logging.

Tensor parallelism (Megatron's expert tensor parallelism, expert-tensor-parallel size = tp):
every rank holds every expert, with its 1/tp of each expert's inner size (and of the shared
expert's): the expert input projections column-parallel, the output projections row-parallel,
the routed and shared outputs summed by one `leave`. The router is replicated: every rank routes
every token alike (under sp the router runs on this rank's slice and the small probabilities
are all-gathered), so the dispatch is the same everywhere. A routing weight's gradient is a dot
product with the expert's output, which each rank holds a partial sum of, so `copy` sums it over
the group; from there back to the router the gradients are the same on every rank. The aux loss
is computed from the whole batch's probabilities on every rank alike and its gradient enters the
replicated routing path, which no collective sums over ranks: it is counted once (without sp
every rank's router gradient is the whole one; with sp each rank's covers its slice and the
router is marked `sequence_parallel`, its gradient summed over the group like the norm's).
`last_aux_loss` is then the same on every rank: log one rank's.

Expert parallelism (`expert_parallel`): each rank of an ep group holds experts / ep of the
experts (with tp, 1/tp of each) and routes its own tokens as at ep 1; the sorted rows go to their
experts' ranks and come back by all-to-all before the routing weights apply, so the router, the
weights and the aux loss stay this rank's own (each rank's aux loss is that of its tokens).
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.spec import MoEConfig
from . import expert_parallel as epl
from . import tensor_parallel as tpl
from .common import INIT_STD, FeedForward, activate, ffn_width, wide_dtype
from .recompute import recomputable

_aux_loss_scale = 1.0


def set_aux_loss_scale(scale: float) -> None:
    """Set the gradient the MoE load-balancing losses receive (the main loss's scale)."""
    global _aux_loss_scale
    _aux_loss_scale = float(scale)


def aux_loss_scale() -> float:
    """The gradient MoE load-balancing losses currently receive."""
    return _aux_loss_scale


class _AuxLossGrad(torch.autograd.Function):
    """Identity on `x`; gives `aux` the gradient `aux_loss_scale()` in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        ctx.aux_meta = (aux.shape, aux.dtype, aux.device)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        shape, dtype, device = ctx.aux_meta
        return grad, torch.full(shape, _aux_loss_scale, dtype=dtype, device=device)


def load_balancing_loss(probs: torch.Tensor, counts: torch.Tensor, top_k: int) -> torch.Tensor:
    """Switch Transformer loss E * sum_e f_e * P_e: f_e the fraction of routed (token, slot)
    pairs sent to expert e, P_e its mean router probability; 1 when perfectly balanced."""
    experts = probs.shape[-1]
    frac = counts.to(probs.dtype) / (probs.shape[0] * top_k)
    return experts * (frac * probs.mean(dim=0)).sum()


class MoE(nn.Module):
    """Pre-norm residual token-choice MoE: softmax router, top-k experts with renormalised
    weights, dropless dispatch, optional shared expert."""

    def __init__(self, cfg: MoEConfig, hidden: int, norm_eps: float = 1e-5):
        super().__init__()
        self.tp = tp = tpl.current()
        self.ep = ep = epl.current()
        self.cfg = cfg
        tpl.local_config(cfg, tp)  # it splits
        ep.local_experts(cfg.experts)  # so does ep
        self.norm = nn.RMSNorm(hidden, eps=norm_eps)
        self.router = nn.Linear(hidden, cfg.experts, bias=False)
        nn.init.normal_(self.router.weight, std=INIT_STD)
        width = ffn_width(cfg.expert_ffn, cfg.activation)
        self.w_in = nn.Parameter(torch.randn(cfg.experts, hidden, width) * INIT_STD)
        self.w_out = nn.Parameter(torch.randn(cfg.experts, cfg.expert_ffn, hidden) * INIT_STD)
        self.shared = (
            FeedForward(hidden, cfg.shared_ffn, cfg.activation) if cfg.shared_ffn else None
        )
        self.last_aux_loss: torch.Tensor | None = None
        if ep.size > 1:  # before tp cuts each expert
            epl.keep_local_experts(self, "w_in", ep)
            epl.keep_local_experts(self, "w_out", ep)
        if tp.size > 1:
            tpl.shard_param(self, "w_in", 2, tp, [cfg.expert_ffn] * (width // cfg.expert_ffn))
            tpl.shard_param(self, "w_out", 1, tp)
            if self.shared is not None:
                self.shared.shard(tp)
        tpl.mark_sequence_parallel(self.norm, tp)
        tpl.mark_sequence_parallel(self.router, tp)
        epl.mark_expert(self.w_in, ep)
        epl.mark_expert(self.w_out, ep)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c, tp = self.cfg, self.tp
        h = recomputable(self.norm, x)
        probs = torch.softmax(self.router(h).to(wide_dtype(h.dtype)), dim=-1)
        probs = tpl.gather(probs, tp).reshape(-1, c.experts)  # every token's, on every rank
        whole = tpl.enter(h, tp)
        y = whole.reshape(-1, x.shape[-1])
        weight, expert = probs.topk(c.top_k, dim=-1)
        weight = (weight / weight.sum(dim=-1, keepdim=True)).to(y.dtype)
        weight = tpl.copy(weight, tp)  # each rank's gradient: its share of the experts' output
        # Dispatch: sort the (token, slot) pairs by expert, run each expert on its rows.
        flat = expert.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=c.experts)
        token = order // c.top_k
        routed = epl.apply_experts(self._experts, y[token], counts, self.ep)
        routed = routed * weight.reshape(-1)[order, None]
        out = torch.zeros_like(y).index_add(0, token, routed)
        if self.shared is not None:
            out = out + self.shared(y)
        out = tpl.leave(out.view_as(whole), tp)
        aux = c.aux_loss_coef * load_balancing_loss(probs, counts, c.top_k)
        self.last_aux_loss = aux.detach()
        if c.aux_loss_coef and torch.is_grad_enabled():
            out = _AuxLossGrad.apply(out, aux)
        return x + out

    def _experts(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """This rank's experts, each on its `counts[e]` consecutive rows."""
        act = self.cfg.activation
        # unbind once: indexing w_in[e] per expert would make backward fill a full-size zero
        # gradient per expert
        w_in, w_out = self.w_in.unbind(0), self.w_out.unbind(0)
        outs = [
            recomputable(activate, part @ w_in[e], act) @ w_out[e]
            for e, part in enumerate(rows.split(counts))
            if part.shape[0]
        ]
        # no rows (an ep rank no token reached): the empty rows are the empty output, which
        # keeps the backward's all-to-all in the graph
        return torch.cat(outs) if outs else rows
