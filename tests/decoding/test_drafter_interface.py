"""The declared drafter interface (`mmspec/decoding/draft.py`: `Drafter`, `as_drafter`) and the
drafter of docs/drafters.md, run as written there against `target.generate`."""

import re
from pathlib import Path

import pytest
import torch
from spec_helpers import EOS, PAD, tiny_llama

import mmspec
from mmspec.decoding.draft import CAPABILITIES, Draft, Drafter, as_drafter

DOCS = Path(__file__).resolve().parents[2] / "docs" / "drafters.md"


def docs_drafter_class():
    """The `BigramDrafter` class of docs/drafters.md, from its first Python block."""
    code = re.search(r"```python\n(.*?)```", DOCS.read_text(), re.S).group(1)
    namespace = {"__name__": "drafters_md"}
    exec(compile(code, "docs/drafters.md", "exec"), namespace)
    return namespace["BigramDrafter"]


def repetitive_batch():
    """Two left-padded rows that repeat themselves, so a bigram table has something to find."""
    ids = torch.tensor([[PAD, PAD, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6],
                        [9, 10, 11, 9, 10, 11, 9, 10, 11, 12, 9, 10]])
    return ids, (ids != PAD).long()


def test_the_docs_drafter_is_token_identical_to_target_generate():
    target = tiny_llama(0)
    ids, mask = repetitive_batch()
    drafter = docs_drafter_class()(num_tokens=4)
    assert isinstance(drafter, Drafter)
    out = mmspec.generate(target, drafter, ids, attention_mask=mask, max_new_tokens=24,
                          pad_token_id=PAD, eos_token_id=EOS)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                          pad_token_id=PAD, eos_token_id=EOS)
    assert torch.equal(out.sequences, ref)
    # it drafted, and the engine told it what was accepted: the test covers its rounds
    assert out.stats.drafted > 0
    assert drafter.accepted == out.stats.accepted


class TwoMethods:
    """A third party's drafter: `propose` and `update`, nothing else, no base class."""

    def __init__(self):
        self.rounds = 0

    def propose(self, state):
        self.rounds += 1
        return Draft.chain(state.input_ids[:, -1:].clone())  # the root again

    def update(self, result):
        pass


def test_a_duck_typed_drafter_gets_the_declared_defaults():
    view = as_drafter(TwoMethods())
    base = Drafter()
    for name in ("needs_target_hidden", "target_hidden_layers", "vocab_size", "top_k"):
        assert getattr(view, name) == getattr(base, name), name
    assert view.match_target_width(128) is False
    assert view.end() is None and view.check_target(None) is None
    target = tiny_llama(0)
    ids = torch.tensor([[5, 6, 7, 5, 6]])
    drafter = TwoMethods()
    out = mmspec.generate(target, drafter, ids, max_new_tokens=8, eos_token_id=[])
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=8, do_sample=False,
                                                      eos_token_id=None))
    assert 0 < drafter.rounds <= out.stats.rounds  # a budget-capped last round drafts nothing


class WithEnd(TwoMethods):
    needs_target_hidden = False
    top_k = 3

    def __init__(self):
        super().__init__()
        self.ended = 0

    def end(self):
        self.ended += 1


def test_a_duck_typed_drafters_own_members_are_used():
    view = as_drafter(WithEnd())
    assert view.top_k == 3
    drafter = WithEnd()
    mmspec.generate(tiny_llama(0), drafter, torch.tensor([[5, 6, 7]]), max_new_tokens=4)
    assert drafter.ended == 1  # end() once per call


def test_every_capability_has_a_default_on_the_base():
    for name in CAPABILITIES:
        assert hasattr(Drafter, name), name


def test_a_drafter_without_propose_is_named():
    with pytest.raises(TypeError, match=r"drafter must be a drafter .*got int$"):
        as_drafter(3)
