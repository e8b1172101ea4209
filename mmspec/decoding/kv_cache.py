"""Commit the accepted path of a verified tree in a Hugging Face `Cache`, and crop caches.

After the verification forward the cache holds `start` committed entries followed by the entries
of every tree node. Each row keeps the entries of its root and accepted path, which are scattered
over the tree's nodes, so cropping alone cannot do it: `commit_path` gathers them with an index
select per row into `[start, start + K)` and drops the rest. Rows that accepted fewer than `K - 1`
tokens leave holes there, which the engine masks out.

Works on any cache whose attention layers hold `keys`/`values` `[B, H, L, D]` tensors (transformers'
`DynamicCache` and its `DynamicLayer`s). Sliding-window layers (Gemma 2's every other layer) work
while they still hold every entry, that is while the sequence is shorter than the window; after
that, and for static and linear-attention layers, the cache is refused: its contents cannot be
compacted this way.
"""

from __future__ import annotations

import torch
from transformers import Cache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


def _layers(cache: Cache):
    for layer in cache.layers:
        sliding = type(layer) is DynamicSlidingWindowLayer
        if type(layer) is not DynamicLayer and not sliding:
            raise TypeError(
                f"cache layer {type(layer).__name__} cannot be compacted; speculative decoding "
                f"needs DynamicLayer (full attention) or DynamicSlidingWindowLayer layers"
            )
        if sliding and layer.is_initialized and layer.cumulative_length > layer.keys.shape[-2]:
            raise NotImplementedError(
                f"the sequence ({layer.cumulative_length} tokens) outgrew a sliding-window layer "
                f"(sliding_window={layer.sliding_window}), which has dropped its oldest entries: "
                f"speculative decoding cannot roll such a layer back; keep prompt + "
                f"max_new_tokens + draft below the window")
        if layer.is_initialized and layer.keys.numel():
            yield layer


def check_window(cache: Cache, length: int) -> None:
    """Refuse up front a generation of `length` tokens (prompt + max_new_tokens) that would outgrow
    a sliding-window layer of `cache`, rather than after its work is done."""
    windows = [layer.sliding_window for layer in cache.layers
               if type(layer) is DynamicSlidingWindowLayer]
    if windows and length >= min(windows):
        raise NotImplementedError(
            f"prompt + max_new_tokens = {length} tokens reach a sliding-window layer's window "
            f"(sliding_window={min(windows)}), which then drops its oldest entries: speculative "
            f"decoding cannot roll such a layer back; ask for fewer tokens")


def _set_length(layer, length: int) -> None:
    if type(layer) is DynamicSlidingWindowLayer:  # its get_seq_length counts every update
        layer.cumulative_length = length


def commit_path(cache: Cache, start: int, keep: torch.Tensor) -> None:
    """Keep, per row, the entries `start + keep[b]` in order, at `[start, start + K)`.

    keep: long `[B, K]`, indices relative to `start`, in the tree's node order (root is 0).
    A chain's path (every row keeps `0, 1, ..., K-1`) is in place already: only a crop, which
    saves two gathers and two copies per layer (~0.3 ms a round for the 6-layer zoo target on a
    CPU; on a GPU, 4 kernel launches per layer).
    """
    b, k = keep.shape
    if torch.equal(keep, torch.arange(k, device=keep.device).expand(b, k)):
        crop(cache, start + k)
        return
    for layer in _layers(cache):
        h, d = layer.keys.shape[1], layer.keys.shape[3]
        idx = keep.to(layer.keys.device)[:, None, :, None].expand(b, h, k, d)  # [B, H, K, D]
        for name in ("keys", "values"):
            full = getattr(layer, name)  # [B, H, start + N, D]
            picked = full[:, :, start:].gather(2, idx)  # [B, H, K, D]
            full[:, :, start : start + k] = picked
            setattr(layer, name, full[:, :, : start + k])
        _set_length(layer, start + k)


def crop(cache: Cache, length: int) -> None:
    """Keep the first `length` entries of every layer."""
    for layer in _layers(cache):
        layer.keys = layer.keys[:, :, :length]
        layer.values = layer.values[:, :, :length]
        _set_length(layer, layer.keys.shape[2])
