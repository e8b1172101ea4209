"""Sliding-window attention layers (Gemma 2 and 3, Mistral v0.1) under speculative decoding.

transformers caches a sliding-window layer in a `DynamicSlidingWindowLayer`, which keeps only the
last `window - 1` entries: a verified draft's rejected entries could then not be dropped again,
and the oldest committed ones would be gone. So the engine (and `ModelDrafter`) give such a model
a cache of plain `DynamicLayer`s (`DynamicCache()` without a config), which keeps every entry,
and attend through the window with a mask: `block_sparse_mask` becomes a dict from the layer's
`sliding_window` (None for full-attention layers) to its mask, which `mmspec.kernels.hf` picks per
layer. Under `compile=True` the same window (`within_window`) cuts a dense 4-D mask, which
transformers hands to the sliding layers (`static.masks`).

The window is applied in positions, as transformers does it: a query at position p sees the keys
at positions p - window < k <= p. (transformers compares cache indices, which equal positions up
to a constant offset per row; in the engine's slot layout, where rejected draft tokens leave
holes, positions are what still count.)
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from mmspec.kernels import BlockSparseMask


def sliding_windows(model) -> tuple[int, ...]:
    """The distinct sliding windows of the model's attention layers, as transformers would cache
    them (empty for models without)."""
    cache = DynamicCache(config=model.config)  # no tensors yet: cheap
    return tuple(sorted({int(w) for layer in cache.layers
                         if (w := getattr(layer, "sliding_window", None)) is not None}))


def block_masks(token_mask: torch.Tensor, block_size: int, windows: tuple[int, ...] = (),
                positions=None, pad_partials: bool = False):
    """`block_sparse_mask` for a forward: the mask of `token_mask` (bool `[B, Nq, Nk]`) alone, or,
    with `windows`, a dict `{None: that mask, w: that mask within window w, ...}`.

    positions: with `windows`, a callable giving (long `[B, Nq]` query positions, long `[B, Nk]`
    key positions); not called without (the decode loop of every other model skips the work).
    pad_partials: `BlockSparseMask.from_token_mask`'s, which then reads nothing from the device.
    """
    full = BlockSparseMask.from_token_mask(token_mask[:, None], block_size,
                                           pad_partials=pad_partials)
    if not windows:
        return full
    q_pos, k_pos = positions()
    masks = {None: full}
    for window in windows:
        masks[window] = BlockSparseMask.from_token_mask(
            within_window(token_mask, q_pos, k_pos, window)[:, None], block_size,
            pad_partials=pad_partials)
    return masks


def within_window(token_mask: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                  window: int) -> torch.Tensor:
    """token_mask (bool `[B, Nq, Nk]`) limited to the keys inside each query's window: a query
    at position p keeps the keys at positions k > p - window (long `[B, Nq]` and `[B, Nk]`)."""
    return token_mask & (q_pos[:, :, None] - k_pos[:, None, :] < window)


def within_chunk(token_mask: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                 chunk: int) -> torch.Tensor:
    """token_mask (bool `[B, Nq, Nk]`) limited to the keys in each query's chunk (Llama 4's
    chunked attention, `attention_chunk_size`): a query at position p keeps the keys at positions
    k with k // chunk == p // chunk (long `[B, Nq]` and `[B, Nk]`). transformers counts chunks in
    cache slots from each row's left padding, which are positions where a row has no holes."""
    return token_mask & (q_pos[:, :, None] // chunk == k_pos[:, None, :] // chunk)
