"""Analytical per-layer costs: the work of each layer (`work.py`) timed on a device.

Each weight GEMM takes its time at its shape (`costs/gemm.py`: a roofline with tile and wave
quantization, calibrated on the device's best measured GEMM), in F, in B (the input gradient's
GEMM) and in W (the weight gradient's). A flash-attention core runs at its kernel's measured
rate for the sequence length and head dimension (`costs/attention.py`); unfused attention's
score GEMMs at their shapes; scans at a fraction of the peak, and no faster than their bytes
over the achievable bandwidth; memory-bound parts take bytes over the achievable bandwidth;
and each sub-layer's F and B pay the device's measured per-op overheads (`Overheads`: kernel
launches and the memory traffic a byte count of the kernels misses). F = GEMMs + core +
elementwise + overheads; B = GEMMs (input side) + core backward + elementwise backward;
W = GEMMs (weight side) + weight-gradient reductions. A layer's `static` counts BYTES_PER_PARAM
per parameter, of which the runtime holds what `costs.param_bytes` says (`CostTable.static_bytes`);
the optimizer step moves OPTIMIZER_BYTES per parameter through memory.

Under tensor parallelism each layer is one GPU's share (work.py), its tp collectives timed as
ring collectives of the tp group on the node's link (`Link.ring`) and added to the op that runs
them: Megatron runs them in line with the compute by default, so they are on the op's critical
path. With `overlap_tp` (the plan's `overlap_tp_comm`, Megatron's `--tp-comm-overlap`) each
op's collectives run under its GEMMs instead, as far as those last: `min(comm, gemms)` of them
is hidden, less what the collectives slow the GEMMs under them by holding SMs (`CommSms.tp`):
the seconds saved (`LayerCost.tp_hidden_f`, ...) come off the op, the rest stays on it.

Under expert parallelism (`ep`, `octodsl.models.ep`) each MoE layer holds 1 / ep of the routed
experts, runs its local experts' GEMMs at the busiest rank's rows (work.py), and its F and B each
run a dispatch and a combine all-to-all on the ep group's links (`costs/expert.py`), in line like
the tp collectives and kept apart as `LayerCost.ep_f`, `ep_b`.
"""

from __future__ import annotations

import dataclasses

from ..models.ep import local_routed_params
from ..models.spec import ModelSpec
from ..models.tp import local_layer, local_params
from ..plan import MEGATRON
from .devices import Device, get_link
from .expert import EpLinks, all_to_all_time
from .param_bytes import accumulate_bytes, default_accum
from .table import CostTable, LayerCost, Link
from .work import Collective, Gemm, Work, layer_work

BYTES_PER_PARAM = 16
"""The bytes per parameter a table's `LayerCost.static` counts (its meta `bytes_per_param`): a
nominal figure, mixed-precision Adam's 2 + 2 + 12 as the ZeRO paper counts it, that
`StaticBytes.share` turns into what the plan's runtime holds (octodsl.costs.param_bytes)."""

OPTIMIZER_BYTES = 38
"""Bytes per parameter the optimizer step reads and writes, fused Adam over fp32 main
parameters and gradients (Megatron-LM's optimizer, apex's multi-tensor Adam): read the gradient,
the main parameter, m and v (16), write the main parameter, m and v (12), then copy the main
parameter into the model's bf16 one (read 4, write 2); the gradient's norm for clipping reads it
once more (4): 16 + 12 + 6 + 4. Derived from the kernels, not measured."""


_PASSES = {"all-reduce": 2, "all-gather": 1, "reduce-scatter": 1}


def _comm(collectives: tuple[Collective, ...], tp: int, link: Link) -> float:
    return sum(link.ring(nbytes, tp, _PASSES[kind]) for kind, nbytes in collectives)


