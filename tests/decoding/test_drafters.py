"""The built-in drafters: prompt lookup rules, model drafter trees and its cache kept in step."""

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
