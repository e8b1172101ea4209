import pytest

from mmspec.diffusion.adl import (
    AdaptiveDraftLength,
    ADLConfig,
    FixedDraftLength,
    generated_length,
)

EOS = 1


def test_generated_length_is_the_index_of_the_first_eos():
    assert generated_length([4, 5, EOS, 6, EOS], [EOS]) == 2
    assert generated_length([EOS, 5], [EOS]) == 0
    assert generated_length([4, 5, 6], [EOS]) == 3  # no EOS: k
    assert generated_length([4, 9, 5], [EOS, 9]) == 1  # every stop id counts


def test_adl_follows_its_rule_on_a_scripted_sequence():
    """(L_gen, L_acc) per round and the k the rule gives, worked by hand:
    EMA_t = 0.5 EMA_{t-1} + 0.5 L;  k = clip(floor(gen) + 10 [acc >= gen], 20, 30)."""
    script = [  # L_gen, L_acc -> gen EMA, acc EMA -> k
        (30, 30, 25),  # 15, 15: acc keeps up, 15 + 10
        (25, 25, 30),  # 20, 20: 20 + 10
        (30, 3, 25),  # 25, 11.5: no growth
        (25, 25, 25),  # 25, 18.25
        (12, 2, 20),  # 18.5, 10.125: floor 18 -> clipped up to 20
        (5, 40, 21),  # 11.75, 25.0625: 11 + 10
        (30, 30, 30),  # 20.875, 27.53: 20 + 10
    ]
    adl = AdaptiveDraftLength()
    assert adl.k == 30  # k_1 = k_max
    for gen, acc, k in script:
        assert adl.update(gen, acc) == k
        assert adl.k == k


def test_adl_rounding_option_and_limits():
    adl = AdaptiveDraftLength(ADLConfig(k_min=1, k_max=100, rounding="ceil"))
    assert adl.update(5, 0) == 3  # gen EMA 2.5 -> ceil 3, acc 0 < 2.5
    adl = AdaptiveDraftLength(ADLConfig(k_min=1, k_max=100))
    assert adl.update(5, 0) == 2  # floor
    assert adl.update(5, 20) == 13  # gen 3.75, acc 10 >= 3.75: 3 + 10


def test_fixed_k_ignores_the_signals():
    fixed = FixedDraftLength(7)
    assert [fixed.update(g, a) for g, a in [(30, 30), (0, 0)]] == [7, 7]


@pytest.mark.parametrize("kwargs", [{"k_min": 0}, {"k_min": 31}, {"rho": 0.0}, {"delta": -1},
                                    {"rounding": "nearest"}])
def test_bad_adl_config_raises(kwargs):
    with pytest.raises(ValueError):
        ADLConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [{"delta": 3.5}, {"k_min": 2.5}, {"delta": True}])
def test_adl_lengths_must_be_ints(kwargs):
    # a float k reached torch.full deep inside generate; True passes every range check
    with pytest.raises(ValueError, match=r"ADLConfig\.\w+ must be an int"):
        ADLConfig(**kwargs)


def test_fixed_k_must_be_positive():
    with pytest.raises(ValueError, match="k must be > 0"):
        FixedDraftLength(0)
