"""Writes that a kill never leaves half done: to a temporary sibling, then a rename over the file
(atomic on one filesystem), so a reader sees the old file or the new one, never a torn one."""

from __future__ import annotations

from pathlib import Path

import torch


def _partial(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(path.name + ".tmp")


def save_atomic(obj, path: str | Path) -> None:
    """`torch.save(obj, path)`, atomically."""
    path = Path(path)
    partial = _partial(path)
    torch.save(obj, partial)
    partial.replace(path)


def write_text_atomic(path: str | Path, text: str) -> None:
    """`path.write_text(text)`, atomically."""
    path = Path(path)
    partial = _partial(path)
    partial.write_text(text)
    partial.replace(path)
