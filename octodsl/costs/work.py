"""The work of each layer kind for one micro-batch, independent of the device: FLOPs by kind
of unit, bytes moved by memory-bound kernels, bytes held for the backward.

Conventions: T tokens per micro-batch, s sequence length, h hidden, e bytes per element of the
compute dtype. Each weight GEMM is kept with its shape (`Gemm`): F computes Y[m, n] = X[m, k]
W[k, n] (m the tokens), B dX = dY W^T (m x k, over n) and W dW = X^T dY (k x n, over m), each
2mnk FLOPs, so that the device can time each at its shape (`costs/gemm.py`). Weight-free
compute (attention core, scans) has all its backward in B. Memory
activations assume fused kernels (flash attention; Mamba's scan kernels keep only chunk
states), which is what a GPU training run uses. What W needs after B is taken as every GEMM's
input and output gradient (capped at what F saved).

Under tensor parallelism (tp GPUs, `octodsl.models.tp` says what each kind splits) the work is
one GPU's: the layer's own part at its local sizes (heads / tp, intermediate / tp, ...) over all
T tokens, the norm and residual over T / tp tokens with sequence parallelism (whole without),
plus the tp collectives each op runs (`Work.tp_f`, `tp_b`, `tp_w`).

FLOP counts match docs (models-and-costs.md) at s = 4096: Nemotron-H-8B Mamba2 ~228, attention
117, MLP 352, LM head 1074 MFLOP per token; SSD is counted as the chunked algorithm computes it,
2Q(GN + d_in) + 4 N d_in per token, so it depends on the chunk length Q.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from ..models.ep import busiest_share, dispatch_bytes, expert_rows
from ..models.spec import (
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
from ..models.tp import kv_split, local_layer, local_vocab

ATTENTION_BWD = 2.5
"""Flash-attention backward FLOPs over forward (five matmuls against two)."""
SCAN_BWD = 2.0
"""Scan backward work over forward (each product has two gradient products)."""
EW_BWD = 1.5
"""Elementwise backward bytes over forward (reads the saved tensor and the gradient)."""
INDEX_BYTES = 8
"""Token ids and labels are int64."""
LOSS_BYTES = 4
"""fp32, what the vocab-parallel cross-entropy computes in: its per-logit passes and its per-token
values (max, sum of exponentials, target logit), each all-reduced over the tp group."""

Collective = tuple[str, float]
"""One tensor-parallel collective: 'all-reduce', 'all-gather' or 'reduce-scatter', and the
bytes of the whole tensor it produces (all-reduce, all-gather) or reduces (reduce-scatter)."""


class Gemm(NamedTuple):
    """One weight GEMM of a forward, Y[m, n] = X[m, k] W[k, n], `batch` times (the experts of
    an MoE layer: a grouped GEMM)."""

    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    def input_grad(self) -> Gemm:
        """B's GEMM: dX[m, k] = dY[m, n] W^T."""
        return Gemm(self.m, self.k, self.n, self.batch)

    def weight_grad(self) -> Gemm:
        """W's GEMM: dW[k, n] = X^T dY, reducing over the m tokens."""
        return Gemm(self.k, self.n, self.m, self.batch)


