"""Sampling is exact: chi-square tests of what `generate` emits against the target's distribution."""

import pytest
import torch
from scipy.stats import chisquare
from spec_helpers import tiny_llama
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from mmspec import Draft, ModelDrafter, generate
from mmspec.decoding.sampling import SamplingConfig, warp_logits
from mmspec.decoding.tree import build_tree
from mmspec.decoding.verify import verify_sampling

V = 5  # tiny vocabulary: the joint of 4 tokens has 5**4 = 625 cells
P_MIN = 1e-3


def hf_probs(logits, temperature=1.0, top_k=None, top_p=None):
    """The target distribution as transformers' own warpers define it (the independent reference)."""
    procs = [TemperatureLogitsWarper(temperature)]
    if top_k is not None:
        procs.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        procs.append(TopPLogitsWarper(top_p))
    return LogitsProcessorList(procs)(None, logits.float()).softmax(-1)


def test_warp_logits_matches_transformers():
    logits = torch.randn(64, 50)
    logits[:, :5] = 1.0  # ties at the top-k and top-p borders
    for t, k, p in [(1.0, None, None), (0.7, 10, None), (1.3, None, 0.8), (0.5, 3, 0.9),
                    (1.0, 1, None), (1.0, None, 0.01)]:
        ours = warp_logits(logits, SamplingConfig(True, t, k, p)).softmax(-1)
        assert torch.allclose(ours, hf_probs(logits, t, k, p), atol=1e-6), (t, k, p)


def _chi2(counts: torch.Tensor, expected_p: torch.Tensor) -> float:
    """p-value of counts against probabilities; zero-probability cells must stay empty."""
    assert counts[expected_p == 0].sum() == 0, "sampled a token the target gives probability 0"
    n = counts.sum()
    exp = expected_p * n
    big, small = exp >= 5, (exp < 5) & (expected_p > 0)  # pool the small cells into one
    obs, e = counts[big].double(), exp[big].double()
    if small.any():
        obs = torch.cat([obs, counts[small].sum()[None].double()])
        e = torch.cat([e, exp[small].sum()[None].double()])
    e = e * obs.sum() / e.sum()
    return chisquare(obs.numpy(), e.numpy()).pvalue


@pytest.mark.parametrize("kind", ["chain_with_probs", "siblings_with_probs", "point_mass_tree"])
def test_verify_sampling_first_token_is_exact(kind):
    """Unit test on synthetic distributions: the first emitted token follows p at the root."""
    torch.manual_seed(0)
    b = 60000
    p = torch.distributions.Dirichlet(torch.full((V,), 0.7)).sample((b, 4))  # [B, N=4, V]
    p = p[:1].expand(b, 4, V).contiguous()  # one target, many independent trials
    q = torch.distributions.Dirichlet(torch.full((V,), 0.7)).sample((1,)).expand(b, V)
    if kind == "chain_with_probs":  # x1 ~ q, x2 ~ q (given x1), x3 ~ q
        tokens = torch.multinomial(q, 3, replacement=True)
        draft = Draft.chain(tokens, q[:, None].expand(b, 3, V))
    elif kind == "siblings_with_probs":  # three i.i.d. children of the root (SpecInfer)
        tokens = torch.multinomial(q, 3, replacement=True)
        draft = Draft(tokens, torch.tensor([-1, -1, -1]), q[:, None].expand(b, 3, V))
    else:  # the drafter's top-3 picks as siblings, no probabilities
        tokens = q[:1].topk(3).indices.expand(b, 3)
        draft = Draft(tokens, torch.tensor([-1, -1, 0]))
    tree = build_tree(torch.zeros(b, dtype=torch.long), draft, V)
    best, bonus = verify_sampling(tree, p)
    # the first emitted token: the depth-1 node on the accepted path, else the bonus
    on_path = tree.anc[torch.arange(b), best] & (tree.depth == 1)
    first = torch.where(on_path.any(-1), (tree.tokens * on_path).sum(-1), bonus)
    counts = torch.bincount(first, minlength=V)
    assert _chi2(counts, p[0, 0]) > P_MIN
    # power: the proposal itself is far from p, so a verifier that accepted blindly would fail
    assert _chi2(torch.bincount(tokens[:, 0], minlength=V), p[0, 0]) < 1e-12


def _scaled_llama(seed, scale):
    model = tiny_llama(seed, vocab=V)
    model.lm_head.weight.data *= scale  # peaked distributions: a wrong sampler shows
    return model


def _exact_joint(model, prompt, n, **warp):
    """`[V] * n` joint distribution of the next n tokens, by enumerating every prefix."""
    joint = torch.ones(1)
    seqs = prompt
    with torch.no_grad():
        for _ in range(n):
            probs = hf_probs(model(seqs).logits[:, -1], **warp)  # [V^i, V]
            joint = (joint[:, None] * probs).reshape(-1)
            seqs = torch.cat([seqs.repeat_interleave(V, 0),
                              torch.arange(V).repeat(seqs.shape[0])[:, None]], 1)
    return joint


@pytest.mark.parametrize("drafter_kind,warp", [
    ("chain_sampled", {"temperature": 0.9, "top_k": 4, "top_p": 0.95}),
    ("tree_point_mass", {"temperature": 1.0}),
])
def test_generate_samples_the_target_joint(drafter_kind, warp):
    """End to end: 4 new tokens for 10000 identical rows, their joint vs the exact one."""
    torch.manual_seed(1)
    target, draft_model = _scaled_llama(0, 60.0), _scaled_llama(1, 60.0)
    drafter = (ModelDrafter(draft_model, 3, temperature=1.0) if drafter_kind == "chain_sampled"
               else ModelDrafter(draft_model, 6, top_k=2, depth=2))
    prompt = torch.tensor([[1, 3, 4, 3]])
    n, new = 10000, 4
    out = generate(target, drafter, prompt.expand(n, -1), max_new_tokens=new, do_sample=True,
                   eos_token_id=[], pad_token_id=0, **warp)
    assert out.stats.accepted > 0 and out.stats.accepted < out.stats.drafted
    cells = (out.sequences[:, -new:] * V ** torch.arange(new - 1, -1, -1)).sum(-1)
    counts = torch.bincount(cells, minlength=V ** new)
    expected = _exact_joint(target, prompt, new, **warp)
    assert _chi2(counts, expected) > P_MIN
    # power: the drafter's own joint is far from the target's at this sample size
    proposal = _exact_joint(draft_model, prompt, new, temperature=1.0)
    chi2_vs_drafter = n * (((proposal - expected) ** 2) / expected.clamp_min(1e-12))[expected > 0].sum()
    assert chi2_vs_drafter > 5 * V ** new


def test_a_sampling_model_drafter_draws_from_generates_generator():
    # the drafter's own draws used the global RNG, so a seeded generator did not repeat a run
    target, drafter_model = tiny_llama(0), tiny_llama(1)
    ids = torch.tensor([[5, 9, 11, 4]])
    runs = []
    for global_seed in range(3):
        torch.manual_seed(global_seed)  # only the global RNG differs between runs
        out = generate(target, ModelDrafter(drafter_model, 4, temperature=1.0), ids,
                       do_sample=True, max_new_tokens=16,
                       generator=torch.Generator().manual_seed(123))
        runs.append(out.sequences[0].tolist())
    assert runs[0] == runs[1] == runs[2]
