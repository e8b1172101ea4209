"""The draft heads' tree levels go through the shared block-sparse layer and draft exactly what
dense SDPA with the same token mask drafts: ViSpec's head, EAGLE-1/2, EAGLE-3 and the ViSpec
authors' layout, in a ragged batch where the target takes one; chains and CPUs stay on SDPA."""

import pytest
import torch
from tests.eagle.test_drafter import (
    D,
    FFN,
    HEADS,
    KV_HEADS,
    LAYERS,
    PAD,
    VOCAB,
    _config,
    eagle1_state,
    eagle3_state,
    write,
)
from tests.kernels.test_mask import DeviceReads
from tests.vision.test_vispec_official import official_config, official_state
from tests.vision.tiny_vlms import llava_prompt
from transformers import LlamaConfig, LlamaForCausalLM

from mmspec import EagleDrafter, generate
from mmspec.eagle import drafter as eagle_module
from mmspec.eagle import tree_attention
from mmspec.kernels import BlockSparseMask
from mmspec.vision import ViSpecDrafter
from mmspec.vision import drafter as vispec_module


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=FFN,
                      num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, pad_token_id=PAD, bos_token_id=1,
                      eos_token_id=2)  # test_drafter.py's target: EAGLE-3 reads layers 2, 4, 5
    return LlamaForCausalLM(cfg).eval()


def _llama_batch():
    ids = torch.tensor([[PAD, PAD, PAD, 1, 40, 41, 9], [1, 17, 33, 5, 90, 64, 12]])
    return ids, {"attention_mask": (ids != PAD).long(), "pad_token_id": PAD}


def _eagle(eagle3, layers=1):
    def build(targets, path, **tree):
        llama = targets["llama"]
        config = _config(eagle3, num_hidden_layers=layers)
        state = eagle3_state() if eagle3 else eagle1_state(layers=layers)
        return EagleDrafter.from_pretrained(write(path, config, state), llama, **tree), llama, \
            _llama_batch()
    return build


def _vispec(targets, path, **tree):
    target = targets["llava"]  # ViSpec drafters need a VLM target
    torch.manual_seed(1)
    drafter = ViSpecDrafter.from_target(target, **tree)
    return drafter, target, llava_prompt(images=1, seed=3)


def _official(targets, path, **tree):
    target = targets["llava"]
    path = write(path, official_config(False, kv_heads=2), official_state(6, False, kv_heads=2))
    return ViSpecDrafter.from_pretrained(path, target, **tree), target, \
        llava_prompt(images=1, seed=4)


DRAFTERS = {"eagle1_2layers": _eagle(False, layers=2), "eagle3": _eagle(True),
            "vispec": _vispec, "vispec_official_gqa": _official}


def _run(drafter, target, ids, extras):
    drafts = []
    out = generate(target, drafter, ids, max_new_tokens=10, eos_token_id=[],
                   on_round=lambda d, r, s: drafts.append((d.tokens.tolist(),
                                                           d.parents.tolist())), **extras)
    return out.sequences, drafts


@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_tree_levels_go_through_the_shared_layer_and_draft_what_dense_sdpa_drafts(
        llama, llava, tmp_path, monkeypatch, name):
    """Off a CPU every tree level of every layer calls `block_sparse_attention`; on a CPU
    (SDPA_DEVICES) none does, and both draft the same trees."""
    targets = {"llama": llama, "llava": llava}
    drafter, target, (ids, extras) = DRAFTERS[name](targets, tmp_path / "ckpt", depth=4, top_k=3,
                                                    total_tokens=10)
    eagle = isinstance(drafter, EagleDrafter)  # the ViSpec authors' layout too
    layers = len(drafter.head.blocks if eagle else drafter.head.layers)
    calls = {"levels": 0, "attention": 0}
    real_mask, real_attention = tree_attention.level_mask, tree_attention.block_sparse_attention

    def counted_mask(token_mask):
        calls["levels"] += 1
        return real_mask(token_mask)

    def counted_attention(*args, **kwargs):
        calls["attention"] += 1
        return real_attention(*args, **kwargs)

    monkeypatch.setattr(eagle_module if eagle else vispec_module, "level_mask", counted_mask)
    monkeypatch.setattr(tree_attention, "block_sparse_attention", counted_attention)
    monkeypatch.setattr(tree_attention, "SDPA_DEVICES", ())  # the shared layer everywhere
    shared, shared_drafts = _run(drafter, target, ids, extras)
    assert calls["levels"] >= 3 and calls["attention"] == layers * calls["levels"], calls

    monkeypatch.undo()  # the default SDPA_DEVICES: dense SDPA with the same token masks
    monkeypatch.setattr(tree_attention, "block_sparse_attention", counted_attention)
    calls["attention"] = 0
    dense, dense_drafts = _run(drafter, target, ids, extras)
    assert calls["attention"] == 0
    assert shared_drafts == dense_drafts
    assert torch.equal(shared, dense)
    assert len(shared_drafts[0][0][0]) == 9  # a tree (total_tokens - 1 nodes), not a chain


def test_chains_stay_on_dense_sdpa(llama, tmp_path, monkeypatch):
    drafter, target, (ids, extras) = _eagle(False)({"llama": llama}, tmp_path / "ckpt",
                                                   depth=4, top_k=1, total_tokens=6)

    def refused(*args, **kwargs):
        raise AssertionError("a chain went through the block-sparse layer")

    monkeypatch.setattr(tree_attention, "SDPA_DEVICES", ())  # the shared layer everywhere
    monkeypatch.setattr(tree_attention, "block_sparse_attention", refused)
    _, drafts = _run(drafter, target, ids, extras)
    assert drafts[0][1][0] == [-1, 0, 1, 2]  # round 0: a chain of depth 4


def test_a_level_mask_attends_as_its_token_mask_with_grouped_heads(monkeypatch):
    g = torch.Generator().manual_seed(0)
    b, heads, kv_heads, k, cached, dh = 2, 4, 2, 5, 37, 8
    keys = cached + 2 * k + k  # the cache, two earlier levels, this level
    attends = torch.rand(b, k, keys, generator=g) < 0.6
    attends[..., -k:] = torch.eye(k, dtype=torch.bool)  # each node sees itself
    q = torch.randn(b, heads, k, dh, generator=g)
    kv = [torch.randn(b, kv_heads, keys, dh, generator=g) for _ in range(2)]
    assert tree_attention.level_mask(attends) is attends  # a CPU: SDPA
    monkeypatch.setattr(tree_attention, "SDPA_DEVICES", ())
    with DeviceReads() as reads:  # built without waiting for the device, as on a GPU each level
        mask = tree_attention.level_mask(attends)
    assert reads.count == 0
    assert isinstance(mask, BlockSparseMask) and torch.equal(mask.to_dense()[:, 0], attends)
    shared = tree_attention.attend(q, *kv, mask)
    dense = tree_attention.attend(q, *kv, attends)
    assert torch.equal(shared, dense)  # the same fused CPU kernel under both
    one_node = attends[:, :1]  # a chain's level: SDPA anywhere
    assert tree_attention.level_mask(one_node) is one_node
