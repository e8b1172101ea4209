"""MLA models (DeepSeek-V2/V3, ...) cache values of another last dim than their keys: committing a
tree's accepted path must gather each with an index of its own shape (issue 29). Transformers 5.24
caches DeepSeek-V3's compressed latent `[B, 1, L, kv_lora_rank]` as keys beside its rope part
`[B, 1, L, qk_rope_head_dim]` as values."""

import pytest
import torch
from spec_helpers import VOCAB, OracleDrafter, tiny_deepseek_v3
from transformers import DynamicCache

from mmspec import generate
from mmspec.decoding.kv_cache import commit_path

NEW = 20


def test_commit_path_gathers_values_of_another_width_than_the_keys():
    b, n, start = 2, 7, 3
    cache = DynamicCache()
    for i in range(2):  # keys [B, 1, N, 5], values [B, 1, N, 3]: as an MLA layer caches them
        cache.update(torch.randn(b, 1, n, 5), torch.randn(b, 1, n, 3), i)
    before = [(l.keys.clone(), l.values.clone()) for l in cache.layers]
    keep = torch.tensor([[0, 2, 3], [0, 1, 1]])  # not a chain: the gather, not the crop
    commit_path(cache, start, keep)
    assert cache.get_seq_length() == start + 3
    for (k0, v0), layer in zip(before, cache.layers):
        assert layer.keys.shape == (b, 1, 6, 5) and layer.values.shape == (b, 1, 6, 3)
        for row in range(b):
            for j in range(3):
                src = start + int(keep[row, j])
                assert torch.equal(layer.keys[row, :, start + j], k0[row, :, src])
                assert torch.equal(layer.values[row, :, start + j], v0[row, :, src])
        assert torch.equal(layer.keys[:, :, :start], k0[:, :, :start])
        assert torch.equal(layer.values[:, :, :start], v0[:, :, :start])


def _target_and_ref():
    target = tiny_deepseek_v3(0)
    ids = torch.randint(3, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    return target, ids, target.generate(ids, do_sample=False, max_new_tokens=NEW, eos_token_id=[])


def test_greedy_chain_decoding_of_an_mla_model_is_token_identical():
    target, ids, ref = _target_and_ref()
    out = generate(target, OracleDrafter(ref[:, 8:], [8], 4, "perfect"), ids,
                   max_new_tokens=NEW, eos_token_id=[])
    assert torch.equal(out.sequences, ref)
    assert out.stats.accepted > 0  # the chain fast path (a crop) committed drafts


def test_greedy_tree_decoding_of_an_mla_model_is_token_identical():
    target, ids, ref = _target_and_ref()
    # the true path hides among wrong siblings: every commit gathers, none is a chain's crop
    out = generate(target, OracleDrafter(ref[:, 8:], [8], 4, "tree"), ids,
                   max_new_tokens=NEW, eos_token_id=[])
    assert torch.equal(out.sequences, ref)
    assert out.stats.accepted > 0
