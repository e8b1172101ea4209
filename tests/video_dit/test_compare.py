import math

import numpy as np
import pytest

from mmspec.video_dit.compare import compare_dirs, psnr, ssim, table
from mmspec.video_dit.video_io import write_mp4


def _video():
    base = np.linspace(0, 255, 32 * 32 * 3).reshape(32, 32, 3)
    return np.stack([np.roll(base, 2 * f, axis=1) for f in range(4)]).astype(np.uint8)


def test_psnr_and_ssim():
    a = _video()
    b = np.clip(a.astype(int) + 1, 0, 255).astype(np.uint8)  # off by one almost everywhere
    mse = np.mean((a.astype(float) - b) ** 2)
    assert psnr(a, a) == math.inf and ssim(a, a) == pytest.approx(1.0)
    assert psnr(a, b) == pytest.approx(10 * math.log10(255**2 / mse))
    noisy = np.clip(a + np.random.default_rng(0).normal(0, 20, a.shape), 0, 255).astype(np.uint8)
    assert 0 < ssim(a, noisy) < ssim(a, b) < 1


def test_compare_dirs(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "s").mkdir()
    write_mp4(tmp_path / "d" / "x.mp4", _video())
    write_mp4(tmp_path / "s" / "x.mp4", _video())
    write_mp4(tmp_path / "s" / "only_sparse.mp4", _video())
    rows = compare_dirs(tmp_path / "d", tmp_path / "s")
    assert [r["video"] for r in rows] == ["x.mp4"]
    assert rows[0]["psnr"] == math.inf and rows[0]["ssim"] == pytest.approx(1.0)
    assert "| x.mp4 | inf | 1.0000 |" in table(rows)
    with pytest.raises(FileNotFoundError, match="DENSE_DIR"):
        compare_dirs(tmp_path / "nope", tmp_path / "s")
    with pytest.raises(ValueError, match="no video name"):
        compare_dirs(tmp_path / "d", tmp_path)
