"""Committing an accepted path gathers each row's entries; crop keeps a prefix."""

import torch
from transformers import DynamicCache

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
