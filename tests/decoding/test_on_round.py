"""`generate(on_round=...)`: one call per round, and what it reports adds up to the output."""

import torch
from spec_helpers import OracleDrafter, tiny_llama

from mmspec import generate


def test_on_round_reports_every_round_and_adds_up_to_the_output():
    target = tiny_llama(0)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    ref = target.generate(ids, do_sample=False, max_new_tokens=14, eos_token_id=[])
    drafter = OracleDrafter(ref[:, ids.shape[1]:], [ids.shape[1]], 4, "tree")
    seen = []
    out = generate(target, drafter, ids, max_new_tokens=14, eos_token_id=[],
                   on_round=lambda draft, result, stats: seen.append((draft, result, stats.rounds)))
    assert torch.equal(out.sequences, ref)
    assert [rounds for _, _, rounds in seen] == list(range(1, out.stats.rounds + 1))
    committed = [int(ref[0, ids.shape[1]])]  # the prefill's token
    accepted = 0
    for draft, result, _ in seen:
        new = result.new_tokens[0].tolist()
        n = min(int(result.num_accepted[0]), len(new))
        # the accepted tokens are the draft's nodes along the accepted path
        assert new[:n] == draft.tokens[0, result.accepted_nodes[0]].tolist()[:n]
        committed += new
        accepted += n
    assert committed == ref[0, ids.shape[1]:].tolist()
    assert accepted == out.stats.accepted > 0
