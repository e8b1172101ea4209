"""Sliding-window targets and drafters (Gemma 2 with soft-capped logits, Gemma 3, Mistral)."""

import pytest
import torch
from spec_helpers import BOS, EOS, PAD, VOCAB, OracleDrafter, RandomDrafter, tiny_llama

from mmspec import ModelDrafter, generate

WINDOW = 8  # far shorter than prompt + new tokens: the window slides through every call


def tiny_gemma2(softcap=1.0, window=WINDOW, seed=0):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(seed)
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


NEW = 24


@pytest.fixture(scope="module")
def gemma2_and_ref():
    target = tiny_gemma2()
    ids = torch.randint(3, VOCAB, (1, 10), generator=torch.Generator().manual_seed(1))
    ref = target.generate(ids, do_sample=False, max_new_tokens=NEW, eos_token_id=[])
    for other in (tiny_gemma2(softcap=None), tiny_gemma2(window=64)):  # both decide tokens here
        assert not torch.equal(other.generate(ids, do_sample=False, max_new_tokens=NEW,
                                               eos_token_id=[]), ref)
    return target, ids, ref


DRAFTERS = {
    "random_tree": lambda ref: RandomDrafter(6, seed=0),
    "perfect_in_tree": lambda ref: OracleDrafter(ref[:, 10:], [10], 4, "tree"),
    "perfect_chain": lambda ref: OracleDrafter(ref[:, 10:], [10], 5, "perfect"),
    "model_tree": lambda ref: ModelDrafter(tiny_llama(1), 10, top_k=3, depth=3),
    "gemma2_chain": lambda ref: ModelDrafter(tiny_gemma2(seed=1), 4),
    "gemma2_tree": lambda ref: ModelDrafter(tiny_gemma2(seed=1), 10, top_k=3, depth=3),
}


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_drafts_on_gemma2_are_token_identical(gemma2_and_ref, drafter):
    # soft-capped logits and sliding-window layers whose window the call outgrows: the block-sparse
    # layer had no soft cap, and transformers' sliding cache drops the entries a rollback needs
    target, ids, ref = gemma2_and_ref
    out = generate(target, DRAFTERS[drafter](ref), ids, max_new_tokens=NEW, eos_token_id=[])
    assert torch.equal(out.sequences, ref)
    if drafter.startswith("perfect"):
        assert out.stats.accepted >= 12  # rolled back and compacted, rounds after rounds
    assert target.config._attn_implementation == "eager"  # given back as it came


def test_gemma2_drafter_is_accepted():
    # a Gemma 2 drafter that is the target itself proposes what the target would say
    target = tiny_gemma2()
    ids = torch.randint(3, VOCAB, (1, 10), generator=torch.Generator().manual_seed(1))
    ref = target.generate(ids, do_sample=False, max_new_tokens=NEW, eos_token_id=[])
    for drafter in (ModelDrafter(tiny_gemma2(), 4), ModelDrafter(tiny_gemma2(), 10, top_k=2)):
        out = generate(target, drafter, ids, max_new_tokens=NEW, eos_token_id=[])
        assert torch.equal(out.sequences, ref)
        assert out.stats.accepted >= 0.9 * (NEW - 1 - out.stats.rounds)


@pytest.mark.parametrize("drafter", ["random_tree", "perfect_chain", "model_chain"])
def test_gemma2_batch_with_holes(drafter):
    # rows accept different numbers of tokens, which leaves holes in the cache slots: the window
    # counts positions, not slots
    target = tiny_gemma2()
    g = torch.Generator().manual_seed(5)
    ids, mask = torch.full((3, 12), PAD), torch.zeros(3, 12, dtype=torch.long)
    for b, n in enumerate([12, 5, 9]):
        ids[b, 12 - n:] = torch.randint(3, VOCAB, (n,), generator=g)
        mask[b, 12 - n:] = 1
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW,
                          pad_token_id=PAD, eos_token_id=[])
    make = {"random_tree": lambda: RandomDrafter(6, seed=2),
            "perfect_chain": lambda: OracleDrafter(ref[:, 12:], mask.sum(1).tolist(), 5,
                                                   "perfect"),
            "model_chain": lambda: ModelDrafter(tiny_gemma2(seed=1), 4)}[drafter]
    out = generate(target, make(), ids, attention_mask=mask, max_new_tokens=NEW,
                   pad_token_id=PAD, eos_token_id=[])
    assert torch.equal(out.sequences, ref)


def _other(kind, seed=0):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, sliding_window=WINDOW,
                  max_position_embeddings=256, pad_token_id=PAD, bos_token_id=BOS,
                  eos_token_id=EOS)
    if kind == "mistral":  # every layer slides
        model = MistralForCausalLM(MistralConfig(num_hidden_layers=2, num_attention_heads=4,
                                                 num_key_value_heads=2, **common))
    else:  # Gemma 3: sliding layers with their own RoPE, then a full one
        model = Gemma3ForCausalLM(Gemma3TextConfig(
            num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"], **common))
    for layer in model.model.layers:
        layer.self_attn.q_proj.weight.data *= 10
        layer.self_attn.k_proj.weight.data *= 10
    return model.eval()


@pytest.mark.parametrize("kind", ["mistral", "gemma3"])
def test_other_sliding_window_models(kind):
    target = _other(kind)
    ids = torch.randint(3, VOCAB, (1, 10), generator=torch.Generator().manual_seed(1))
    ref = target.generate(ids, do_sample=False, max_new_tokens=NEW, eos_token_id=[])
    for drafter in (RandomDrafter(6, seed=0), ModelDrafter(_other(kind), 10, top_k=2)):
        out = generate(target, drafter, ids, max_new_tokens=NEW, eos_token_id=[])
        assert torch.equal(out.sequences, ref)
    assert out.stats.accepted >= 12  # the target drafting for itself
