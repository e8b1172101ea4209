import math
import re

import numpy as np
import pytest
import torch

from mmspec.video_dit import compare
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
    with pytest.raises(ValueError, match="no finished video name"):
        compare_dirs(tmp_path / "d", tmp_path)


def _ssim_whole_video(a, b, window=11, sigma=1.5):
    """The definition in one 2-D convolution over the whole video (what `ssim` did before it
    went a few frames at a time with two 1-D passes)."""
    x = torch.from_numpy(a).double().permute(0, 3, 1, 2)
    y = torch.from_numpy(b).double().permute(0, 3, 1, 2)
    g = torch.exp(-((torch.arange(window) - (window - 1) / 2) ** 2) / (2 * sigma**2)).double()
    g = g / g.sum()
    kernel = (g[:, None] * g[None, :]).expand(3, 1, window, window)

    def blur(t):
        return torch.nn.functional.conv2d(t, kernel, groups=3)

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return float(s.mean())


def test_ssim_by_frames_equals_the_whole_video_definition():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (7, 24, 40, 3), dtype=np.uint8)  # 7 frames: a ragged last pass
    b = np.clip(a + rng.normal(0, 30, a.shape), 0, 255).astype(np.uint8)
    assert ssim(a, b) == pytest.approx(_ssim_whole_video(a, b), rel=1e-12)
    assert ssim(a, b, frames_per_pass=1) == pytest.approx(_ssim_whole_video(a, b), rel=1e-12)


def test_compare_leaves_out_unfinished_videos(tmp_path, caplog):
    # a run killed while writing (or still going) leaves a video without its JSON, maybe torn
    import json

    dense, sparse = tmp_path / "d", tmp_path / "s"
    for d in (dense, sparse):
        d.mkdir()
        for name in ("0000", "0001"):
            write_mp4(d / f"{name}.mp4", _video())
        (d / "0000.json").write_text(json.dumps({"seconds": 1.0, "density": None}))
    (sparse / "0001.mp4").write_bytes(b"\x00\x00\x00\x18ftypisom")  # torn: no moov atom
    rows = compare_dirs(dense, sparse)
    assert [r["video"] for r in rows] == ["0000.mp4"]
    assert "leaving out 0001.mp4" in caplog.text
    assert sorted(p.name for p in dense.iterdir()) == ["0000.json", "0000.mp4", "0001.mp4"]


def test_no_speedup_between_an_offloaded_and_a_resident_run(tmp_path, caplog):
    # with --cpu-offload the timed call includes moving the models to the GPU
    import json

    dense, sparse = tmp_path / "d", tmp_path / "s"
    for d, seconds, offload in ((dense, 4.0, True), (sparse, 1.0, None)):
        d.mkdir()
        write_mp4(d / "0000.mp4", _video())
        meta = {"seconds": seconds, "density": None}
        if offload is not None:  # older JSONs have no key: not offloaded
            meta["cpu_offload"] = offload
        (d / "0000.json").write_text(json.dumps(meta))
    rows = compare_dirs(dense, sparse)
    assert "speedup" not in rows[0]
    assert "ran with --cpu-offload and the other without" in caplog.text
    (sparse / "0000.json").write_text(json.dumps({"seconds": 1.0, "density": None,
                                                  "cpu_offload": True}))
    assert compare_dirs(dense, sparse)[0]["speedup"] == 4.0


def test_swapped_folders_are_refused(tmp_path):
    # DENSE_DIR given a sparse run: the speedup column read as the inverse, with no warning
    import json

    for d, attention in (("d", "draft"), ("s", "dense")):
        (tmp_path / d).mkdir()
        write_mp4(tmp_path / d / "0000.mp4", _video())
        (tmp_path / d / "0000.json").write_text(json.dumps(
            {"seconds": 1.0, "density": None, "attention": attention}))
    with pytest.raises(ValueError, match="the folders are swapped"):
        compare_dirs(tmp_path / "d", tmp_path / "s")
    rows = compare_dirs(tmp_path / "s", tmp_path / "d")  # the right way round
    assert rows[0]["speedup"] == 1.0


def test_bad_folders_are_usage_errors(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for argv, message in (([tmp_path / "a", tmp_path / "a"], "are the same folder"),
                          ([tmp_path / "nope", tmp_path / "b"], "DENSE_DIR: no such directory"),
                          ([tmp_path / "a", tmp_path / "b"], r"no finished video name \(\*.mp4\) "
                                                             "is in both")):
        with pytest.raises(SystemExit) as err:
            compare.main([str(d) for d in argv])
        assert err.value.code == 2 and re.search(message, capsys.readouterr().err)


def test_runs_from_other_images_are_refused_and_denoising_is_timed_apart(tmp_path):
    # image-to-video: prompt 0 of two .jsonl files, one prompt text and two images; and the
    # denoising loop's time next to the whole call's (text encoding and VAE decoding included)
    import json

    dense, sparse = tmp_path / "d", tmp_path / "s"
    for d, image, seconds, steps in ((dense, "a.png", 10.0, [2.0, 2.0]),
                                     (sparse, "b.png", 8.0, [1.0, 1.0])):
        d.mkdir()
        write_mp4(d / "0000.mp4", _video())
        (d / "0000.json").write_text(json.dumps(
            {"prompt": "a cat", "image": image, "seconds": seconds, "step_seconds": steps,
             "density": None, "settings": {"seed": 42}}))
    with pytest.raises(ValueError, match=r"0000.mp4: the dense and sparse videos come from "
                                         r"different runs \(image 'a.png' dense, 'b.png' sparse"):
        compare_dirs(dense, sparse)
    meta = json.loads((sparse / "0000.json").read_text())
    (sparse / "0000.json").write_text(json.dumps({**meta, "image": "a.png"}))
    rows = compare_dirs(dense, sparse)
    assert rows[0]["speedup"] == 1.25 and rows[0]["step_speedup"] == 2.0
    assert "| time dense/sparse | denoising dense/sparse |" in table(rows)
    assert "| 1.25x | 2.00x |" in table(rows)
