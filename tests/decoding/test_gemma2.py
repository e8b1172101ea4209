"""Gemma 2 targets: attention logits soft-capped and every other layer a sliding window."""

import pytest
import torch
from spec_helpers import BOS, EOS, PAD, VOCAB, OracleDrafter, RandomDrafter, tiny_llama

from mmspec import ModelDrafter, generate


def tiny_gemma2(softcap=1.0, window=64):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    cfg = Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       head_dim=16, attn_logit_softcapping=softcap, sliding_window=window,
                       final_logit_softcapping=30.0, max_position_embeddings=256,
                       pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    model = Gemma2ForCausalLM(cfg).eval()
    for layer in model.model.layers:  # logits of a few units: a cap of 1 changes the softmax
        layer.self_attn.q_proj.weight.data *= 30
        layer.self_attn.k_proj.weight.data *= 30
    return model


@pytest.fixture(scope="module")
def gemma2_and_ref():
    target = tiny_gemma2()
    ids = torch.randint(3, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    ref = target.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=[])
    uncapped = tiny_gemma2(softcap=None).generate(ids, do_sample=False, max_new_tokens=24,
                                                  eos_token_id=[])
    assert not torch.equal(uncapped, ref)  # the soft cap decides tokens here
    return target, ids, ref


@pytest.mark.parametrize("drafter", ["random_tree", "perfect_in_tree", "model_tree"])
def test_tree_drafts_on_gemma2_are_token_identical(gemma2_and_ref, drafter):
    # the layers soft-cap their logits and half of them have sliding-window caches: both used to
    # be refused (the block-sparse layer had no soft cap, the cache could not be rolled back)
    target, ids, ref = gemma2_and_ref
    make = {"random_tree": lambda: RandomDrafter(6, seed=0),
            "perfect_in_tree": lambda: OracleDrafter(ref[:, 8:], [8], 4, "tree"),
            "model_tree": lambda: ModelDrafter(tiny_llama(1), 10, top_k=3, depth=3)}[drafter]
    out = generate(target, make(), ids, max_new_tokens=24, eos_token_id=[])
    assert torch.equal(out.sequences, ref)
    if drafter == "perfect_in_tree":
        assert out.stats.accepted >= 12  # rolled back and compacted, rounds after rounds
    assert target.config._attn_implementation == "eager"  # given back as it came


def test_a_generation_longer_than_the_window_is_refused_up_front(gemma2_and_ref):
    target, ids, _ = gemma2_and_ref
    with pytest.raises(NotImplementedError, match=r"prompt \+ max_new_tokens = 64 tokens reach "
                                                  r"a sliding-window layer's window"):
        generate(target, RandomDrafter(6, seed=0), ids, max_new_tokens=56, eos_token_id=[])
