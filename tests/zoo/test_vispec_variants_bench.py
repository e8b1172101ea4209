"""benchmarks/vispec_variants.py runs on the shipped zoo and names each drafter's recipe."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.vispec_variants import describe, main


def test_describe_names_the_features_and_the_rollouts():
    assert describe({"config": {"features": "eagle3"},
                     "train_config": {"rollout_steps": 6, "training_time_test": True}}) == (
        "EAGLE-3's three layers; training-time test, 6 passes past the first")
    assert describe({"config": {}, "train_config": {"rollout_steps": 6, "feature_weight": 0.0,
                                                    "training_time_test": True}}) == (
        "the last hidden state; training-time test, 6 passes past the first; no feature loss")
    # the shipped cards predate the fields: the last hidden state, ViSpec's rollout
    assert describe({"config": {}, "train_config": {"rollout_steps": 1}}) == (
        "the last hidden state; ViSpec's shifted rollout x1")


def test_a_short_run_prints_the_table(capsys):
    main(["--drafters", "vlm-vispec", "--prompts", "1", "--new-tokens", "8", "--repeats", "1"])
    out = capsys.readouterr().out
    assert ("| `vlm-vispec` | the last hidden state; training-time test, 6 passes past the "
            "first | 0 |") in out
    assert out.count("| 1/1 |") == 1  # asserted token-identical to target-only greedy
