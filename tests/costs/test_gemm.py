"""The GEMM shape model (costs/gemm.py): quantization, the memory floor, the calibration."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octodsl.costs.devices import CUBLAS_TILES, DEVICES, GEMM_CALIBRATION, get_device
from octodsl.costs.gemm import GemmModel, Tile
from octodsl.costs.work import Gemm

A100 = get_device("A100")
H100 = get_device("H100")


def _eff(device, g: Gemm) -> float:
    return device.gemm.efficiency(g, device.peak_flops, device.bandwidth, 2)


def test_each_gpu_reaches_its_published_best_at_the_published_shape():
    # Stas Bekman's MAMF: A100 SXM 271.2 of 312 TFLOPS at 1024x10240x5120, H100 SXM 794.5 of
    # 989 at 2048x2048x13312 (the model is calibrated there; the same arithmetic both ways).
    assert _eff(A100, Gemm(1024, 10240, 5120)) == pytest.approx(0.869, rel=1e-9)
    assert _eff(H100, Gemm(2048, 2048, 13312)) == pytest.approx(0.803, rel=1e-9)
    assert get_device("H800").gemm == H100.gemm == get_device("H200").gemm


def test_wave_quantization_one_tile_more_than_the_sms_costs_a_wave():
    model = GemmModel(1.0, 100, (Tile(128, 128),))
    full = model.seconds(Gemm(128 * 10, 128 * 10, 4096), 1e15, 1e15, 2)
    over = model.seconds(Gemm(128 * 10 + 1, 128 * 10, 4096), 1e15, 1e15, 2)
    assert over == pytest.approx(2 * full)


def test_tile_quantization_a_ragged_edge_is_paid_whole():
    model = GemmModel(1.0, 1000, (Tile(128, 128),))
    a = model.seconds(Gemm(4096, 4096 + 1, 4096), 1e15, 1e15, 2)
    b = model.seconds(Gemm(4096, 4096 + 128, 4096), 1e15, 1e15, 2)
    assert a == pytest.approx(b)


def test_small_gemms_are_memory_bound():
    # One token through an 8192 x 8192 weight: 128 MiB of weight read for 134 MFLOP.
    g = Gemm(1, 8192, 8192)
    seconds = A100.gemm.seconds(g, A100.peak_flops, A100.bandwidth, 2)
    assert seconds == pytest.approx(2 * (8192 * 8192 + 2 * 8192) / A100.bandwidth)
    assert _eff(A100, g) < 0.01


def test_the_library_picks_the_fastest_tile():
    g = Gemm(2048, 2304, 2304)  # 1.7B GPT's output projection at one 2048-token sequence
    times = [
        GemmModel(A100.gemm.peak_fraction, 108, (t,), A100.gemm.k_ramp).seconds(
            g, A100.peak_flops, A100.bandwidth, 2
        )
        for t in CUBLAS_TILES
    ]
    assert A100.gemm.seconds(g, A100.peak_flops, A100.bandwidth, 2) == pytest.approx(min(times))


@given(
    st.integers(1, 1 << 15),
    st.integers(1, 1 << 15),
    st.integers(1, 1 << 15),
    st.sampled_from(sorted(DEVICES)),
)
def test_no_gemm_beats_the_peak_its_measured_best_or_its_bytes(m, n, k, name):
    d = get_device(name)
    g = Gemm(m, n, k)
    s = d.gemm.seconds(g, d.peak_flops, d.bandwidth, 2)
    assert s >= g.flops / d.peak_flops * (1 - 1e-12)
    if name in GEMM_CALIBRATION:  # the best of a search over shapes: none is faster
        assert s >= g.flops / (d.peak_flops * GEMM_CALIBRATION[name][0]) * (1 - 1e-12)
    assert s >= 2 * (m * k + k * n + m * n) / d.bandwidth * (1 - 1e-12)
    assert math.isfinite(s)


def test_larger_microbatches_run_the_gemms_faster_per_token():
    per_token = [
        A100.gemm.seconds(Gemm(b * 2048, 2304, 2304), A100.peak_flops, A100.bandwidth, 2) / b
        for b in (1, 2, 4, 8)
    ]
    assert per_token[-1] < per_token[0]
