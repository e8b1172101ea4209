import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    # tiny tensors gain nothing from threads, and on a shared CPU the OpenMP barriers of every
    # small op cost milliseconds each (10 ms per tiny linear measured under load)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
