"""Loss terms against direct formulas."""

import torch

from mmspec.vision.losses import list_mle, total_variation


def test_list_mle_is_the_plackett_luce_likelihood_of_the_targets_order():
    torch.manual_seed(0)
    draft, target = torch.randn(2, 6), torch.randn(2, 6)
    got = list_mle(draft, target, top=3)
    want = 0.0
    for d, t in zip(draft, target):
        order = t.topk(3).indices
        for r in range(3):
            want -= d[order[r]] - torch.logsumexp(d[order[r:]], 0)
    assert torch.allclose(got, want / 2)


def test_total_variation():
    a = torch.tensor([[0.0, 0.0]])
    b = torch.tensor([[0.0, float("-inf")]])
    assert total_variation(a, a) == 0
    assert torch.isclose(total_variation(a, b), torch.tensor(1.0))  # |0.5 - 1| + |0.5 - 0|