@dataclass(frozen=True, slots=True)
class Work:
    """One layer, one micro-batch."""

    gemms: tuple[Gemm, ...] = ()
    """The weight GEMMs of F (B and W run each one's input and weight gradient)."""
    core: float = 0.0
    """Weight-free compute FLOPs of F (all of its backward goes to B)."""
    core_b: float = 0.0
    """Backward FLOPs of the weight-free compute."""
    core_unit: str = "attention"
    """Which rate the core runs at: `attention` or `scan` (matrix units), `vector`."""
    core_seq: int = 0
    """The attention core's sequence length and head dimension (its kernel's rate depends on
    them: `costs/devices.py`, `AttentionModel`)."""
    core_head_dim: int = 0
    core_gemms: tuple[Gemm, ...] = ()
    """The core's own GEMMs in F, where they are GEMMs: unfused attention's scores QK^T and
    probabilities x V, batched over sequences and heads."""
    core_gemms_b: tuple[Gemm, ...] = ()
    """Their backward (all in B: the core has no weights)."""
    core_bytes: float = 0.0
    """Bytes the core reads and writes in F (bandwidth floor of the core; twice in B)."""
    ew_f: float = 0.0
    """Bytes moved by memory-bound kernels in F."""
    ew_b: float = 0.0
    ew_w: float = 0.0
    act: float = 0.0
    """Bytes saved by F for the backward."""
    act_w: float = 0.0
    """Bytes held from B until W."""
    out: float = 0.0
    """Bytes of the output activation."""
    sel_act: float = 0.0
    """Of `act`, the bytes selective recompute drops after F (docs/models-and-costs.md)."""
    sel_core: float = 0.0
    """Fraction of the core's forward that B runs again to bring them back."""
    sel_ew: float = 0.0
    """Bytes moved by the elementwise kernels that B runs again to bring them back."""
    tp_f: tuple[Collective, ...] = ()
    """The tp collectives of F (none at tp 1)."""
    tp_b: tuple[Collective, ...] = ()
    tp_w: tuple[Collective, ...] = ()
    elements: float = 0.0
    """Activation elements the layer's per-token kernels touch on this GPU (tokens x hidden /
    tp): what the device's per-op overheads scale with (0: none, the embedding and LM head)."""
    all_to_all: tuple[float, ...] = ()
    """The expert-parallel all-to-alls of F, each the bytes the busiest rank of the ep group
    sends to (and receives from) its peers (`octodsl.models.ep`); B runs each again in reverse,
    W none (none at ep 1)."""

    @property
    def gemm(self) -> float:
        """Weight-GEMM FLOPs of F (each of B and W costs the same)."""
        return sum(g.flops for g in self.gemms)


@dataclass(frozen=True, slots=True)
class _Shape:
    tokens: int
    seq: int
    sequences: int
    hidden: int
    vocab: int
    """This GPU's rows of the (padded) vocabulary."""
    e: int
    tp: int = 1
    sp: bool = False
    dropout: bool = False
    """Whether dropout masks are drawn (ModelSpec.dropout > 0)."""
    ep: int = 1
    """Expert-parallel degree of the MoE layers (`octodsl.models.ep`)."""

    @property
    def held(self) -> float:
        """Bytes of the activation between layers as one GPU holds it: the whole, or its
        1 / tp sequence slice under sequence parallelism."""
        return self.tokens * self.hidden * self.e / (self.tp if self.sp else 1)

    def collectives(
        self,
        enter: bool = True,
        leave: bool = True,
        extra: float = 0.0,
        leave_grad_in_w: bool = False,
    ) -> dict[str, Any]:
        """The tp collectives of a layer (Megatron's f and g operators; Korthikanti et al.
        2022 for their sequence-parallel forms), as Work fields. Entering the tp region: F
        all-gathers the sequence (sp) or passes x through; B reduce-scatters or all-reduces the
        input gradient; with sp W all-gathers the input again (Megatron keeps only the slice
        and re-gathers it for the weight gradient). Leaving: F reduce-scatters or all-reduces
        the row-parallel partial sums; with sp B all-gathers the output gradient (in W for a
        layer whose backward is all weight gradient: the embedding). `extra`: bytes of a
        partial sum all-reduced inside the layer, both ways (Mamba1's x-projection)."""
        if self.tp == 1:
            return {}
        whole = float(self.tokens * self.hidden * self.e)
        f: list[Collective] = []
        b: list[Collective] = []
        w: list[Collective] = []
        if enter:
            f += [("all-gather", whole)] if self.sp else []
            b.append(("reduce-scatter", whole) if self.sp else ("all-reduce", whole))
            w += [("all-gather", whole)] if self.sp else []
        if leave:
            f.append(("reduce-scatter", whole) if self.sp else ("all-reduce", whole))
            (w if leave_grad_in_w else b).extend([("all-gather", whole)] if self.sp else [])
        if extra:
            f.append(("all-reduce", extra))
            b.append(("all-reduce", extra))
        return {"tp_f": tuple(f), "tp_b": tuple(b), "tp_w": tuple(w)}


