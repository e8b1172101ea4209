"""Compare sparse videos with dense ones: PSNR and SSIM per video and on average.

    python -m mmspec.video_dit.compare DENSE_DIR SPARSE_DIR [--out FILE]

Videos are matched by file name (`*.mp4`, as written by `mmspec.video_dit.generate`) and read with
decord. PSNR is over all frames and channels (peak 255). SSIM is Wang et al. 2004 with an 11x11
Gaussian window (sigma 1.5) per channel and frame, averaged. When the generate JSONs are present
the table also shows the time ratio and the mean attention density. DraftAttention's repository
ships no metrics script; SVG's `svg/utils/metric.py` computes the same two metrics.

Next to the table, `compare.png` puts each video's middle frame side by side, dense | sparse |
their absolute difference (x4), under its PSNR and SSIM: where the sparse video drifts shows at a
glance.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import torch

from .video_io import read_video


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two uint8 videos `[F, H, W, 3]`; inf when identical."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10.0 * math.log10(255.0**2 / mse)


def ssim(a: np.ndarray, b: np.ndarray, window: int = 11, sigma: float = 1.5,
         frames_per_pass: int = 4) -> float:
    """Mean SSIM of two uint8 videos `[F, H, W, 3]` (per frame and channel, Gaussian window).

    A few frames at a time, with the separable Gaussian as two 1-D passes: memory stays near a
    frame's worth (the whole video through one 2-D conv2d took ~0.4 GB per 480x832 frame).
    """
    window = min(window, a.shape[1], a.shape[2])
    g = torch.exp(-((torch.arange(window) - (window - 1) / 2) ** 2) / (2 * sigma**2)).double()
    g = g / g.sum()
    rows, cols = g.view(1, 1, window, 1).expand(3, 1, window, 1), g.view(1, 1, 1, window).expand(
        3, 1, 1, window)

    def blur(t):
        return torch.nn.functional.conv2d(torch.nn.functional.conv2d(t, rows, groups=3), cols,
                                          groups=3)

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    total, count = 0.0, 0
    for start in range(0, a.shape[0], frames_per_pass):
        x = torch.from_numpy(a[start:start + frames_per_pass]).double().permute(0, 3, 1, 2)
        y = torch.from_numpy(b[start:start + frames_per_pass]).double().permute(0, 3, 1, 2)
        mx, my = blur(x), blur(y)
        vx, vy, cxy = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
        s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
        total, count = total + float(s.sum()), count + s.numel()
    return total / count


def _meta(path: Path) -> dict | None:
    meta = path.with_suffix(".json")
    return json.loads(meta.read_text()) if meta.exists() else None


def _generate_folder(d: Path) -> bool:
    """A folder of `mmspec.video_dit.generate`: it holds a `NNNN.json` (compare's own
    `compare.json`, or any other JSON, does not make it one)."""
    return any(re.fullmatch(r"\d{4,}\.json", p.name) for p in d.glob("*.json"))


def _check_same_run(name: str, dense: dict, sparse: dict) -> None:
    """Both videos must come from one prompt and one set of settings (all but the attention
    config): a table over unrelated videos would read their gap as DraftAttention's loss."""
    from .generate import settings_differ

    # the image too: image-to-video runs of one prompt number from two .jsonl files
    ours = {"prompt": sparse.get("prompt"), "image": sparse.get("image"),
            **sparse.get("settings", {})}
    theirs = {"prompt": dense.get("prompt"), "image": dense.get("image"),
              **dense.get("settings", {})}
    if dense.get("attention") == "draft" and sparse.get("attention") == "dense":
        raise ValueError(f"{name}: DENSE_DIR holds a DraftAttention run and SPARSE_DIR a dense "
                         f"one: the folders are swapped (compare DENSE_DIR SPARSE_DIR)")
    differ = settings_differ(ours, theirs, skip=("config",))
    if differ:
        raise ValueError(f"{name}: the dense and sparse videos come from different runs ("
                         + ", ".join(d.replace(" there,", " dense,").replace(" now", " sparse")
                                     for d in differ) + ")")


def _offload(meta: dict) -> bool:
    return bool(meta.get("cpu_offload", False))  # JSONs of older versions: no offload


def compare_dirs(dense_dir: Path, sparse_dir: Path, on_pair=None) -> list[dict]:
    """One row per video name in both folders; `on_pair(row, dense, sparse)` sees the frames."""
    for name, d in (("DENSE_DIR", dense_dir), ("SPARSE_DIR", sparse_dir)):
        if not d.is_dir():
            raise FileNotFoundError(f"{name}: no such directory {d}")
    names = sorted(p.name for p in dense_dir.glob("*.mp4") if (sparse_dir / p.name).exists())
    # in a folder of mmspec.video_dit.generate a video without its JSON is unfinished (a run
    # still going, or killed while writing it): leave it out rather than fail on a torn file
    unfinished = [n for n in names for d in (dense_dir, sparse_dir)
                  if _generate_folder(d) and not (d / n).with_suffix(".json").exists()]
    if unfinished:
        logging.getLogger(__name__).warning(
            "leaving out %s: no JSON next to the video, so its run has not finished it",
            ", ".join(sorted(set(unfinished))))
        names = [n for n in names if n not in unfinished]
    if not names:
        raise ValueError(f"no finished video name (*.mp4) is in both {dense_dir} and "
                         f"{sparse_dir}")
    metas = {n: (_meta(dense_dir / n), _meta(sparse_dir / n)) for n in names}
    for name, (dense_meta, sparse_meta) in metas.items():  # before any video is read
        if dense_meta and sparse_meta:
            _check_same_run(name, dense_meta, sparse_meta)
    rows = []
    for name in names:
        a, b = read_video(dense_dir / name), read_video(sparse_dir / name)
        if a.shape != b.shape:
            raise ValueError(f"{name}: dense video is {a.shape} but sparse video is {b.shape}")
        row = {"video": name, "psnr": psnr(a, b), "ssim": ssim(a, b)}
        dense_meta, sparse_meta = metas[name]
        # offloading moves each model to the GPU inside the timed call: only runs alike compare
        if dense_meta and sparse_meta and _offload(dense_meta) == _offload(sparse_meta):
            row["speedup"] = dense_meta["seconds"] / sparse_meta["seconds"]
            # the denoising loop alone: the whole call adds text encoding and VAE decoding,
            # which DraftAttention does not change
            steps = [sum(m.get("step_seconds") or []) for m in (dense_meta, sparse_meta)]
            if min(steps) > 0:
                row["step_speedup"] = steps[0] / steps[1]
        elif dense_meta and sparse_meta and name == names[0]:
            logging.getLogger(__name__).warning(
                "no speedup: one folder ran with --cpu-offload and the other without, and "
                "offloading's transfers are part of the timed call")
        if sparse_meta and sparse_meta.get("density"):
            row["density"] = sparse_meta["density"]["mean"]
            if sparse_meta["density"].get("sparse") is not None:  # older JSONs lack it
                row["sparse_density"] = sparse_meta["density"]["sparse"]
        if on_pair is not None:
            on_pair(row, a, b)
        rows.append(row)
    return rows


