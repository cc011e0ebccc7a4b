"""Analytical per-layer costs: the work of each layer (`work.py`) timed on a device.

A part's time is its FLOPs over the achievable rate of the unit it runs on (peak x efficiency),
and memory-bound parts take bytes over the achievable bandwidth; a scan takes the larger of its
compute and its memory time (bandwidth is its floor). F = GEMMs + core + elementwise;
B = GEMMs (input side) + core backward + elementwise backward; W = GEMMs (weight side) +
weight-gradient reductions. Static memory is BYTES_PER_PARAM per parameter.

Under tensor parallelism each layer is one GPU's share (work.py), its tp collectives timed as
ring collectives of the tp group on the node's link (`Link.ring`) and added to the op that runs
them: Megatron runs them in line with the compute (no overlap by default), so they are on the
op's critical path. The weight GEMMs lose efficiency as the split width shrinks per GPU
(`gemm_shrink`).
"""

from __future__ import annotations

from ..models.spec import LayerConfig, ModelSpec
from ..models.tp import local_params, split_width
from .devices import Device, get_link
from .table import CostTable, LayerCost, Link
from .work import Collective, Work, layer_work

BYTES_PER_PARAM = 16
"""Mixed-precision Adam: bf16 parameter and gradient (2 + 2), fp32 master copy, Adam m and v
(4 + 4 + 4). An fp32 model has fp32 parameter and gradient and Adam m, v: also 16."""


GEMM_HALF_WIDTH = 128
"""The split width (per GPU) at which the GEMM efficiency model halves: one 128-wide tile of the
tensor-core kernels (CUTLASS / cuBLAS), below which tile and wave quantisation leave the matrix
units idle (NVIDIA, "Matrix Multiplication Background User's Guide")."""

_PASSES = {"all-reduce": 2, "all-gather": 1, "reduce-scatter": 1}


def gemm_shrink(width: int, tp: int) -> float:
    """The GEMM efficiency of a layer whose split width is `width`, at tp relative to tp 1:
    g(width / tp) / g(width) with g(x) = x / (x + GEMM_HALF_WIDTH), a saturating model of how
    efficiency falls as matrices shrink (1 at tp 1 or for layers with no split GEMM). E.g. an
    8192-wide attention at tp 8: 0.90; a 32768-wide MLP: 0.97. A model, not a measurement:
    Narayanan et al. 2021 (SC'21, Fig. 13) report per-GPU throughput falling with tp at fixed
    size; `octodsl profile` on the GPUs measures it."""
    if tp == 1 or width <= 0:
        return 1.0
    def g(x: float) -> float:
        return x / (x + GEMM_HALF_WIDTH)
    return g(width / tp) / g(width)


def _comm(collectives: tuple[Collective, ...], tp: int, link: Link) -> float:
    return sum(link.ring(nbytes, tp, _PASSES[kind]) for kind, nbytes in collectives)


def _times(work: Work, device: Device, dtype: str,
           shrink: float = 1.0) -> tuple[float, float, float, float]:
    """F, B and W compute seconds, and the seconds of what selective recompute runs again;
    `shrink` is the GEMMs' efficiency factor (`gemm_shrink`)."""
    eff = device.efficiency
    bandwidth = device.mem_bandwidth * eff.bandwidth
    gemm = work.gemm / (device.matmul_flops(dtype) * eff.gemm * shrink)
    if work.core_unit == "vector":
        core_rate = device.vector_flops * eff.vector
    else:
        core_rate = device.matmul_flops(dtype) * getattr(eff, work.core_unit)
    core_f = max(work.core / core_rate, work.core_bytes / bandwidth) if work.core else 0.0
    core_b = max(work.core_b / core_rate, 2 * work.core_bytes / bandwidth) if work.core else 0.0
    return (gemm + core_f + work.ew_f / bandwidth,
            gemm + core_b + work.ew_b / bandwidth,
            gemm + work.ew_w / bandwidth,
            work.sel_core * core_f + work.sel_ew / bandwidth)


def analytical_costs(spec: ModelSpec, device: Device, bytes_per_param: int = BYTES_PER_PARAM,
                     tp: int = 1, sp: bool | None = None, tp_link: Link | None = None) -> CostTable:
    """Per-layer costs of `spec` (at its micro-batch size and sequence length) on `device`, on
    one GPU of a tp group: `sp` sequence parallelism (default: on when tp > 1), the tp
    collectives on `tp_link` (default: the device's node link). The model must split at this tp
    (`octodsl.models.tp.tp_problems`)."""
    sp = tp > 1 if sp is None else sp and tp > 1
    link = tp_link or get_link(device.node_link)
    layers = []
    for i, layer in enumerate(spec.layers):
        work = layer_work(spec, layer, tp, sp)
        f, b, w, sel_f = _times(work, device, spec.dtype, _shrink(layer, spec, tp))
        tp_f, tp_b, tp_w = (_comm(c, tp, link) for c in (work.tp_f, work.tp_b, work.tp_w))
        params = local_params(spec, i, tp)
        layers.append(LayerCost(kind=layer.kind, f=f + tp_f, b=b + tp_b, w=w + tp_w, act=work.act,
                                act_w=work.act_w, static=float(params * bytes_per_param),
                                params=params, out_bytes=work.out, sel_f=sel_f,
                                sel_act=work.sel_act, tp_f=tp_f, tp_b=tp_b, tp_w=tp_w))
    where = f", tp {tp}{' sp' if sp else ''} on {link.name}" if tp > 1 else ""
    return CostTable(
        layers=layers,
        source=f"analytical {spec.name} on {device.name}{where}",
        tokens_per_microbatch=spec.tokens,
        meta={"model": spec.name, "device": device.name, "microbatch_size": spec.microbatch_size,
              "seq_len": spec.seq_len, "dtype": spec.dtype, "bytes_per_param": bytes_per_param,
              "pattern": spec.pattern, "tp": tp, "sp": sp},
    )


def _shrink(layer: LayerConfig, spec: ModelSpec, tp: int) -> float:
    return gemm_shrink(split_width(layer, spec), tp)
