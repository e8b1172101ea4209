"""Test-wide setup. TRITON_INTERPRET must be set before any `triton.jit` decorator runs, so it is
set here, before mmspec.kernels is imported, on machines without a GPU."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# nothing downloads in tests: a hub id resolves from the local cache or is a one-line miss
# (`mmspec.hub` reads it at each call; set before huggingface_hub is imported, for transformers)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The tests run tiny models, where one thread beats two (no OpenMP barriers per small op).
torch.set_num_threads(1)


@pytest.fixture
def interrupt_on_call(monkeypatch):
    """`interrupt_on_call(module, name, n)` makes `module.name` raise KeyboardInterrupt on its
    n-th call (a run killed mid-training) and returns the original, to be set back before the
    resume."""

    def patch(module, name: str, n: int):
        real, calls = getattr(module, name), [0]

        def dies(*args, **kwargs):
            calls[0] += 1
            if calls[0] == n:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, dies)
        return real

    return patch


@pytest.fixture(autouse=True)
def no_machine_timing_table(monkeypatch, tmp_path_factory):
    """`backend="auto"` keeps its fixed order in tests: a timing table measured on this machine
    (`python -m mmspec.kernels.tune`, or a GPU session's kernels step) would otherwise decide
    which backends the tests run. `tests/kernels/test_timings.py` writes its own."""
    from mmspec.kernels.backends import timings

    absent = tmp_path_factory.getbasetemp() / "no_timing_table" / timings.TABLE_NAME
    monkeypatch.setattr(timings, "table_path", lambda: absent)
    timings.forget()
