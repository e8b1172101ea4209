"""EAGLE/ViSpec-style drafters get the target's last hidden states of every committed slot."""

import torch
from spec_helpers import OracleDrafter, tiny_llama

from mmspec import generate


class HiddenRecorder(OracleDrafter):
    needs_target_hidden = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.states, self.results = [], []

    def propose(self, state):
        self.states.append(state.target_hidden)
        return super().propose(state)

    def update(self, result):
        self.results.append(result.target_hidden)


def test_target_hidden_matches_a_plain_forward():
    target = tiny_llama(0)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    ref = target.generate(ids, do_sample=False, max_new_tokens=12, eos_token_id=[])
    drafter = HiddenRecorder(ref[:, ids.shape[1]:], [ids.shape[1]], 3, "tree")
    out = generate(target, drafter, ids, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(out.sequences, ref)
    with torch.no_grad():
        full = target(ref, output_hidden_states=True).hidden_states[-1]  # [1, L, H]
    assert torch.allclose(drafter.states[0], full[:, : ids.shape[1]], atol=1e-5)  # the prompt
    slot = ids.shape[1]  # the first root: the prefill's token
    for state, committed in zip(drafter.states[1:], drafter.results):
        assert state is committed  # round r + 1 sees what round r committed
        k = committed.shape[1]  # the root plus the accepted tokens (batch 1: no holes)
        assert torch.allclose(committed, full[:, slot : slot + k], atol=1e-5)
        slot += k
    assert slot > ids.shape[1] + 4  # several rounds with accepted tokens were checked


def test_target_hidden_layers_are_concatenated():
    target = tiny_llama(0)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    ref = target.generate(ids, do_sample=False, max_new_tokens=6, eos_token_id=[])
    drafter = HiddenRecorder(ref[:, ids.shape[1]:], [ids.shape[1]], 2, "perfect")
    drafter.target_hidden_layers = (0, 1, -1)  # EAGLE-3 style: low, mid, high
    generate(target, drafter, ids, max_new_tokens=6, eos_token_id=[])
    with torch.no_grad():
        hs = target(ref, output_hidden_states=True).hidden_states
    expect = torch.cat([hs[0], hs[1], hs[-1]], -1)[:, : ids.shape[1]]
    assert torch.allclose(drafter.states[0], expect, atol=1e-5)
    assert drafter.results[0].shape[-1] == 3 * 32