class ContactSheet:
    """Rows of (dense | sparse | |difference| x 4) middle frames, each under its metrics."""

    def __init__(self, width: int = 320):
        self.width = width  # of each of the three panels
        self.rows = []

    def __call__(self, row: dict, dense: np.ndarray, sparse: np.ndarray) -> None:
        from PIL import Image

        mid = dense.shape[0] // 2
        a, b = dense[mid], sparse[mid]
        diff = np.abs(a.astype(np.int16) - b.astype(np.int16)).max(-1) * 4
        diff = np.repeat(np.clip(diff, 0, 255).astype(np.uint8)[..., None], 3, -1)
        height = max(1, round(a.shape[0] * self.width / a.shape[1]))
        panels = [Image.fromarray(x).resize((self.width, height)) for x in (a, b, diff)]
        label = (f"{row['video']}  frame {mid}  PSNR {row['psnr']:.2f} dB  SSIM "
                 f"{row['ssim']:.4f}   dense | sparse | |difference| x4")
        self.rows.append((label, panels))

    def image(self):
        from PIL import Image, ImageDraw

        bar = 18
        height = sum(bar + panels[0].height for _, panels in self.rows)
        sheet = Image.new("RGB", (3 * self.width, height), "white")
        draw, y = ImageDraw.Draw(sheet), 0
        for label, panels in self.rows:
            draw.text((4, y + 3), label, fill="black")
            for i, panel in enumerate(panels):
                sheet.paste(panel, (i * self.width, y + bar))
            y += bar + panels[0].height
        return sheet


def table(rows: list[dict]) -> str:
    cols = ["psnr", "ssim"] + [c for c in ("speedup", "step_speedup", "sparse_density",
                                           "density")
                               if all(c in r for r in rows)]
    heads = {"psnr": "PSNR (dB)", "ssim": "SSIM", "speedup": "time dense/sparse",
             "step_speedup": "denoising dense/sparse",
             "sparse_density": "density of the sparse steps",
             "density": "density of the whole run (dense warm-up included)"}
    fmt = {"psnr": "{:.2f}", "ssim": "{:.4f}", "speedup": "{:.2f}x", "step_speedup": "{:.2f}x",
           "density": "{:.3f}", "sparse_density": "{:.3f}"}
    lines = ["| video | " + " | ".join(heads[c] for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for r in rows:
        lines.append(f"| {r['video']} | " + " | ".join(fmt[c].format(r[c]) for c in cols) + " |")
    finite = [r["psnr"] for r in rows if math.isfinite(r["psnr"])]
    mean = {c: float(np.mean([r[c] for r in rows])) for c in cols if c != "psnr"}
    mean["psnr"] = float(np.mean(finite)) if len(finite) == len(rows) else math.inf
    lines.append("| **mean** | " + " | ".join(fmt[c].format(mean[c]) for c in cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mmspec.video_dit.compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dense_dir", type=Path, metavar="DENSE_DIR")
    p.add_argument("sparse_dir", type=Path, metavar="SPARSE_DIR")
    p.add_argument("--out", type=Path, default=None,
                   help="markdown table file (default SPARSE_DIR/compare.md; a .json and the "
                        ".png of frames side by side go next to it)")
    args = p.parse_args(argv)
    if args.out is not None and args.out.suffix == ".json":
        p.error(f"--out is the markdown table (its .json goes next to it), got {args.out}")
    if args.dense_dir.resolve() == args.sparse_dir.resolve():
        p.error(f"DENSE_DIR and SPARSE_DIR are the same folder ({args.dense_dir}): a video "
                f"compared with itself has PSNR inf")
    out = args.out or args.sparse_dir / "compare.md"
    if args.out is not None and not args.out.parent.is_dir():  # before the work, not after
        p.error(f"--out: no such directory {args.out.parent}")
    sheet = ContactSheet()
    try:
        rows = compare_dirs(args.dense_dir, args.sparse_dir, on_pair=sheet)
    except (FileNotFoundError, ValueError) as err:  # no such folder, no video in both, ...
        p.error(str(err))
    text = table(rows)
    print(text)
    out.write_text(text + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2))
    sheet.image().save(out.with_suffix(".png"))
    print(f"frames side by side: {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
