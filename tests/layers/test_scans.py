"""The pure-torch scans against naive sequential recurrences."""

import pytest
import torch

from octodsl.layers import selective_scan, ssd_scan
from octodsl.layers.mamba2 import segsum


def ssd_reference(x, dt, A, B, C):
    """h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T; y_t = h_t C_t, one step at a time."""
    b, s, heads, p = x.shape
    reps = heads // B.shape[2]
    B, C = B.repeat_interleave(reps, 2), C.repeat_interleave(reps, 2)
    h = torch.zeros(b, heads, p, B.shape[-1])
    ys = []
    for t in range(s):
        decay = torch.exp(dt[:, t] * A)[..., None, None]
        h = decay * h + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", h, C[:, t]))
    return torch.stack(ys, dim=1)


def selective_reference(u, dt, A, B, C):
    b, s, d = u.shape
    h = torch.zeros(b, d, A.shape[1])
    ys = []
    for t in range(s):
        h = (
            torch.exp(dt[:, t, :, None] * A) * h
            + (dt[:, t] * u[:, t])[..., None] * B[:, t, None, :]
        )
        ys.append((h * C[:, t, None, :]).sum(-1))
    return torch.stack(ys, dim=1)


def ssd_inputs(seed, b=2, s=19, heads=4, p=3, groups=2, n=5):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, s, heads, p, generator=g),
        torch.nn.functional.softplus(torch.randn(b, s, heads, generator=g)),
        -torch.rand(heads, generator=g) * 2 - 0.1,
        torch.randn(b, s, groups, n, generator=g),
        torch.randn(b, s, groups, n, generator=g),
    )


def test_segsum():
    x = torch.tensor([1.0, 2.0, 3.0])
    out = segsum(x)
    assert out[2, 0] == 5 and out[1, 1] == 0 and out[2, 1] == 3 and out[0, 1] == -torch.inf


@pytest.mark.parametrize("chunk", [1, 4, 8, 19, 32])
def test_ssd_matches_sequential(chunk):
    x, dt, A, B, C = ssd_inputs(0)
    torch.testing.assert_close(ssd_scan(x, dt, A, B, C, chunk), ssd_reference(x, dt, A, B, C))


def test_selective_scan_matches_sequential():
    g = torch.Generator().manual_seed(1)
    b, s, d, n = 2, 21, 6, 4  # 21 is not a multiple of the chunk: exercises the padding
    u = torch.randn(b, s, d, generator=g)
    dt = torch.nn.functional.softplus(torch.randn(b, s, d, generator=g))
    A = -torch.rand(d, n, generator=g) * 3
    B, C = torch.randn(b, s, n, generator=g), torch.randn(b, s, n, generator=g)
    torch.testing.assert_close(selective_scan(u, dt, A, B, C), selective_reference(u, dt, A, B, C))


def test_scans_gradcheck():
    x, dt, A, B, C = (
        t.requires_grad_() for t in ssd_inputs(2, b=1, s=6, heads=2, p=2, groups=1, n=2)
    )
    assert torch.autograd.gradcheck(lambda *a: ssd_scan(*a, chunk=4), (x, dt, A, B, C))
    g = torch.Generator().manual_seed(3)
    u, B1, C1 = (torch.randn(1, 10, k, generator=g).requires_grad_() for k in (3, 2, 2))
    dt1 = torch.rand(1, 10, 3, generator=g).add(0.1).requires_grad_()
    A1 = (-torch.rand(3, 2, generator=g) - 0.1).requires_grad_()
    assert torch.autograd.gradcheck(selective_scan, (u, dt1, A1, B1, C1))
