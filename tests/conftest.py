"""Test-wide setup. TRITON_INTERPRET must be set before any `triton.jit` decorator runs, so it is
set here, before mmspec.kernels is imported, on machines without a GPU."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The tests run tiny models, where one thread beats two (no OpenMP barriers per small op).
torch.set_num_threads(1)
