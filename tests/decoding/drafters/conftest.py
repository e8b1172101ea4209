import pytest
import torch

from .models import tiny_qwen2


@pytest.fixture(scope="module")
def target():
    return tiny_qwen2(0)


@pytest.fixture(scope="module")
def dlm():
    return tiny_qwen2(1)


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    """Tiny models on a shared 2-core machine: a second intra-op thread only spins (20x slower under
    load here). Restored after this package's tests."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