def _tp_overlap_saved(
    work: Work,
    comm: tuple[float, float, float],
    gemm: tuple[float, float, float],
    tp: int,
    link: Link,
    device: Device,
) -> tuple[float, float, float]:
    """What `overlap_tp` saves of F's, B's and W's tp collectives: the seconds under the op's
    GEMMs, `min(comm, gemms)`, less what the collectives slow those GEMMs by holding SMs
    (`CommSms.tp`): Transformer Engine's userbuffers run the reduce-scatters (and any
    all-reduce) of F and B and the all-gathers of W on SMs, the all-gathers of F and B on the
    copy engine."""
    slow = device.overlap_slowdown(device.comm_sms.tp)
    saved = []
    for op, c, g in zip((work.tp_f, work.tp_b, work.tp_w), comm, gemm, strict=True):
        on_sms = _comm(tuple(x for x in op if op is work.tp_w or x[0] != "all-gather"), tp, link)
        hidden = min(c, g)
        saved.append(hidden - slow * hidden * (on_sms / c if c > 0 else 0.0))
    return saved[0], saved[1], saved[2]


def _gemms(gemms: tuple[Gemm, ...], device: Device, dtype: str, e: int) -> float:
    peak = device.matmul_flops(dtype)
    return sum(device.gemm.seconds(g, peak, device.bandwidth, e) for g in gemms)


def _times(
    work: Work, device: Device, dtype: str, e: int
) -> tuple[tuple[float, float, float], tuple[float, float, float], float]:
    """(F, B, W compute seconds), (the weight GEMMs' seconds of each) and the seconds of what
    selective recompute runs again."""
    eff = device.efficiency
    bandwidth = device.bandwidth
    g_f = _gemms(work.gemms, device, dtype, e)
    g_b = _gemms(tuple(g.input_grad() for g in work.gemms), device, dtype, e)
    g_w = _gemms(tuple(g.weight_grad() for g in work.gemms), device, dtype, e)
    core_f = core_b = 0.0
    if work.core:
        if work.core_unit == "vector":
            rate_f = rate_b = device.vector_flops * eff.vector
        elif work.core_unit == "attention" and device.attention is not None:
            rate_f, rate_b = device.attention.rates(work.core_seq, work.core_head_dim)
        else:
            rate_f = rate_b = device.matmul_flops(dtype) * getattr(eff, work.core_unit)
        core_f = max(work.core / rate_f, work.core_bytes / bandwidth)
        core_b = max(work.core_b / rate_b, 2 * work.core_bytes / bandwidth)
    core_f += _gemms(work.core_gemms, device, dtype, e)
    core_b += _gemms(work.core_gemms_b, device, dtype, e)
    o = device.overheads
    over_f = work.elements * o.f_bytes / device.mem_bandwidth
    over_b = work.elements * o.b_bytes / device.mem_bandwidth
    return (
        (
            g_f + core_f + work.ew_f / bandwidth + over_f,
            g_b + core_b + work.ew_b / bandwidth + over_b,
            g_w + work.ew_w / bandwidth,
        ),
        (g_f, g_b, g_w),
        work.sel_core * core_f + work.sel_ew / bandwidth,
    )


