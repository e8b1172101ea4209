import math

import pytest
import torch

from mmspec.diffusion.ngram_proxy import NgramProxy

V = 16


def test_distribution_sums_to_one_for_seen_and_unseen_contexts():
    proxy = NgramProxy(V, order=3)
    proxy.begin(torch.tensor([1, 2, 3, 1, 2, 4, 5]))
    for context in ([1, 2], [2, 3], [9, 9], []):
        assert sum(proxy.prob(context, w) for w in range(V)) == pytest.approx(1.0)


def test_probabilities_follow_the_counts():
    proxy = NgramProxy(V, order=3, discount=0.5)
    proxy.begin(torch.tensor([1, 2, 3, 1, 2, 3, 1, 2, 4]))
    # after (1, 2): 3 twice, 4 once; unigram: 1:3, 2:3, 3:2, 4:1 of 9; bigram after 2: 3:2, 4:1
    p1 = (2 - 0.5 + 0.5 * 4 * (1 / V)) / 9
    p2 = (2 - 0.5 + 0.5 * 2 * p1) / 3
    p3 = (2 - 0.5 + 0.5 * 2 * p2) / 3
    assert proxy.prob([1, 2], 3) == pytest.approx(p3)
    assert proxy.prob([1, 2], 3) > proxy.prob([1, 2], 4) > proxy.prob([1, 2], 5)


def test_online_fit_extends_and_refits_on_a_new_sequence():
    proxy = NgramProxy(V, order=2)
    proxy.begin(torch.tensor([7, 8]))
    before = proxy.prob([7], 9)
    proxy.begin(torch.tensor([7, 8, 7, 9, 7, 9]))  # the committed output arrives
    assert proxy.prob([7], 9) > proxy.prob([7], 8) > before
    proxy.begin(torch.tensor([3, 4]))  # a new prompt: the old counts are gone
    assert proxy.prob([7], 9) == pytest.approx(0.75 * 2 * (1 / V) / 2)  # unigrams of [3, 4]


def test_score_uses_the_history_and_the_path():
    proxy = NgramProxy(V, order=3)
    proxy.begin(torch.tensor([5, 6, 7, 5, 6, 7, 0, 0]))
    scores = proxy.score(torch.tensor([[5, 6], [0, 0]]), torch.tensor([7, 8]))
    assert scores.shape == (2, 2)
    assert scores[0, 0] > scores[0, 1]
    assert scores[0, 0] == pytest.approx(math.log(proxy.prob([5, 6], 7)))
    assert scores[1, 0] == pytest.approx(math.log(proxy.prob([0, 0], 7)))
