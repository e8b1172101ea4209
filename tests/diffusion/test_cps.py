import math

import pytest
import torch

from mmspec.diffusion.cps import CPSConfig, candidate_sets, search
from mmspec.diffusion.ngram_proxy import NgramProxy
from mmspec.diffusion.path_tree import paths_to_tree

V, EOS = 64, 1


def lattice_from(rows: list[dict]) -> torch.Tensor:
    """log-probs `[k, V]`: the given token probabilities, the rest spread evenly over the others."""
    probs = torch.zeros(len(rows), V, dtype=torch.float64)
    for i, row in enumerate(rows):
        rest = (1.0 - sum(row.values())) / (V - len(row))
        probs[i] = rest
        for token, p in row.items():
            probs[i, token] = p
    return probs.log().float()


def test_mass_pruning_keeps_the_smallest_set_reaching_tau_plus_eos():
    lattice = lattice_from([{5: 0.5, 6: 0.2, 7: 0.15, 8: 0.1}, {5: 0.9}, {}])
    sets = candidate_sets(lattice, CPSConfig(), [EOS])
    assert sets[0][0] == [5, 6, 7, EOS]  # mass before 7 is 0.7 < 0.8, before 8 is 0.85
    assert sets[1][0] == [5, EOS]
    assert len(sets[2][0]) == 15 + 1  # a flat position is capped at M_max, then EOS is added
    assert sets[0][1] == pytest.approx(lattice[0, [5, 6, 7, EOS]].tolist())


def test_search_stops_after_the_first_eos():
    rows = [{5: 0.9}, {EOS: 0.3, 6: 0.6}, {EOS: 0.9}, {7: 0.9}]
    assert len(candidate_sets(lattice_from(rows), CPSConfig(), [EOS])) == 3  # EOS is top-1 at 2
    in_mass = CPSConfig(eos_stop="in_mass")
    assert len(candidate_sets(lattice_from(rows), in_mass, [EOS])) == 2  # EOS within tau at 1


@pytest.mark.parametrize("eos_at", [None, 7])
def test_lambda_one_beam_one_is_the_argmax_path(eos_at):
    torch.manual_seed(eos_at or 0)
    lattice = torch.log_softmax(3 * torch.randn(12, V), -1)
    lattice[:, EOS] = -30.0
    if eos_at is not None:
        lattice[eos_at, EOS] = 10.0
    lattice = torch.log_softmax(lattice, -1)
    argmax = lattice.argmax(-1).tolist()
    expected = argmax if eos_at is None else argmax[:eos_at + 1]
    beams = search(lattice, CPSConfig(lam=1.0, beam_width=1), [EOS])
    assert beams[0].tokens == expected
    assert beams[0].score == pytest.approx(lattice.max(-1).values[:len(expected)].sum().item(),
                                           rel=1e-5)


def fitted_ngram(history):
    proxy = NgramProxy(V, order=3)
    proxy.begin(torch.tensor(history))
    return proxy


def test_ngram_proxy_overrides_a_close_call():
    proxy = fitted_ngram([10, 11, 20, 10, 11, 20, 10, 11])  # after (10, 11) comes 20
    lattice = lattice_from([{21: 0.45, 20: 0.40}, {30: 0.9}])
    assert search(lattice, CPSConfig(lam=1.0), [EOS])[0].tokens == [21, 30]
    assert search(lattice, CPSConfig(), [EOS], proxy)[0].tokens == [20, 30]


def test_ngram_proxy_cannot_override_a_peaked_position():
    proxy = fitted_ngram([10, 11, 20, 10, 11, 20, 10, 11])
    lattice = lattice_from([{21: 0.9, 20: 0.05}, {30: 0.9}])  # 20 falls outside the tau mass
    assert search(lattice, CPSConfig(), [EOS], proxy)[0].tokens == [21, 30]


