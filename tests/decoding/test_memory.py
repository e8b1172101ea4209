"""Memory does not grow across repeated `generate` calls."""

import gc
import warnings

import torch
from spec_helpers import tiny_llama

from mmspec import ModelDrafter, generate


def _live_tensor_bytes() -> tuple[int, int]:
    gc.collect()
    with warnings.catch_warnings():  # isinstance on some torch proxies warns
        warnings.simplefilter("ignore")
        tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    storages = {}
    for t in tensors:
        try:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        except RuntimeError:  # fake tensors that torch.compile (tests/kernels) leaves around
            continue
    return len(tensors), sum(storages.values())


def test_no_growth_over_100_calls():
    # a tree drafter: the engine's tree, mask and cache paths and the drafter's own cache
    target, drafter = tiny_llama(0, layers=1), ModelDrafter(tiny_llama(1, layers=1), 2, top_k=2, depth=2)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    counts = []
    for i in range(100):
        generate(target, drafter, ids + i % 7, max_new_tokens=3)
        if i in (9, 99):
            counts.append(_live_tensor_bytes())
    (n10, bytes10), (n100, bytes100) = counts
    assert n100 <= n10, f"live tensors grew from {n10} to {n100}"
    assert bytes100 <= bytes10 * 1.05, f"live tensor bytes grew from {bytes10} to {bytes100}"
