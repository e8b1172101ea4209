"""Video files for the generate and compare tools: H.264 mp4 written with PyAV, read with decord."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def to_uint8(frames) -> np.ndarray:
    """Frames `[F, H, W, 3]` as float in [0, 1] (diffusers' `output_type="np"`) or uint8 -> uint8."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be [F, H, W, 3], got shape {frames.shape}")
    if frames.dtype == np.uint8:
        return frames
    return (np.clip(frames, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def write_mp4(path: Path, frames, fps: int = 16, crf: int = 12) -> None:
    """Write `[F, H, W, 3]` frames as H.264 (yuv420p, so H and W must be even)."""
    import av

    frames = to_uint8(frames)
    _, h, w, _ = frames.shape
    if h % 2 or w % 2:
        raise ValueError(f"H.264 yuv420p needs even frame sizes, got {h}x{w}")
    path = Path(path)
    partial = path.with_name(path.name + ".partial")  # a killed run never leaves a torn video
    with av.open(str(partial), mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.options = {"crf": str(crf)}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    partial.replace(path)


def read_video(path: Path) -> np.ndarray:
    """All frames of a video file as uint8 `[F, H, W, 3]`, decoded with decord."""
    import decord

    reader = decord.VideoReader(str(path), ctx=decord.cpu(0))
    return reader.get_batch(list(range(len(reader)))).asnumpy()
