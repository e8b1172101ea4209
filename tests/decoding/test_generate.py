"""Lossless greedy: `mmspec.generate` returns exactly `target.generate(do_sample=False)`'s tokens."""

import pytest
import torch
from spec_helpers import (
    BOS,
    EOS,
    PAD,
    VOCAB,
    OracleDrafter,
    RandomDrafter,
    llava_inputs,
    qwen_vl_inputs,
    tiny_llama,
    tiny_llava,
    tiny_qwen2,
    tiny_qwen2_5_vl,
)

from mmspec import ModelDrafter, PromptLookupDrafter, generate

NEW = 24


def _text_inputs(seed=0, length=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (1, length), generator=g), {}


TARGETS = {
    "llama": (tiny_llama, _text_inputs),
    "qwen2": (tiny_qwen2, _text_inputs),
    "llava": (tiny_llava, llava_inputs),
    "qwen2_5_vl": (tiny_qwen2_5_vl, qwen_vl_inputs),
}


@pytest.fixture(scope="module", params=list(TARGETS))
def case(request):
    build, inputs = TARGETS[request.param]
    target = build(0)
    ids, kwargs = inputs(0)
    ref = target.generate(ids, do_sample=False, max_new_tokens=NEW, **kwargs)
    return target, ids, kwargs, ref


_DRAFT_MODEL = {}


def _draft_model():
    if "m" not in _DRAFT_MODEL:
        _DRAFT_MODEL["m"] = tiny_llama(1)
    return _DRAFT_MODEL["m"]


def make_drafter(name, ids, ref):
    prompt = [ids.shape[1]] * ids.shape[0]
    new = ref[:, ids.shape[1]:]
    return {
        "always_wrong": lambda: OracleDrafter(new, prompt, 4, "wrong"),
        "random_tree": lambda: RandomDrafter(6, seed=0),
        "perfect_chain": lambda: OracleDrafter(new, prompt, 5, "perfect"),
        "perfect_in_tree": lambda: OracleDrafter(new, prompt, 4, "tree"),
        "model_chain": lambda: ModelDrafter(_draft_model(), 4),
        "model_tree": lambda: ModelDrafter(_draft_model(), 10, top_k=3, depth=3),
        "prompt_lookup": lambda: PromptLookupDrafter(4, 2),
    }[name]()


@pytest.mark.parametrize("drafter_name", ["always_wrong", "random_tree", "perfect_chain",
                                          "perfect_in_tree", "model_chain", "model_tree",
                                          "prompt_lookup"])
def test_greedy_is_token_identical(case, drafter_name):
    target, ids, kwargs, ref = case
    drafter = make_drafter(drafter_name, ids, ref)
    out = generate(target, drafter, ids, max_new_tokens=NEW, **kwargs)
    assert torch.equal(out.sequences, ref)
    s = out.stats
    assert s.new_tokens == ref.shape[1] - ids.shape[1]
    if drafter_name == "always_wrong":
        assert s.accepted == 0 and s.drafted > 0
    if drafter_name in ("perfect_chain", "perfect_in_tree"):
        # every committed token but the prefill's and one bonus per round was a draft token
        assert s.new_tokens - 1 - s.rounds <= s.accepted <= s.new_tokens - 1
        assert s.rounds <= -(-(s.new_tokens - 1) // 5) + 1


@pytest.fixture(scope="module")
def llama_and_ref():
    target = tiny_llama(0)
    ids, _ = _text_inputs(3, 6)
    ref = target.generate(ids, do_sample=False, max_new_tokens=16, eos_token_id=EOS)
    return target, ids, ref


def test_eos_inside_a_draft(llama_and_ref):
    target, ids, ref = llama_and_ref
    new = ref[0, ids.shape[1]:]
    j = next(j for j in range(3, len(new)) if new[j] not in new[:j])  # first time a token appears
    eos = int(new[j])
    ref_eos = target.generate(ids, do_sample=False, max_new_tokens=16, eos_token_id=eos)
    assert ref_eos.shape[1] == ids.shape[1] + j + 1  # the reference stops at that token
    drafter = OracleDrafter(new[None], [ids.shape[1]], 10, "perfect")
    out = generate(target, drafter, ids, max_new_tokens=16, eos_token_id=eos)
    assert torch.equal(out.sequences, ref_eos)
    assert out.stats.rounds == 1  # EOS came in the middle of the first draft, which was accepted


@pytest.mark.parametrize("max_new", [1, 2, 5])
def test_max_new_tokens_mid_draft(llama_and_ref, max_new):
    target, ids, ref = llama_and_ref
    new = ref[0, ids.shape[1]:]
    assert EOS not in new[:max_new].tolist()
    drafter = OracleDrafter(new[None], [ids.shape[1]], 8, "perfect")
    out = generate(target, drafter, ids, max_new_tokens=max_new, eos_token_id=EOS)
    assert torch.equal(out.sequences, ref[:, : ids.shape[1] + max_new])
    assert out.stats.rounds == (0 if max_new == 1 else 1)
    assert drafter.updates == drafter.rounds  # a budget-capped round proposes nothing


def _left_padded_batch():
    g = torch.Generator().manual_seed(5)
    lengths = [9, 4, 6]
    ids = torch.full((3, 9), PAD)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, 9 - n:] = torch.randint(3, VOCAB, (n,), generator=g)
        mask[b, 9 - n:] = 1
    return ids, mask


@pytest.mark.parametrize("drafter_name", ["random_tree", "perfect_chain", "model_chain",
                                          "model_tree", "prompt_lookup"])
