import pytest

from mmspec.video_dit import DraftAttentionConfig


def test_defaults_follow_the_paper():
    cfg = DraftAttentionConfig()
    assert (cfg.sparsity, cfg.tile, cfg.mode, cfg.dense_layers) == (0.9, (8, 16), "global", 1)
    assert cfg.dense_step_count(50) == 15  # t > 945 with shift 7 is 15 of 50 steps
    assert cfg.dense_step_count(30) == 9
    assert DraftAttentionConfig(dense_steps=4).dense_step_count(None) == 4


@pytest.mark.parametrize("kwargs,match", [
    ({"sparsity": 1.0}, r"sparsity must be a number in \[0, 1\), got 1.0"),
    ({"sparsity": -0.5}, "sparsity must be"),
    ({"mode": "kmeans"}, "mode must be one of"),
    ({"tile": (8,)}, "tile must be two positive ints"),
    ({"dense_steps": -1}, "dense_steps must be"),
    ({"dense_steps": 1.5}, "dense_steps must be"),
    ({"dense_steps": True}, "dense_steps must be"),
    ({"dense_layers": -1}, "dense_layers must be"),
    ({"mode": "top_p"}, r"mode='top_p', calibrate=False needs mass"),
    ({"calibrate": True}, "needs mass"),
    ({"mass": 0.9}, r"mass=0.9 is read by mode='top_p' or calibrate=True only"),
    ({"mode": "top_p", "mass": 1.5}, r"mass must be a number in \(0, 1\]"),
    ({"mode": "top_p", "mass": 0.9, "max_density": 0}, "max_density must be"),
    ({"mode": "top_p", "mass": 0.9, "calibrate": True}, "adapts per row already"),
    ({"calibrate": True, "mass": 0.9, "dense_steps": 0}, "at least one dense step"),
    # the fraction 1.0 is every step: DraftAttention silently never engaged
    ({"dense_steps": 1.0}, r"dense_steps=1.0 is the fraction 'every step dense'.*the int 1"),
    # a typo used to pass here and fail at the first sparse step, minutes into the first video
    ({"backend": "tirton"}, r"backend must be one of \['auto', 'flex', 'reference', 'torch', 'triton', "
                            r"'triton-tma', 'triton-tma-persistent'\], got 'tirton'"),
])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DraftAttentionConfig(**kwargs)


def test_fraction_needs_a_step_count():
    with pytest.raises(ValueError, match="fraction of the denoising steps"):
        DraftAttentionConfig(dense_steps=0.3).dense_step_count(None)


def test_numpy_scalars_are_numbers():
    # a sparsity read from an array or a sweep was refused as "not a number"
    np = pytest.importorskip("numpy")
    cfg = DraftAttentionConfig(sparsity=np.float32(0.5), dense_steps=np.int64(3),
                               dense_layers=np.int64(2))
    assert (cfg.sparsity, cfg.dense_steps, cfg.dense_layers) == (0.5, 3, 2)
    assert type(cfg.sparsity) is float and type(cfg.dense_steps) is int
    assert DraftAttentionConfig(dense_steps=np.float64(0.25)).dense_step_count(8) == 2
    # float32's 0.3 is 0.30000001: 3 of 10 steps, not 4
    assert DraftAttentionConfig(dense_steps=np.float32(0.3)).dense_step_count(10) == 3
