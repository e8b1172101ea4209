"""The built-in drafters: prompt lookup rules, model drafter trees and its cache kept in step."""

import pytest
import torch
from spec_helpers import tiny_llama

from mmspec import ModelDrafter, PromptLookupDrafter, generate
from mmspec.decoding.draft import DraftState


def _state(ids, max_tokens=8, round_=1):
    ids = torch.tensor(ids)
    return DraftState(ids, torch.ones_like(ids), max_tokens, round=round_)


def test_prompt_lookup_follows_the_first_earlier_match():
    drafter = PromptLookupDrafter(num_tokens=3, max_ngram_size=2)
    # suffix (7, 8) occurred at 1..2, followed by 9 10 11
    draft = drafter.propose(_state([[5, 7, 8, 9, 10, 11, 7, 8]]))
    assert draft.tokens.tolist() == [[9, 10, 11]] and draft.num_tokens.tolist() == [3]
    # no bigram match, unigram 8 matches at 2: followed by 4
    draft = drafter.propose(_state([[5, 8, 4, 3, 8]], max_tokens=1))
    assert draft.tokens.tolist() == [[4]]


def test_prompt_lookup_rows_without_match_draft_nothing():
    drafter = PromptLookupDrafter(num_tokens=2)
    draft = drafter.propose(_state([[1, 2, 3, 1], [4, 5, 6, 7]]))
    assert draft.num_tokens.tolist() == [2, 0] and draft.tokens[0].tolist() == [2, 3]


def test_model_drafter_tree_is_closed_and_within_budget():
    drafter = ModelDrafter(tiny_llama(1), num_tokens=7, top_k=3, depth=3)
    draft = drafter.propose(_state([[5, 6, 7, 8], [9, 10, 11, 12]], round_=0))
    assert draft.tokens.shape == (2, 7) and draft.probs is None
    idx = torch.arange(7)
    assert ((draft.parents >= -1) & (draft.parents < idx)).all()  # parents first, all present
    # the drafter's cache holds only committed slots after drafting a tree
    assert drafter.cache.get_seq_length() == 4


def test_self_drafting_accepts_everything():
    """Drafter == target: every draft token is right if the drafter's cache stays in step."""
    target = tiny_llama(0)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    out = generate(target, ModelDrafter(target, 4), ids, max_new_tokens=21, eos_token_id=[])
    assert out.stats.accepted == out.stats.drafted == 16 and out.stats.rounds == 4  # 1 + 4 * 5
    # a full tree (budget = every candidate) holds the greedy path at every depth
    tree = ModelDrafter(target, num_tokens=3 + 9 + 9, top_k=3, depth=3)
    out = generate(target, tree, ids, max_new_tokens=21, eos_token_id=[])
    assert out.stats.accepted == 15 and out.stats.rounds == 5  # 1 + 5 * (3 + 1)


class _CheckedDrafter:
    """Runs a stateful ModelDrafter and checks every draft against one recomputed from scratch."""

    def __init__(self, model, **kwargs):
        self.live, self.model, self.kwargs = ModelDrafter(model, **kwargs), model, kwargs
        self.checked = 0

    def propose(self, state):
        draft = self.live.propose(state)
        fresh_state = DraftState(state.input_ids, state.attention_mask, state.max_tokens, round=0)
        fresh = ModelDrafter(self.model, **self.kwargs).propose(fresh_state)
        assert torch.equal(draft.tokens, fresh.tokens) and torch.equal(draft.parents, fresh.parents)
        self.checked += 1
        return draft

    def update(self, result):
        self.live.update(result)


def test_model_drafter_cache_stays_in_step_with_holes():
    """A batch whose rows accept different lengths (holes in the slots): the drafter's reused
    cache gives the same drafts as a fresh drafter over the same committed slots."""
    from test_generate import _left_padded_batch

    target, draft_model = tiny_llama(0), tiny_llama(0)
    with torch.no_grad():  # a perturbed copy of the target: it agrees often, not always
        draft_model.lm_head.weight += 0.5 * draft_model.lm_head.weight.std() * torch.randn(
            draft_model.lm_head.weight.shape, generator=torch.Generator().manual_seed(0))
    ids, mask = _left_padded_batch()
    for kwargs in ({"num_tokens": 4}, {"num_tokens": 6, "top_k": 2, "depth": 3}):
        drafter = _CheckedDrafter(draft_model, **kwargs)
        for prompt in (ids, ids.flip(0)):  # a second call must not reuse the first one's cache
            out = generate(target, drafter, prompt, attention_mask=mask.flip(0) if prompt is not ids
                           else mask, max_new_tokens=16, eos_token_id=[])
            assert out.stats.rounds >= 4
            s = out.stats
            assert 0.1 * s.drafted < s.accepted < 0.9 * s.drafted, s  # partial acceptance: holes
        assert drafter.checked >= 2 * 4


def _bigram(model, gap):
    """The drafter's logits depend on the input token t only: t+1 at 0, t+2 at -gap, the rest
    at -1000 (log-probs about 0, -gap, -1000)."""
    def hook(module, args, kwargs, out):
        ids, vocab = kwargs["input_ids"], out.logits.shape[-1]
        logits = torch.full((*ids.shape, vocab), -1000.0)
        logits.scatter_(-1, ((ids + 1) % vocab)[..., None], 0.0)
        logits.scatter_(-1, ((ids + 2) % vocab)[..., None], -gap)
        out.logits = logits

    model.register_forward_hook(hook, with_kwargs=True)
    return model


