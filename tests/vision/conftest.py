import sys
from pathlib import Path

import pytest
import torch

from mmspec.kernels.backends import torch_blocks, triton_kernel

sys.path.insert(0, str(Path(__file__).parent))  # tiny_vlms
# tiny models: one thread avoids oversubscription on the shared 2-core machines
torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="package")
def _plain_cpu_attention():
    """Run the targets' verification attention on the kernels' batched-matmul CPU path.

    - `tests/conftest.py` sets TRITON_INTERPRET=1 for the kernel tests, which makes the "auto"
      backend pick the Triton *interpreter* on CPU: ~150 s for one tiny LLaVA `generate`.
    - The fused C++ kernel's JIT build (~30-45 s) is redone whenever another checkout on the
      machine built it last (one shared build directory), so it is switched off too
      (`MMSPEC_CPU_KERNEL=0`). Both are about test speed; the results are the same.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(triton_kernel, "_INTERPRET", False)
        mp.setenv("MMSPEC_CPU_KERNEL", "0")
        torch_blocks._cpu_kernel.cache_clear()
        yield
    torch_blocks._cpu_kernel.cache_clear()