def test_ngram_proxy_conditions_on_the_beam_prefix():
    proxy = fitted_ngram([3, 10, 11, 20, 4, 5])  # the history ends in (4, 5), which says nothing
    lattice = lattice_from([{10: 0.9}, {11: 0.9}, {21: 0.45, 20: 0.40}])
    assert search(lattice, CPSConfig(), [EOS], proxy)[0].tokens == [10, 11, 20]


@pytest.mark.parametrize("rank, expected", [("sum", [EOS]), ("mean", [5] * 5),
                                            ("equal_depth", [5] * 5)])
def test_rank_decides_between_an_early_eos_and_a_long_path(rank, expected):
    lattice = lattice_from([{5: 0.6, EOS: 0.3}] + [{5: 0.6}] * 4)
    beams = search(lattice, CPSConfig(lam=1.0, rank=rank), [EOS])
    assert beams[0].tokens == expected
    assert beams[0].score == pytest.approx(len(expected) * math.log(0.6 if expected[0] == 5
                                                                    else 0.3), rel=1e-5)


def test_beams_are_distinct_and_at_most_b():
    torch.manual_seed(1)
    lattice = torch.log_softmax(torch.randn(6, V), -1)
    beams = search(lattice, CPSConfig(lam=1.0, tau=1.0), [EOS])
    assert len(beams) == 3
    assert len({tuple(b.tokens) for b in beams}) == 3
    assert [b.score for b in beams] == sorted((b.score for b in beams), reverse=True)


def test_beams_merge_into_a_prefix_tree():
    tokens, parents, depths = paths_to_tree([[1, 2, 3], [1, 2, 4], [1, 5]])
    assert tokens == [1, 2, 3, 4, 5]
    assert parents == [-1, 0, 1, 1, 0]
    assert depths == [0, 1, 2, 2, 1]


def test_lam_below_one_needs_a_proxy():
    with pytest.raises(ValueError, match="causal proxy"):
        search(lattice_from([{5: 0.9}]), CPSConfig(), [EOS])


@pytest.mark.parametrize("kwargs", [{"tau": 0.0}, {"beam_width": 0}, {"lam": 1.5},
                                    {"eos_stop": "first"}, {"rank": "best"}])
def test_bad_config_raises(kwargs):
    with pytest.raises(ValueError):
        CPSConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [{"beam_width": 2.5}, {"max_candidates": 2.5},
                                    {"beam_width": True}])
def test_counts_must_be_ints(kwargs):
    with pytest.raises(ValueError, match=r"CPSConfig\.\w+ must be an int"):
        CPSConfig(**kwargs)


def test_ids_the_lattice_rules_out_are_never_candidates():
    lattice = torch.full((2, V), float("-inf"))
    lattice[:, 10:14] = math.log(0.25)  # e.g. the mask id and ids past the target vocab are -inf
    sets = candidate_sets(lattice, CPSConfig(tau=1.0), [EOS])
    assert all(sorted(tokens) == [10, 11, 12, 13] for tokens, _ in sets)
    beams = search(lattice, CPSConfig(lam=0.0, tau=1.0), [EOS], NgramProxy(V))
    assert all(math.isfinite(b.score) for b in beams)


class TensorOnly:
    """The `CausalProxy` protocol alone: no list fast path."""

    def __init__(self, proxy):
        self.proxy = proxy

    def score(self, paths, candidates):
        return self.proxy.score(paths, candidates)


def test_the_list_fast_path_scores_like_the_tensor_protocol():
    torch.manual_seed(3)
    proxy = fitted_ngram([10, 11, 20, 10, 11, 21, 10, 11, 20, 5, 6, 7])
    lattice = torch.log_softmax(torch.randn(8, V), -1)
    fast = search(lattice, CPSConfig(tau=1.0), [EOS], proxy)
    slow = search(lattice, CPSConfig(tau=1.0), [EOS], TensorOnly(proxy))
    assert [b.tokens for b in fast] == [b.tokens for b in slow]
    assert [b.score for b in fast] == pytest.approx([b.score for b in slow], rel=1e-12)