def test_model_drafter_tree_is_closed_when_scores_fall_below_float32_epsilon():
    # below about -32 float32 loses the epsilon: a child ties its parent and must not outrank it
    model = _bigram(tiny_llama(1), gap=40.0)
    for top_k, n, depth in ((2, 5, 3), (3, 6, 3), (4, 9, 4)):
        draft = ModelDrafter(model, num_tokens=n, top_k=top_k, depth=depth).propose(
            _state([[5, 6, 7, 8]], round_=0))
        tokens, parents = draft.tokens[0].tolist(), draft.parents.reshape(-1, n)[0].tolist()
        for tok, parent in zip(tokens, parents):
            prev = 8 if parent < 0 else tokens[parent]  # each node is one of its parent's top 2
            assert tok - prev in (1, 2), (top_k, tokens, parents)


def test_model_drafter_gives_the_model_back_after_generate():
    target, model = tiny_llama(0), tiny_llama(1)
    model.set_attn_implementation("eager")
    drafter = ModelDrafter(model, num_tokens=6, top_k=2, depth=3)
    assert model.config._attn_implementation == "eager"
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    out = generate(target, drafter, ids, max_new_tokens=8, eos_token_id=[])
    assert out.stats.drafted > 0 and model.config._attn_implementation == "eager"
    assert drafter.cache is None and drafter.fed_ids is None  # no per-call tensors held

    def fail(draft, result, stats):
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        generate(target, drafter, ids, max_new_tokens=8, on_round=fail)
    assert model.config._attn_implementation == "eager" and drafter.cache is None
    # self-drafting: the target's own attention comes back too
    generate(target, ModelDrafter(target, 6, top_k=2), ids, max_new_tokens=8, eos_token_id=[])
    assert target.config._attn_implementation == "sdpa"


def test_model_drafter_sample_follows_the_calls_warping():
    # sample=True proposes from the call's own law (temperature, top-k, top-p): a target drafting
    # for itself has every token accepted; under a greedy call it drafts greedily
    target = tiny_llama(0)
    ids = torch.tensor([[5, 6, 7, 8]])
    drafter = ModelDrafter(tiny_llama(0), 4, sample=True)
    out = generate(target, drafter, ids, max_new_tokens=20, do_sample=True, temperature=0.7,
                   top_k=5, top_p=0.9, eos_token_id=[], generator=torch.Generator().manual_seed(0))
    assert out.stats.drafted > 10 and out.stats.accepted == out.stats.drafted
    plain = generate(target, ModelDrafter(tiny_llama(0), 4, temperature=0.7), ids,
                     max_new_tokens=20, do_sample=True, temperature=0.7, top_k=5, top_p=0.9,
                     eos_token_id=[], generator=torch.Generator().manual_seed(0))
    assert plain.stats.accepted < plain.stats.drafted  # temperature alone: another law
    ref = target.generate(ids, do_sample=False, max_new_tokens=20, eos_token_id=[])
    assert torch.equal(generate(target, drafter, ids, max_new_tokens=20,
                                eos_token_id=[]).sequences, ref)
    with pytest.raises(ValueError, match="sample=True draws with the target's own temperature"):
        ModelDrafter(tiny_llama(0), 4, temperature=0.5, sample=True)


@pytest.mark.parametrize("drafter_rows, target_rows", [(6400, 6464), (6464, 6400)])
@pytest.mark.parametrize("kind", ["chain", "tree", "sampled chain"])
def test_model_drafter_with_an_output_layer_of_another_width(drafter_rows, target_rows, kind):
    # one tokenizer, output layers padded differently (Qwen2.5-0.5B drafting for Qwen2.5-7B:
    # 151936 and 152064 rows): it was refused as another vocabulary
    import copy

    target = tiny_llama(0, vocab=target_rows)
    small = copy.deepcopy(target)
    small.resize_token_embeddings(drafter_rows)  # the target's own rows, cut or padded
    drafter = ModelDrafter(small, 4, top_k=2 if kind == "tree" else 1,
                           sample=kind == "sampled chain")
    ids = torch.tensor([[5, 9, 14, 9, 5, 22, 31]])
    drafted = []
    kwargs = {"do_sample": True, "top_k": 20} if kind == "sampled chain" else {}
    gen = torch.Generator().manual_seed(0)
    out = generate(target, drafter, ids, max_new_tokens=16, generator=gen, **kwargs,
                   on_round=lambda draft, result, stats: drafted.append(draft))
    assert all(int(d.tokens.max()) < min(drafter_rows, target_rows)
               for d in drafted if d.tokens.numel())
    assert all(d.probs is None or d.probs.shape[-1] == target_rows for d in drafted)
    if kind != "sampled chain":
        with torch.no_grad():
            ref = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=16)
        assert torch.equal(out.sequences, ref)
        assert out.stats.mean_accepted > 2  # its own weights: most drafts are accepted
    with pytest.raises(ValueError, match=r"drafter vocabulary \(6000 tokens\).*within 1%"):
        generate(target, ModelDrafter(tiny_llama(1, vocab=6000)), ids, max_new_tokens=2)
    # within 1% but not padded to 64 (GPT-2's 50257 beside Pythia's 50304): other tokenizers
    with pytest.raises(ValueError, match=r"drafter vocabulary \(6401 tokens\)"):
        generate(target, ModelDrafter(tiny_llama(1, vocab=6401)), ids, max_new_tokens=2)
