"""benchmarks/video_grids.py --speed: dense against DraftAttention per tile, timed side by side."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import benchmarks.video_grids as video_grids  # noqa: E402


def test_speed_keeps_each_calls_fastest_time_and_compares_the_sparse_calls(monkeypatch):
    # scripted runs, in speed()'s order: the warm-ups (dense, tile), then dense, tile per repeat
    frames = np.zeros((1, 2, 2, 3), np.uint8)
    runs = iter([
        {"seconds": 99.0, "attn": [99.0, 99.0], "sparse": None, "density": None},
        {"seconds": 99.0, "attn": [99.0, 99.0], "sparse": [False, True], "density": 0.1},
        {"seconds": 10.0, "attn": [4.0, 4.0], "sparse": None, "density": None},
        {"seconds": 8.0, "attn": [3.0, 1.0], "sparse": [False, True], "density": 0.1},
        {"seconds": 12.0, "attn": [2.0, 6.0], "sparse": None, "density": None},
        {"seconds": 7.0, "attn": [5.0, 2.0], "sparse": [False, True], "density": 0.1},
    ])
    monkeypatch.setattr(video_grids, "timed_run",
                        lambda pipe, prompt, call, config=None: {**next(runs), "frames": frames})
    out = video_grids.speed(None, (4, 32, 32), "p", 20, [(4, 4)], repeats=2)
    t = out["tiles"]["4x4"]
    assert out["dense_s"] == 10.0 and t["e2e_s"] == 7.0  # the warm-ups are not timed
    # dense calls [min(4, 2), min(4, 6)] = [2, 4]; sparse [3, 1]; call 1 is the sparse one
    assert (t["dense_call_ms"], t["sparse_call_ms"]) == (4000.0, 1000.0)
    assert t["attn_sparse_ratio"] == 4.0 and t["attn_all_ratio"] == 6.0 / 4.0
    assert (t["sparse_calls"], t["calls"]) == (1, 2)
    assert out["attn_share"] == 6.0 / 10.0


def test_speed_on_the_zoo_video_dit_times_every_self_attention_call():
    import mmspec.zoo

    pipe = mmspec.zoo.load("video-dit").model
    pipe.set_progress_bar_config(disable=True)
    out = video_grids.speed(pipe, (4, 32, 32), "a red circle moving right", 4, [(2, 4)], 1)
    t = out["tiles"]["2x4"]
    layers = len(pipe.transformer.blocks)
    assert t["calls"] == 4 * layers  # one attn1 call a layer and step (CFG rows batched)
    # layer 0 dense, and the first 30% of the steps, rounded up: 2 of 4
    assert t["sparse_calls"] == 2 * (layers - 1)
    assert t["density"] == pytest.approx(0.1, abs=0.005)
    assert t["dense_call_ms"] > 0 and t["sparse_call_ms"] > 0 and 0 < out["attn_share"] < 1


@pytest.mark.parametrize("extra", [["--card"], ["--dense-only"]])
def test_speed_refuses_the_options_it_does_not_honour(extra, capsys):
    with pytest.raises(SystemExit):
        video_grids.main(["--speed", *extra])
    assert "--speed times generations only" in capsys.readouterr().err