def _block(
    s: _Shape,
    gemms: tuple[Gemm, ...],
    act: float,
    gemm_io: float,
    ew: float,
    sel_act: float = 0.0,
    sel_ew: float = 0.0,
    **core,
) -> Work:
    """A pre-norm residual layer: adds the norm and residual traffic and the norm's saved
    input; `act` is the layer's own saved bytes beyond x and norm(x), `gemm_io` the bytes of its
    GEMM inputs and output gradients beyond norm(x) and the output gradient. Selective
    recompute drops norm(x) (recomputed by reading x and writing it again) beside the layer's
    own `sel_act`, brought back by `sel_ew` bytes of elementwise work and `sel_core` of the core.
    The norm and the residual run on what the GPU holds (`_Shape.held`); `core` may carry the
    tp collectives (`_Shape.collectives`), by default one entry and one exit."""
    the = s.held
    core = {**s.collectives(), **core}
    ew_f = 5 * the + ew  # norm: read x, write; residual: read two, write one
    act = 2 * the + act
    if s.dropout:  # a one-byte mask on the output, written in F (fused with the residual), kept
        mask = the / s.e
        ew_f, act = ew_f + mask, act + mask
    return Work(
        gemms=gemms,
        ew_f=ew_f,
        ew_b=EW_BWD * ew_f,
        ew_w=2 * the,
        act=act,
        act_w=min(act, 2 * the + gemm_io),
        out=the,
        sel_act=the + sel_act,
        sel_ew=2 * the + sel_ew,
        elements=s.tokens * s.hidden / s.tp,
        **core,
    )


