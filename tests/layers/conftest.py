import pytest
import torch


@pytest.fixture(autouse=True)
def float64_one_thread():
    """Layer tests run in float64 (gradcheck needs it) on one thread (their tensors are tiny, and
    more threads only contend); both settings are restored afterwards."""
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    yield
    torch.set_default_dtype(dtype)
    torch.set_num_threads(threads)