def analytical_costs(
    spec: ModelSpec,
    device: Device,
    bytes_per_param: int = BYTES_PER_PARAM,
    tp: int = 1,
    sp: bool | None = None,
    tp_link: Link | None = None,
    overlap_tp: bool = False,
    scatter_gather: bool = False,
    ep: int = 1,
    ep_links: EpLinks | None = None,
) -> CostTable:
    """Per-layer costs of `spec` (at its micro-batch size and sequence length) on `device`, on
    one GPU of a tp group: `sp` sequence parallelism (default: on when tp > 1), the tp
    collectives on `tp_link` (default: the device's node link), hidden under the GEMMs with
    `overlap_tp`; without sp, each GPU sends 1/tp of a pipeline message with `scatter_gather`
    (the whole activation otherwise); the MoE layers' experts spread over an `ep` group whose
    all-to-alls take `ep_links` (default: all ranks in one node, on the tp link). The model must
    split at this tp (`octodsl.models.tp.tp_problems`) and ep (`octodsl.models.ep.ep_problem`)."""
    sp = tp > 1 if sp is None else sp and tp > 1
    overlap_tp = overlap_tp and tp > 1
    scatter_gather = scatter_gather and tp > 1 and not sp
    link = tp_link or get_link(device.node_link)
    a2a_links = ep_links or EpLinks(link, link, ep)
    # the pass into Megatron-LM's accumulator: LayerCost.grad_acc's basis, which
    # StaticBytes.accumulation scales to the plan's runtime
    accumulated = accumulate_bytes(spec.dtype, default_accum(spec.dtype, MEGATRON))
    layers = []
    # A model repeats a few layer configurations (frozen, hashable) many times: each is costed
    # once (LayerCost is frozen, so the layers share it).
    costed: dict[object, LayerCost] = {}
    for i, layer in enumerate(spec.layers):
        if layer in costed:
            layers.append(costed[layer])
            continue
        work = layer_work(spec, layer, tp, sp, ep)
        (f, b, w), gemm, sel_f = _times(work, device, spec.dtype, spec.dtype_bytes)
        tp_f, tp_b, tp_w = (_comm(c, tp, link) for c in (work.tp_f, work.tp_b, work.tp_w))
        a2a = sum(all_to_all_time(nbytes, ep, a2a_links) for nbytes in work.all_to_all)
        hidden = (
            _tp_overlap_saved(work, (tp_f, tp_b, tp_w), gemm, tp, link, device)
            if overlap_tp
            else (0.0, 0.0, 0.0)
        )
        params = local_params(spec, i, tp, ep)
        layers.append(
            LayerCost(
                kind=layer.kind,
                f=f + tp_f - hidden[0] + a2a,
                b=b + tp_b - hidden[1] + a2a,
                w=w + tp_w - hidden[2],
                act=work.act,
                act_w=work.act_w,
                static=float(params * bytes_per_param),
                params=params,
                out_bytes=work.out,
                sel_f=sel_f,
                sel_act=work.sel_act,
                tp_f=tp_f,
                tp_b=tp_b,
                tp_w=tp_w,
                tp_hidden_f=hidden[0],
                tp_hidden_b=hidden[1],
                tp_hidden_w=hidden[2],
                update=params * OPTIMIZER_BYTES / device.bandwidth,
                grad_acc=params * accumulated / device.bandwidth,
                host_f=device.overheads.f_seconds if work.elements else 0.0,
                host_b=device.overheads.b_seconds if work.elements else 0.0,
                msg_bytes=work.out / tp if scatter_gather else None,
                ep_f=a2a,
                ep_b=a2a,
                expert_params=local_routed_params(local_layer(layer, tp), spec.hidden, ep),
            )
        )
        costed[layer] = layers[-1]
    where = (
        f", tp {tp}{' sp' if sp else ''}{' overlapped' if overlap_tp else ''} on {link.name}"
        if tp > 1
        else ""
    ) + (f", ep {ep} on {a2a_links.describe(ep)}" if ep > 1 else "")
    return CostTable(
        layers=layers,
        source=f"analytical {spec.name} on {device.name}{where}",
        tokens_per_microbatch=spec.tokens,
        meta={
            "model": spec.name,
            "device": device.name,
            "microbatch_size": spec.microbatch_size,
            "seq_len": spec.seq_len,
            "dtype": spec.dtype,
            "tied_embeddings": spec.tie_embeddings,
            "bytes_per_param": bytes_per_param,
            "pattern": spec.pattern,
            "tp": tp,
            "sp": sp,
            "overlap_tp_comm": overlap_tp,
            "message_overhead": device.overheads.message_seconds,
            "sms": device.gemm.sms,
            "comm_sms": dataclasses.asdict(device.comm_sms),
            "scatter_gather_messages": scatter_gather,
            "ep": ep,
        },
    )
