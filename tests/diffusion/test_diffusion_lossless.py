"""Lossless decoding through the engine's `generate` with a tiny random Qwen2 target and a tiny Qwen2
run bidirectionally as the DLM. The DLM carries the target's weights, so some drafts are accepted
and both the accept and the reject branches run (asserted)."""

import pytest
import torch

from mmspec.decoding import generate
from mmspec.diffusion import (
    CausalLMProxy,
    CPSConfig,
    DiffusionDrafter,
    DiffusionDrafterConfig,
    NaiveDiffusionDrafter,
)

from .models import EOS, MASK, VOCAB, tiny_qwen2

NEW = 24


@pytest.fixture(scope="module")
def shared_dlm():
    return tiny_qwen2(0)


@pytest.fixture(scope="module")
def prompts():
    return torch.randint(2, 60, (3, 10), generator=torch.Generator().manual_seed(5))


DRAFTERS = {
    "naive": lambda m, t: NaiveDiffusionDrafter(m, MASK, t, k=8),
    "cps_adl_ngram": lambda m, t: DiffusionDrafter(m, MASK, t),
    "cps_tree": lambda m, t: DiffusionDrafter(
        m, MASK, t, config=DiffusionDrafterConfig(return_tree=True)),
    "cps_lm_proxy": lambda m, t: DiffusionDrafter(
        m, MASK, t, proxy=lambda: CausalLMProxy(tiny_qwen2(3, layers=1)),
        config=DiffusionDrafterConfig(fixed_k=10)),
    "cps_adl_prefix_cache": lambda m, t: DiffusionDrafter(
        m, MASK, t, config=DiffusionDrafterConfig(prefix_cache=True)),
    "llada_style_no_shift": lambda m, t: DiffusionDrafter(
        m, MASK, t, config=DiffusionDrafterConfig(shift=False, cps=CPSConfig(beam_width=2))),
}


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_equals_target_greedy(target, shared_dlm, prompts, name):
    expected = target.generate(prompts, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                               eos_token_id=EOS)
    out = generate(target, DRAFTERS[name](shared_dlm, target), prompts, max_new_tokens=NEW,
                   pad_token_id=0)
    assert torch.equal(out.sequences, expected)
    assert 0 < out.stats.accepted < out.stats.drafted


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_greedy_left_padded_batch_equals_each_row_alone(target, shared_dlm, prefix_cache):
    rows = [torch.randint(2, 60, (n,), generator=torch.Generator().manual_seed(n))
            for n in (4, 9, 7)]
    ids = torch.zeros(3, 9, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, 9 - row.numel():], mask[b, 9 - row.numel():] = row, 1
    widths = []
    hook = shared_dlm.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
        with_kwargs=True)
    drafter = DiffusionDrafter(shared_dlm, MASK, target,
                               config=DiffusionDrafterConfig(prefix_cache=prefix_cache))
    try:
        out = generate(target, drafter, ids, attention_mask=mask, max_new_tokens=16,
                       pad_token_id=0)
    finally:
        hook.remove()
    if prefix_cache:  # later rounds read the cache: the DLM sees fewer columns than the sequence
        assert min(widths[1:]) < 9 + 20, widths
    for b, row in enumerate(rows):
        alone = target.generate(row[None], max_new_tokens=16, do_sample=False, pad_token_id=0,
                                eos_token_id=EOS)[0, row.numel():]
        got = out.sequences[b, 9:9 + alone.numel()]
        assert torch.equal(got, alone)


@torch.no_grad()
def exact_marginals(target, prompt, steps):
    """Exact distributions of new tokens 1..steps of `target` sampled at T=1: a list of `[V]`."""
    seqs, weights = prompt[None], torch.ones(1, dtype=torch.float64)
    marginals = []
    for _ in range(steps):
        probs = torch.softmax(target(input_ids=seqs).logits[:, -1].double(), -1)  # [n, V]
        joint = weights[:, None] * probs  # [n, V]
        marginals.append(joint.sum(0))
        seqs = torch.cat([seqs.repeat_interleave(VOCAB, 0),
                          torch.arange(VOCAB).repeat(seqs.shape[0])[:, None]], dim=1)
        weights = joint.flatten()
    return marginals


def chi_square_p_value(samples: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test of `samples` (long `[N]`) against the distribution `expected` `[V]`; cells
    expecting fewer than 5 draws are pooled into one."""
    n = samples.numel()
    observed = torch.bincount(samples, minlength=expected.numel()).double()
    big = expected * n >= 5
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]]) * n
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2))


def sample_rows(target, drafter, prompt, rows, seed):
    ids = prompt[None].repeat(rows, 1)
    out = generate(target, drafter, ids, max_new_tokens=3, do_sample=True, pad_token_id=0,
                   eos_token_id=[], generator=torch.Generator().manual_seed(seed))
    return out, out.sequences[:, prompt.numel():]


def test_sampling_is_exact_with_the_point_mass_proposal(target, shared_dlm):
    """Tokens 2 and 3 go through draft verification (token 1 comes from the prefill)."""
    prompt = torch.randint(2, 60, (8,), generator=torch.Generator().manual_seed(11))
    marginals = exact_marginals(target, prompt, 3)
    drafter = DiffusionDrafter(shared_dlm, MASK, target)
    out, new = sample_rows(target, drafter, prompt, 1500, seed=0)
    assert 0 < out.stats.accepted < out.stats.drafted
    for step in (1, 2):
        assert chi_square_p_value(new[:, step], marginals[step]) > 1e-3


def test_the_papers_rule_is_biased_which_is_why_it_is_labelled_approximate(target, shared_dlm):
    """Same test, `proposal="approximate_l2r"`: q is the lattice marginal but the token was picked
    by search, not sampled from q, so the output distribution is off (and the test above can
    fail)."""
    prompt = torch.randint(2, 60, (8,), generator=torch.Generator().manual_seed(11))
    marginals = exact_marginals(target, prompt, 2)
    config = DiffusionDrafterConfig(proposal="approximate_l2r")
    drafter = DiffusionDrafter(shared_dlm, MASK, target, config=config)
    _, new = sample_rows(target, drafter, prompt, 1500, seed=0)
    assert chi_square_p_value(new[:, 1], marginals[1]) < 1e-6


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_a_drafter_narrower_than_the_target_reads_ids_it_lacks_as_masks(target, prefix_cache):
    """A 60-token DLM (and proxy LM) for a 64-token target: ids 60-63 in the prompt or the
    output crashed its embedding with an IndexError."""
    narrow = tiny_qwen2(1, vocab=60)
    proxy_lm = tiny_qwen2(2, vocab=60)
    ids = torch.tensor([[5, 62, 7, 61, 9, 63, 5, 62]])
    ref = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                          do_sample=False, eos_token_id=EOS)
    for proxy in (None, lambda: CausalLMProxy(proxy_lm)):
        drafter = DiffusionDrafter(narrow, 59, target, proxy=proxy,
                                   config=DiffusionDrafterConfig(prefix_cache=prefix_cache,
                                                                 cps=CPSConfig(lam=0.5)))
        out = generate(target, drafter, ids, max_new_tokens=16)
        assert torch.equal(out.sequences, ref)
