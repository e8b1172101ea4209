"""Committing an accepted path gathers each row's entries; crop keeps a prefix."""

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicIndexedLayer, StaticIndexedLayer

from mmspec.decoding.kv_cache import commit_path, crop


def _cache(b=2, h=2, n=7, d=3, layers=2):
    cache = DynamicCache()
    for i in range(layers):
        k = torch.arange(b * h * n * d, dtype=torch.float).view(b, h, n, d) + 1000 * i
        cache.update(k, -k, i)
    return cache


def test_commit_path_gathers_rows_independently():
    cache = _cache()
    before = [(l.keys.clone(), l.values.clone()) for l in cache.layers]
    keep = torch.tensor([[0, 2, 3], [0, 1, 1]])  # row 1 accepted less: its last entry is a hole
    commit_path(cache, 3, keep)
    assert cache.get_seq_length() == 6
    for (k0, v0), layer in zip(before, cache.layers):
        assert torch.equal(layer.keys[:, :, :3], k0[:, :, :3])
        for b in range(2):
            assert torch.equal(layer.keys[b, :, 3:], k0[b, :, 3 + keep[b]])
            assert torch.equal(layer.values[b, :, 3:], v0[b, :, 3 + keep[b]])


def test_a_chain_path_keeps_the_first_entries():
    cache = _cache()
    before = [(l.keys.clone(), l.values.clone()) for l in cache.layers]
    commit_path(cache, 3, torch.arange(3).expand(2, 3))  # both rows: root + the first 2 nodes
    assert cache.get_seq_length() == 6
    for (k0, v0), layer in zip(before, cache.layers):
        assert torch.equal(layer.keys, k0[:, :, :6]) and torch.equal(layer.values, v0[:, :, :6])


def test_crop():
    cache = _cache()
    crop(cache, 4)
    assert cache.get_seq_length() == 4 and all(l.values.shape[2] == 4 for l in cache.layers)


def _indexed(layer_type, b=2, n=7, length=12):
    """A DSA layer holding n entries: keys/values `[B, 2, n, 3]`, indexer keys `[B, n, 4]`."""
    layer = layer_type(max_cache_len=length) if layer_type is StaticIndexedLayer else layer_type()
    k = torch.arange(b * 2 * n * 3, dtype=torch.float).view(b, 2, n, 3)
    layer.update(k, -k)
    layer.update_indexer(torch.arange(b * n * 4, dtype=torch.float).view(b, n, 4) + 0.5)
    return layer


def test_a_static_dsa_layer_commits_its_indexer_keys_in_place():
    # compile=True (static.py): the StaticIndexedLayer keeps its buffers, gathers the path into
    # [start, start + K) of the keys, values and indexer keys alike, and sets both lengths
    keep = torch.tensor([[0, 2, 3], [0, 1, 1]])
    dynamic, static = (_indexed(t) for t in (DynamicIndexedLayer, StaticIndexedLayer))
    buffer, before = static.indexer_keys, static.indexer_keys[:, :7].clone()
    for layer in (dynamic, static):
        cache = DynamicCache()
        cache.layers = [layer]
        commit_path(cache, 3, keep)
    assert static.indexer_keys is buffer and static.keys.shape[2] == 12
    assert int(static.cumulative_length) == int(static.indexer_cumulative_length) == 6
    for b in range(2):
        assert torch.equal(static.indexer_keys[b, 3:6], before[b, 3 + keep[b]])
    assert torch.equal(static.indexer_keys[:, :6], dynamic.indexer_keys)
    assert torch.equal(static.keys[:, :, :6], dynamic.keys)
    assert torch.equal(static.values[:, :, :6], dynamic.values)
    crop(cache, 4)
    assert int(static.cumulative_length) == int(static.indexer_cumulative_length) == 4
