"""`repetition_penalty` applies as transformers' `RepetitionPenaltyLogitsProcessor`, greedy or
sampled, with every tree node penalised on its own path (Qwen2.5-Instruct ships 1.05 in its
generation config: `generate` refused such targets before)."""

import pytest
import torch
from scipy.stats import chisquare
from spec_helpers import EOS, PAD, tiny_llama
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from mmspec import ModelDrafter, PromptLookupDrafter, generate


@pytest.mark.parametrize("where", ["argument", "generation_config"])
@pytest.mark.parametrize("drafter", ["chain", "tree", "prompt_lookup"])
def test_greedy_with_a_penalty_equals_target_generate(where, drafter):
    target, small = tiny_llama(0), tiny_llama(1)
    ids = torch.tensor([[PAD, PAD, 5, 9, 5, 9, 5], [11, 4, 8, 4, 8, 4, 8]])
    mask = (ids != PAD).long()
    make = {"chain": lambda: ModelDrafter(small, 4),
            "tree": lambda: ModelDrafter(small, 8, top_k=2, depth=3),
            "prompt_lookup": lambda: PromptLookupDrafter(num_tokens=4)}[drafter]
    kwargs = {"repetition_penalty": 2.5} if where == "argument" else {}
    if where == "generation_config":
        target.generation_config.repetition_penalty = 2.5
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                               pad_token_id=PAD, eos_token_id=EOS, **kwargs)
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                            pad_token_id=PAD, eos_token_id=EOS, repetition_penalty=1.0)
    assert not torch.equal(expected, plain)  # the penalty changes this output
    out = generate(target, make(), ids, attention_mask=mask, max_new_tokens=24,
                   pad_token_id=PAD, eos_token_id=EOS, do_sample=False, **kwargs)
    assert torch.equal(out.sequences, expected)
    if drafter != "prompt_lookup":  # a penalised output repeats nothing for it to look up
        assert out.stats.accepted > 0


def test_sampling_with_a_penalty_draws_from_the_target_joint():
    """3 new tokens for 6000 identical rows: their joint vs the exact one (penalty, T=1)."""
    vocab, new, rows, penalty = 5, 3, 6000, 3.0
    target, small = tiny_llama(0, vocab=vocab), tiny_llama(1, vocab=vocab)
    target.lm_head.weight.data *= 20.0  # peaked: a missing penalty shows
    prompt = torch.tensor([[1, 3, 3, 4]])
    joint, seqs = torch.ones(1), prompt
    hf = RepetitionPenaltyLogitsProcessor(penalty)
    with torch.no_grad():
        for _ in range(new):
            logits = hf(seqs, target(seqs).logits[:, -1].float())
            joint = (joint[:, None] * logits.softmax(-1)).reshape(-1)
            seqs = torch.cat([seqs.repeat_interleave(vocab, 0),
                              torch.arange(vocab).repeat(seqs.shape[0])[:, None]], 1)
    torch.manual_seed(0)
    out = generate(target, ModelDrafter(small, 4, top_k=2, depth=2), prompt.expand(rows, -1),
                   max_new_tokens=new, do_sample=True, temperature=1.0, top_k=None,
                   eos_token_id=[], pad_token_id=0, repetition_penalty=penalty)
    cells = (out.sequences[:, -new:] * vocab ** torch.arange(new - 1, -1, -1)).sum(-1)
    counts = torch.bincount(cells, minlength=vocab ** new).double()
    keep = joint > 0
    # the joint is a float32 product: renormalise in float64, since scipy's chisquare asks the
    # expected counts to sum to the observed ones within 1.5e-8
    expected = joint[keep].double() / joint[keep].double().sum() * rows
    assert chisquare(counts[keep], expected).pvalue > 1e-3
    # power: the joint without the penalty is far from it at this sample size
    plain = generate(target, PromptLookupDrafter(), prompt.expand(rows, -1), max_new_tokens=new,
                     do_sample=True, temperature=1.0, top_k=None, eos_token_id=[], pad_token_id=0)
    cells = (plain.sequences[:, -new:] * vocab ** torch.arange(new - 1, -1, -1)).sum(-1)
    counts = torch.bincount(cells, minlength=vocab ** new).double()
    assert chisquare(counts[keep], expected).pvalue < 1e-6


@pytest.mark.parametrize("value", [0.0, -1.0, "1.1", True])
def test_a_bad_penalty_is_named(value):
    with pytest.raises(ValueError, match=r"repetition_penalty must be a number > 0, got"):
        generate(tiny_llama(0), PromptLookupDrafter(), torch.tensor([[5, 6, 7]]),
                 repetition_penalty=value)
