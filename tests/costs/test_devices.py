"""Devices and links."""

from __future__ import annotations

import pytest

from octodsl.costs.devices import DEVICES, get_device, get_link
from octodsl.errors import OctoError


def test_devices():
    assert {"H800", "H100", "H200", "A100", "cpu"} <= set(DEVICES)
    assert get_device("h800") is DEVICES["H800"]
    assert get_device("H200").mem_bandwidth > get_device("H100").mem_bandwidth
    assert get_device("cpu").matmul_flops("fp32") < get_device("cpu").matmul_flops("bf16")
    with pytest.raises(OctoError, match="unknown device 'tpu'"):
        get_device("tpu")


def test_links():
    nvlink, ib, loop, none = (get_link(n) for n in ("nvlink", "ib-ndr", "loopback", "none"))
    mb = 32 * 2**20
    assert nvlink.time(mb) < ib.time(mb) < loop.time(mb)
    assert nvlink.time(mb) == pytest.approx(nvlink.latency + mb / nvlink.bandwidth)
    assert none.time(mb) == 0
    with pytest.raises(OctoError, match="unknown link"):
        get_link("ethernet")