def _attention(c: AttentionConfig, s: _Shape) -> Work:
    if not c.flash:
        return _unfused_attention(c, s)
    T, e, h = s.tokens, s.e, s.hidden
    width = c.heads * c.head_dim
    gemms = (Gemm(T, c.q_out + c.kv_out, h), Gemm(T, h, width))  # fused QKV, output projection
    core = 2 * T * s.seq * width  # QK^T and PV, causal half
    ew = (2 * T * e * (width + c.kv_out // 2) if c.rope_theta is not None else 0) + (
        3 * T * e * width if c.output_gate else 0
    )
    act = T * e * (c.q_out + c.kv_out + width) + 4 * T * c.heads  # q, k, v, out, fp32 LSE
    # selective: the core's own saves (out, LSE), by running the flash-attention forward again
    return _block(
        s,
        gemms,
        act,
        T * e * (width + c.q_out + c.kv_out),
        ew,
        sel_act=T * e * width + 4 * T * c.heads,
        core=core,
        sel_core=1.0,
        core_b=ATTENTION_BWD * core,
        core_unit="attention",
        core_seq=s.seq,
        core_head_dim=c.head_dim,
        core_bytes=T * e * (2 * width + c.kv_out),
    )


def _unfused_attention(c: AttentionConfig, s: _Shape) -> Work:
    """Attention as Megatron-LM ran it before FlashAttention: the scores QK^T of every head, the
    causal mask and softmax fused in one kernel, dropout on the probabilities, then P x V, as
    batched GEMMs over the whole s x s (the mask is applied, not skipped). The probabilities
    (and dropout's mask and output) are kept for the backward: Korthikanti et al.'s 5as/h term;
    selective recompute drops them and runs this part again (their definition)."""
    T, e, h = s.tokens, s.e, s.hidden
    width = c.heads * c.head_dim
    gemms = (Gemm(T, c.q_out + c.kv_out, h), Gemm(T, h, width))
    batch, n, d = s.sequences * c.heads, s.seq, c.head_dim
    scores = float(batch * n * n)
    core_gemms = (Gemm(n, n, d, batch), Gemm(n, d, n, batch))  # QK^T, P V
    # dP = dO V^T, dV = P^T dO; dQ = dS K, dK = dS^T Q
    core_gemms_b = (
        Gemm(n, n, d, batch),
        Gemm(n, d, n, batch),
        Gemm(n, d, n, batch),
        Gemm(n, d, n, batch),
    )
    soft_f, soft_b = 2 * e * scores, 3 * e * scores  # read, write; read P and dP, write dS
    kept = e * scores
    if s.dropout:  # read, write, a one-byte mask; backward reads the mask and dP, writes
        soft_f, soft_b, kept = (
            soft_f + (2 * e + 1) * scores,
            soft_b + (2 * e + 1) * scores,
            kept + (e + 1) * scores,
        )
    ew = (2 * T * e * (width + c.kv_out // 2) if c.rope_theta is not None else 0) + (
        3 * T * e * width if c.output_gate else 0
    )
    act = T * e * (c.q_out + c.kv_out + width) + kept
    work = _block(
        s,
        gemms,
        act,
        T * e * (width + c.q_out + c.kv_out),
        ew + soft_f,
        sel_act=kept,
        sel_ew=soft_f,
        sel_core=1.0,
        core_gemms=core_gemms,
        core_gemms_b=core_gemms_b,
    )
    return replace(work, ew_b=work.ew_b - EW_BWD * soft_f + soft_b)


def _ffn(
    tokens: int, h: int, ffn: int, activation: str, batch: int = 1
) -> tuple[tuple[Gemm, ...], int]:
    """(the GEMMs, width of the first projection) of an h x F feed-forward over `tokens`
    tokens (`batch` experts of that many tokens each)."""
    first = 2 * ffn if activation == "swiglu" else ffn  # SwiGLU's gate and up are one GEMM
    return (Gemm(tokens, first, h, batch), Gemm(tokens, h, ffn, batch)), first


def _mlp(c: MLPConfig, s: _Shape) -> Work:
    T, e = s.tokens, s.e
    gemms, first = _ffn(T, s.hidden, c.ffn, c.activation)
    act = T * e * (first + c.ffn)
    # selective: the activation function's output, by reading the up projection's again
    return _block(
        s,
        gemms,
        act,
        act,
        T * e * (first + c.ffn),
        sel_act=T * e * c.ffn,
        sel_ew=T * e * (first + c.ffn),
    )


def _moe(c: MoEConfig, s: _Shape) -> Work:
    """Dropless top-k MoE. At ep 1 each expert gets routed / experts rows (grouped GEMMs over all
    experts); under expert parallelism (`octodsl.models.ep`) the rank's experts / ep local experts
    each get ep x routed / experts rows, times the busiest rank's share (the rank every other
    waits for), and F runs the dispatch and combine all-to-alls of the routed rows."""
    T, e, h = s.tokens, s.e, s.hidden
    routed = c.top_k * T
    local = c.experts // s.ep
    rows = expert_rows(T, c.top_k, c.experts, s.ep, c.imbalance)
    received = rows * local if s.ep > 1 else routed  # the busiest rank's rows (routed at ep 1)
    experts, first = _ffn(rows, h, c.expert_ffn, c.activation, local)
    shared, shared_first = _ffn(T, h, c.shared_ffn, c.activation) if c.shared_ffn else ((), 0)
    gemms = (Gemm(T, c.experts, h),) + experts + shared  # the router first
    expert_act = received * e * (first + c.expert_ffn) + T * e * (shared_first + c.shared_ffn)
    a2a = busiest_share(c.imbalance, s.ep) * dispatch_bytes(T, c.top_k, h, e, s.ep)
    # dispatched rows and expert outputs (for the weighted combine), fp32 router probabilities
    act = expert_act + routed * e * 2 * h + 4 * T * c.experts
    ew = 8 * T * c.experts + 4 * routed * h * e + expert_act
    # selective: the experts' activation-function outputs, from their up projections
    return _block(
        s,
        gemms,
        act,
        act,
        ew,
        sel_act=received * e * c.expert_ffn + T * e * c.shared_ffn,
        sel_ew=expert_act,
        all_to_all=(a2a, a2a) if s.ep > 1 else (),  # dispatch, combine
    )


def _chunk_states(s: _Shape, chunk: int, state_bytes_per_chunk: int) -> float:
    """fp32 states at every chunk boundary, kept by the scan kernels for their backward."""
    return 4 * s.sequences * math.ceil(s.seq / chunk) * state_bytes_per_chunk


def _mamba2(c: Mamba2Config, s: _Shape) -> Work:
    T, e, h, d = s.tokens, s.e, s.hidden, c.inner
    gn = c.groups * c.state
    gemms = (Gemm(T, c.in_proj_out, h), Gemm(T, h, d))
    core = T * (2 * c.chunk * (gn + d) + 4 * c.state * d)
    # saved: in_proj output, conv output, scan output, gated-norm output; chunk states
    states = _chunk_states(s, c.chunk, d * c.state)
    act = T * e * (c.in_proj_out + c.conv_channels + 2 * d) + states
    gemm_io = T * e * (d + c.in_proj_out + 2 * c.conv_channels)  # out_proj in, in_proj grad, conv
    ew = T * e * (4 * c.conv_channels + 4 * d)  # conv + SiLU, D skip, gate, grouped norm
    # selective: the chunk states (the scan's state-passing step again) and the conv output
    # (the conv + SiLU again)
    return _block(
        s,
        gemms,
        act,
        gemm_io,
        ew,
        sel_act=states + T * e * c.conv_channels,
        sel_ew=2 * T * e * c.conv_channels,
        sel_core=4 * c.state * d / (2 * c.chunk * (gn + d) + 4 * c.state * d),
        core=core,
        core_b=SCAN_BWD * core,
        core_unit="scan",
        core_bytes=T * e * (2 * d + 2 * gn + c.heads),
    )


def _mamba1(c: Mamba1Config, s: _Shape) -> Work:
    T, e, h, d, n, r = s.tokens, s.e, s.hidden, c.inner, c.state, c.dt_rank
    # in-projection (x | z), x-projection (dt | B | C), dt-projection, out-projection
    gemms = (Gemm(T, 2 * d, h), Gemm(T, r + 2 * n, d), Gemm(T, d, r), Gemm(T, h, d))
    core = 9 * T * d * n  # discretise, update and read out the state: elementwise
    # saved: x|z, conv output, dt|B|C, dt, scan output, gated output
    act = T * e * (6 * d + r + 2 * n)
    # inputs of x_proj, dt_proj, out_proj and the conv; gradients of in_proj, x_proj, dt_proj,
    # the conv
    gemm_io = T * e * (7 * d + 2 * r + 2 * n)
    ew = T * e * 10 * d  # conv + SiLU, softplus, D skip, gate
    # selective: the conv output and the gated output (conv + SiLU and the gate again); the
    # scan's states are never kept (the kernel recomputes them in its backward)
    return _block(
        s,
        gemms,
        act,
        gemm_io,
        ew,
        sel_act=2 * T * e * d,
        sel_ew=5 * T * e * d,
        core=core,
        core_b=SCAN_BWD * core,
        core_unit="vector",
        core_bytes=T * e * (3 * d + 2 * n),
        # the x-projection is row-parallel: its dt|B|C partial sums are all-reduced
        **s.collectives(extra=T * e * (r + 2 * n)),
    )


def _gated_deltanet(c: GatedDeltaNetConfig, s: _Shape) -> Work:
    T, e, h = s.tokens, s.e, s.hidden
    dk, dv, q = c.key_head_dim, c.value_head_dim, c.chunk
    gemms = (Gemm(T, c.in_proj_out, h), Gemm(T, h, c.value_dim))
    # chunked gated delta rule, per value head: intra-chunk products, state update and readout
    core = T * c.value_heads * (2 * q * (3 * dk + 2 * dv) + 6 * dk * dv)
    states = _chunk_states(s, q, c.value_heads * dk * dv)
    act = T * e * (c.in_proj_out + c.conv_channels + 2 * c.value_dim) + states
    gemm_io = T * e * (c.value_dim + c.in_proj_out + 2 * c.conv_channels)
    ew = T * e * (4 * c.conv_channels + 4 * c.value_dim)
    # selective: as Mamba2, the chunk states (the state update again) and the conv output
    return _block(
        s,
        gemms,
        act,
        gemm_io,
        ew,
        sel_act=states + T * e * c.conv_channels,
        sel_ew=2 * T * e * c.conv_channels,
        sel_core=6 * dk * dv / (2 * q * (3 * dk + 2 * dv) + 6 * dk * dv),
        core=core,
        core_b=SCAN_BWD * core,
        core_unit="scan",
        core_bytes=T * e * (2 * c.key_dim + 2 * c.value_dim),
    )


def _embedding(c: EmbeddingConfig, s: _Shape) -> Work:
    the = s.tokens * s.hidden * s.e
    table = s.vocab * s.hidden * s.e
    ids = s.tokens * INDEX_BYTES
    # F gathers rows (of this GPU's vocabulary shard, the others' rows summed in by the exit
    # collective); no input gradient. W scatter-adds the output gradient into a dense
    # vocab x hidden gradient, which is zeroed first and then accumulated into .grad.
    return Work(
        ew_f=2 * the,
        ew_w=3 * the + 3 * table,
        act=ids,
        act_w=ids,
        out=s.held,
        **s.collectives(enter=False, leave_grad_in_w=True),
    )


def _lm_head(c: LMHeadLossConfig, s: _Shape) -> Work:
    T, e, h, V = s.tokens, s.e, s.hidden, s.vocab
    the = s.held  # the final norm runs on what the GPU holds; the projection on all T tokens
    # Megatron-LM's vocab-parallel cross-entropy, unfused (its default, the same passes in 2021's
    # mpu/cross_entropy.py and core r0.8's tensor_parallel/cross_entropy.py): the GEMM writes the
    # logits in e; .float() reads them and writes fp32 (a no-op on fp32 logits); max reads;
    # subtract, exp and the softmax's divide each read and write in place; the sum reads.
    # Backward multiplies the kept softmax by the loss gradient in place and casts it to e.
    cast = e + LOSS_BYTES if e < LOSS_BYTES else 0
    ew_f = 2 * the + T * V * (e + cast + 8 * LOSS_BYTES)
    ew_b = 3 * the + T * V * (2 * LOSS_BYTES + cast)
    act = 2 * the + 4 * T * V  # x, norm(x), fp32 log-softmax
    # selective: norm(x) only; the log-softmax would need the logits' GEMM again
    tp = s.collectives(leave=False)
    if tp:  # the vocab-parallel cross-entropy all-reduces its per-token max, sum and target
        tp["tp_f"] += (("all-reduce", 3.0 * LOSS_BYTES * T),)
    return Work(
        gemms=(Gemm(T, V, h),),
        ew_f=ew_f,
        ew_b=ew_b,
        ew_w=2 * the,
        act=act,
        act_w=min(act, the + T * V * e),
        out=0.0,
        sel_act=the,
        sel_ew=2 * the,
        **tp,
    )


_WORK_OF_KIND: dict[str, Callable[[Any, _Shape], Work]] = {  # each takes its kind's config
    "attention": _attention,
    "mlp": _mlp,
    "moe": _moe,
    "mamba2": _mamba2,
    "mamba1": _mamba1,
    "gated_deltanet": _gated_deltanet,
    "embedding": _embedding,
    "lm_head_loss": _lm_head,
}


def layer_work(
    spec: ModelSpec, layer: LayerConfig, tp: int = 1, sp: bool = False, ep: int = 1
) -> Work:
    """The work of one of `spec`'s layers for one micro-batch of the spec's shape, on one GPU
    of a tp group (sequence parallel or not) and of an ep group. The layer must split at this
    tp (`octodsl.models.tp.tp_problems`) and ep (`octodsl.models.ep.ep_problem`)."""
    shape = _Shape(
        spec.tokens,
        spec.seq_len,
        spec.microbatch_size,
        spec.hidden,
        local_vocab(spec.vocab, tp),
        spec.dtype_bytes,
        tp,
        sp and tp > 1,
        spec.dropout > 0,
        ep,
    )
    work = _WORK_OF_KIND[layer.kind](local_layer(layer, tp), shape)
    if isinstance(layer, AttentionConfig) and kv_split(layer.kv_heads, tp).replicated:
        # replicated KV heads: B sums the gradient of each one's K and V over the GPUs sharing
        # it (costed over the whole group: an upper bound for its tp / kv_heads sharers)
        kv = float(shape.tokens * 2 * layer.head_dim * shape.e)
        work = replace(work, tp_b=work.tp_b + (("all-reduce", kv),))
    return work
