"""Commit the accepted path of a verified tree in a Hugging Face `Cache`, and crop caches.

After the verification forward the cache holds `start` committed entries followed by the entries
of every tree node. Each row keeps the entries of its root and accepted path, which are scattered
over the tree's nodes, so cropping alone cannot do it: `commit_path` gathers them with an index
select per row into `[start, start + K)` and drops the rest. Rows that accepted fewer than `K - 1`
tokens leave holes there, which the engine masks out.

Works on any cache whose attention layers hold `keys`/`values` `[B, H, L, D]` tensors (transformers'
`DynamicCache` and its `DynamicLayer`s); the values' D may differ from the keys' (MLA models);
`DynamicIndexedLayer`s (DSA models: GLM-MoE-DSA, DeepSeek-V3.2) also keep their indexer's keys.
A `StaticLayer` (`compile=True`, `static.py`) keeps its preallocated tensors: the path is gathered
in place and its `cumulative_length` set back to the committed count, so the next forward writes
over the rest; a `StaticIndexedLayer` (DSA) does the same with its indexer's keys and
`indexer_cumulative_length`. Sliding-window and linear-attention layers are refused: their
contents cannot be compacted this way (a model with sliding-window layers gets a cache of
`DynamicLayer`s from the engine instead, `windows.py`, or of full `StaticLayer`s under
`compile=True`, `static.py`).
"""

from __future__ import annotations

import torch
from transformers import Cache, EncoderDecoderCache
from transformers.cache_utils import (
    DummyLayer,
    DynamicIndexedLayer,
    DynamicLayer,
    StaticIndexedLayer,
    StaticLayer,
)


def _layers(cache: Cache):
    if isinstance(cache, EncoderDecoderCache):  # decoder-only use of a BERT-style decoder
        cache = cache.self_attention_cache
    for layer in cache.layers:
        if type(layer) is DummyLayer:  # holds nothing (KV-sharing consumers, MLP-only layers)
            continue
        if type(layer) not in (DynamicLayer, DynamicIndexedLayer, StaticLayer,
                               StaticIndexedLayer):
            raise TypeError(
                f"cache layer {type(layer).__name__} cannot be compacted; speculative decoding "
                f"needs DynamicLayer (full attention) layers"
            )
        if layer.is_initialized and layer.keys.numel():
            yield layer


def commit_path(cache: Cache, start: int, keep: torch.Tensor, in_place: bool | None = None) -> None:
    """Keep, per row, the entries `start + keep[b]` in order, at `[start, start + K)`.

    keep: long `[B, K]`, indices relative to `start`, in the tree's node order (root is 0).
    A chain's path (every row keeps `0, 1, ..., K-1`) is in place already: only a crop, which
    saves two gathers and two copies per layer (on a GPU, 4 kernel launches per layer).
    `in_place`: the caller knows whether it is (the engine does, from the tree's shape on the
    host); None compares, which reads the device.
    """
    b, k = keep.shape
    if in_place is None:
        in_place = torch.equal(keep, torch.arange(k, device=keep.device).expand(b, k))
    if in_place:
        crop(cache, start + k)
        return
    for layer in _layers(cache):
        static = isinstance(layer, StaticLayer)  # StaticLayer, StaticIndexedLayer (DSA)
        rows = keep.to(layer.keys.device)[:, None, :, None]  # [B, 1, K, 1]
        for name in ("keys", "values"):
            # MLA models (DeepSeek-V2/V3, ...) cache values of another last dim than the keys
            # (v_head_dim vs qk_head_dim, or the latent vs its rope part): an index per tensor
            full = getattr(layer, name)  # [B, H, start + N, D]
            idx = rows.expand(b, full.shape[1], k, full.shape[3])  # [B, H, K, D]
            picked = full[:, :, start:].gather(2, idx)  # [B, H, K, D]
            full[:, :, start : start + k] = picked
            if not static:
                setattr(layer, name, full[:, :, : start + k])
        if static:
            layer.cumulative_length.fill_(start + k)
        if getattr(layer, "is_indexer_initialized", False):  # DSA: the indexer's keys too
            keys = layer.indexer_keys  # [B, start + N, D] ([B, length, D] static)
            idx = keep.to(keys.device)[..., None].expand(b, k, keys.shape[2])
            keys[:, start : start + k] = keys[:, start:].gather(1, idx)
            if static:
                layer.indexer_cumulative_length.fill_(start + k)
            else:
                layer.indexer_keys = keys[:, : start + k]
            pos = layer.indexer_position_ids  # [P, B, start + N] or None
            if pos is not None:
                idx = keep.to(pos.device)[None].expand(pos.shape[0], b, k)
                pos[..., start : start + k] = pos[..., start:].gather(2, idx)
                layer.indexer_position_ids = pos[..., : start + k]


def crop(cache: Cache, length: int) -> None:
    """Keep the first `length` entries of every layer."""
    for layer in _layers(cache):
        crop_layer(layer, length)


def crop_layer(layer, length: int) -> None:
    """Keep the first `length` entries of one initialized attention layer (DSA's indexer keys
    too): a `StaticLayer`'s tensors stay and its next update writes from `length`."""
    indexed = getattr(layer, "is_indexer_initialized", False)
    if isinstance(layer, StaticLayer):
        layer.cumulative_length.fill_(length)
        if indexed:
            layer.indexer_cumulative_length.fill_(length)
        return
    layer.keys = layer.keys[:, :, :length]
    layer.values = layer.values[:, :, :length]
    if indexed:
        layer.indexer_keys = layer.indexer_keys[:, :length]
        if layer.indexer_position_ids is not None:
            layer.indexer_position_ids = layer.indexer_position_ids[..., :length]
