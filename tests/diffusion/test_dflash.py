"""DFlash / DFlash2 drafters: their checkpoints' layout loads, the drafts are their code's, and
decoding through the engine is lossless (greedy token-identical to `target.generate`; sampling
exact by a chi-square test of the joint of the new tokens)."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from mmspec import DFlashDrafter, generate

from .dflash_reference import dflash_raw_config, random_state, reference_generate, write_checkpoint

VOCAB, EOS = 48, 2


def tiny_qwen3(seed=0, vocab=VOCAB, layers=3, init_std=0.3):
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, head_dim=8,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
                      eos_token_id=EOS, initializer_range=init_std, tie_word_embeddings=False)
    return Qwen3ForCausalLM(cfg).eval()


def tiny_llama(seed=0, vocab=VOCAB, layers=3, init_std=0.3):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
                      eos_token_id=EOS, initializer_range=init_std)
    return LlamaForCausalLM(cfg).eval()


def drafter_for(tmp_path, target, seed=0, **kw):
    raw = dflash_raw_config(target, **kw)
    state = random_state(raw, seed)
    path = write_checkpoint(tmp_path / f"ckpt{seed}", raw, state)
    return DFlashDrafter.from_pretrained(path, target), raw, state


PROMPT = torch.tensor([5, 9, 3, 17, 11, 4, 22, 8])
KINDS = {
    "dflash": dict(kind="DFlashDraftModel", is_causal=None),
    "dflash2": dict(kind="DFlash2DraftModel"),
    "dflash2_sliding": dict(kind="DFlash2DraftModel", sliding=True),
    "dflash2_sliding_causal": dict(kind="DFlash2DraftModel", sliding=True, is_causal=None),
    "dflash_scaled_embedding": dict(kind="DFlashDraftModel", input_embedding_scale=2.0,
                                    layer_ids=[0, 2], block=4),
}


@pytest.mark.parametrize("name", list(KINDS))
def test_drafts_equal_their_dflash_generate(tmp_path, name):
    """Round by round, the drafted block of `mmspec.generate` equals the one their loop drafts
    (re-derived in `dflash_reference.py`), and so does the output."""
    target = tiny_qwen3(0)
    drafter, raw, state = drafter_for(tmp_path, target, **KINDS[name])
    new = 20
    expected, their_drafts = reference_generate(state, raw, target, PROMPT, new)
    ours = []
    out = generate(target, drafter, PROMPT[None], max_new_tokens=new, eos_token_id=[],
                   do_sample=False, on_round=lambda d, r, s: ours.append(d.tokens[0].clone()))
    assert torch.equal(out.sequences[0], expected)
    if len(ours[-1]) == 0:  # their last block may draft the final token itself; ours emits it
        ours, last = ours[:-1], their_drafts.pop()  # as the bonus, without a draft
        assert len(last) == 1
    assert len(ours) == len(their_drafts) > 3
    for round_, (a, b) in enumerate(zip(ours, their_drafts)):
        assert torch.equal(a, b), (round_, a, b)


@pytest.mark.parametrize("make", [tiny_qwen3, tiny_llama])
@pytest.mark.parametrize("kind", ["DFlashDraftModel", "DFlash2DraftModel"])
def test_greedy_left_padded_batch_equals_target_generate(tmp_path, make, kind):
    # a 12-token vocabulary: random drafts are accepted now and then, so rows get holes
    target = make(1, vocab=12)
    drafter, _, _ = drafter_for(tmp_path, target, kind=kind, block=8)
    rows = [torch.randint(3, 12, (n,), generator=torch.Generator().manual_seed(n))
            for n in (4, 9, 7)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False,
                               pad_token_id=0)
    out = generate(target, drafter, ids, attention_mask=mask, max_new_tokens=30,
                   do_sample=False, pad_token_id=0)
    assert torch.equal(out.sequences, expected)
    assert 0 < out.stats.accepted < out.stats.drafted
