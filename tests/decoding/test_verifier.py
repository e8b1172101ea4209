"""The verifier seam (`mmspec/decoding/verifier.py`): `compile=` picks a `Verifier` in one place
(`generate.make_verifier`), and the round loop runs the target through whichever it got."""

import importlib

import torch
from spec_helpers import RandomDrafter, tiny_llama
from transformers import CompileConfig

from mmspec import generate
from mmspec.decoding.static import StaticVerifier
from mmspec.decoding.verifier import DynamicVerifier

entry = importlib.import_module("mmspec.decoding.generate")  # the module, not the function


def test_compile_picks_the_verifier():
    target = tiny_llama(0)
    assert type(entry.make_verifier(target, (), None)) is DynamicVerifier
    assert type(entry.make_verifier(target, (), CompileConfig())) is StaticVerifier


class Recording(DynamicVerifier):
    """The eager verifier, counting the forwards the loop asks of it."""

    forwards = 0

    def forward(self, tree, slots, prepared, need_hidden):
        Recording.forwards += 1
        return super().forward(tree, slots, prepared, need_hidden)


def test_the_loop_verifies_through_the_verifier_it_is_given(monkeypatch):
    Recording.forwards = 0
    monkeypatch.setattr(entry, "make_verifier",
                        lambda target, windows, config: Recording(target, windows))
    target = tiny_llama(0)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    out = generate(target, RandomDrafter(4), ids, max_new_tokens=10, eos_token_id=[])
    ref = target.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=None)
    assert torch.equal(out.sequences, ref)
    assert Recording.forwards == out.stats.rounds > 1
