"""Analytical per-layer costs: the work of each layer (`work.py`) timed on a device.

A part's time is its FLOPs over the achievable rate of the unit it runs on (peak x efficiency),
and memory-bound parts take bytes over the achievable bandwidth; a scan takes the larger of its
compute and its memory time (bandwidth is its floor). F = GEMMs + core + elementwise;
B = GEMMs (input side) + core backward + elementwise backward; W = GEMMs (weight side) +
weight-gradient reductions. Static memory is BYTES_PER_PARAM per parameter.
"""

from __future__ import annotations

from ..models.spec import ModelSpec
from .devices import Device
from .table import CostTable, LayerCost
from .work import Work, layer_work

BYTES_PER_PARAM = 16
"""Mixed-precision Adam: bf16 parameter and gradient (2 + 2), fp32 master copy, Adam m and v
(4 + 4 + 4). An fp32 model has fp32 parameter and gradient and Adam m, v: also 16."""


def _times(work: Work, device: Device, dtype: str) -> tuple[float, float, float, float]:
    """F, B and W seconds, and the seconds of what selective recompute runs again."""
    eff = device.efficiency
    bandwidth = device.mem_bandwidth * eff.bandwidth
    gemm = work.gemm / (device.matmul_flops(dtype) * eff.gemm)
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


def analytical_costs(spec: ModelSpec, device: Device,
                     bytes_per_param: int = BYTES_PER_PARAM) -> CostTable:
    """Per-layer costs of `spec` (at its micro-batch size and sequence length) on `device`."""
    layers = []
    for i, layer in enumerate(spec.layers):
        work = layer_work(spec, layer)
        f, b, w, sel_f = _times(work, device, spec.dtype)
        params = spec.layer_params(i)
        layers.append(LayerCost(kind=layer.kind, f=f, b=b, w=w, act=work.act, act_w=work.act_w,
                                static=float(params * bytes_per_param), params=params,
                                out_bytes=work.out, sel_f=sel_f, sel_act=work.sel_act))
    return CostTable(
        layers=layers,
        source=f"analytical {spec.name} on {device.name}",
        tokens_per_microbatch=spec.tokens,
        meta={"model": spec.name, "device": device.name, "microbatch_size": spec.microbatch_size,
              "seq_len": spec.seq_len, "dtype": spec.dtype, "bytes_per_param": bytes_per_param,
              "pattern": spec.pattern},
    )