def test_batch_rows_of_different_lengths(drafter_name):
    target = tiny_llama(0)
    ids, mask = _left_padded_batch()
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                          pad_token_id=PAD)
    # a per-row EOS: row 1 stops early at a token that only it produces soon
    new = ref[:, ids.shape[1]:]
    eos = int(new[1, 4])
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                          pad_token_id=PAD, eos_token_id=eos)
    prompt = mask.sum(1).tolist()
    drafter = {
        "random_tree": lambda: RandomDrafter(6, seed=1),
        "perfect_chain": lambda: OracleDrafter(ref[:, ids.shape[1]:], prompt, 5, "perfect"),
        "model_chain": lambda: ModelDrafter(_draft_model(), 4),
        "model_tree": lambda: ModelDrafter(_draft_model(), 10, top_k=3, depth=3),
        "prompt_lookup": lambda: PromptLookupDrafter(4, 2),
    }[drafter_name]()
    out = generate(target, drafter, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=eos)
    assert torch.equal(out.sequences, ref)
    assert (out.sequences[1, ids.shape[1]:] == PAD).any()  # row 1 really finished first


def _gptj():
    from transformers import GPTJConfig, GPTJForCausalLM

    torch.manual_seed(0)
    return GPTJForCausalLM(GPTJConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                      rotary_dim=4, n_positions=256, pad_token_id=PAD,
                                      bos_token_id=BOS, eos_token_id=EOS)).eval()


def _stablelm():
    from transformers import StableLmConfig, StableLmForCausalLM

    torch.manual_seed(0)
    return StableLmForCausalLM(StableLmConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)).eval()


@pytest.mark.parametrize("make", [_gptj, _stablelm])
def test_tree_drafts_are_refused_where_the_tree_mask_cannot_reach_the_layers(make):
    # GPT-J's attention bypassed transformers' AttentionInterface before transformers 5.24 and
    # StableLM's layers drop **kwargs: tree verification attended with the plain causal mask and
    # silently returned another continuation than target.generate. A tree draft is now either
    # refused by name or lossless (GPT-J on transformers >= 5.24 takes the mask); chains need no
    # mask and stay lossless everywhere
    target = make()
    # several prompts: at seed 1 alone a layer that ignored the mask returned the same tokens
    for seed in range(1, 6):
        ids = torch.randint(3, VOCAB, (1, 8), generator=torch.Generator().manual_seed(seed))
        ref = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=12, eos_token_id=[])
        try:  # the engine's audit decides: the mask reached every attention call, or an error
            out = generate(target, OracleDrafter(ref[:, 8:], [8], 4, "tree"), ids,
                           max_new_tokens=12, eos_token_id=[])
        except NotImplementedError as e:
            assert "cannot take block_sparse_mask: none of its attention calls received it" \
                in str(e)
        else:
            assert torch.equal(out.sequences, ref), seed
            assert out.stats.drafted > out.stats.row_rounds * 4  # really verified trees
        out = generate(target, OracleDrafter(ref[:, 8:], [8], 4, "perfect"), ids,
                       max_new_tokens=12, eos_token_id=[])
        assert torch.equal(out.sequences, ref)


def test_tau_counts_only_committed_tokens():
    # EOS inside an accepted draft ends the round without a bonus token: tau counted one anyway
    target = tiny_llama(0)
    ids = torch.randint(3, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    ref = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=12, eos_token_id=[])[:, 8:]
    eos = int(ref[0, 3])  # the 4th new token: inside the first (perfect) 6-token draft
    out = generate(target, OracleDrafter(ref, [8], 6, "perfect"), ids, max_new_tokens=12,
                   eos_token_id=eos)
    stats = out.stats
    assert out.sequences.shape[1] - ids.shape[1] == 4 and stats.row_rounds == 1
    assert stats.committed == 3 and stats.mean_accepted == 3.0  # the prefill's token not a round
    assert stats.mean_accepted_no_bonus == 3.0  # all three came from the draft


def test_a_pad_token_in_a_prompt_without_mask_is_padding():
    # target.generate reads a prompt holding the pad id (not an EOS id) as left-padded there
    target = tiny_llama(0)
    ids = torch.tensor([[PAD, PAD, 5, 6, 7], [8, 9, 10, 11, 12]])
    ref = target.generate(ids, do_sample=False, max_new_tokens=10, pad_token_id=PAD,
                          eos_token_id=[])
    assert not torch.equal(ref, target.generate(ids, attention_mask=torch.ones_like(ids),
                                                do_sample=False, max_new_tokens=10,
                                                pad_token_id=PAD, eos_token_id=[]))
    out = generate(target, RandomDrafter(6, seed=0), ids, max_new_tokens=10, pad_token_id=PAD,
                   eos_token_id=[])
    assert torch.equal(out.sequences, ref)


def test_positions_stay_within_the_budget():
    # GPT-2's position table ends at prompt + max_new_tokens: a finished row kept drafting and
    # advancing, and a draft deeper than the budget was verified past the table (IndexError)
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    target = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                        n_positions=24, pad_token_id=PAD, bos_token_id=BOS,
                                        eos_token_id=EOS)).eval()
    ids = torch.randint(3, VOCAB, (2, 4), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                          pad_token_id=PAD, eos_token_id=[])
    eos = int(ref[0, 6])  # row 0 stops at its 3rd new token, row 1 runs to the budget
    assert eos not in ref[1, 4:].tolist()
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                          pad_token_id=PAD, eos_token_id=eos)
    for drafter in (OracleDrafter(ref[:, 4:], [4, 4], 3, "perfect"),
                    OracleDrafter(ref[:, 4:], [4, 4], 30, "wrong"), RandomDrafter(30, seed=3)):
        out = generate(target, drafter, ids, attention_mask=mask, max_new_tokens=20,
                       pad_token_id=PAD, eos_token_id=eos)
        assert torch.equal(out.sequences, ref)
