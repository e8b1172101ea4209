"""The text corpus: the Python standard library's own source, found through `sysconfig`.

It is on every machine, needs no download, and code is a headline workload for speculative
decoding. Files are split deterministically by a hash of their path relative to the stdlib root,
so the held-out set is the same on every machine with the same Python version, and a file never
straddles the split.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from pathlib import Path

HELDOUT_EVERY = 50  # ~2% of files held out for evaluation


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _is_heldout(rel_path: str) -> bool:
    digest = hashlib.sha1(rel_path.encode()).digest()
    return int.from_bytes(digest[:4], "little") % HELDOUT_EVERY == 0


@functools.lru_cache(maxsize=1)
def _split_files() -> dict[str, tuple[Path, ...]]:
    root = stdlib_root()
    split = {"train": [], "heldout": []}
    for dirpath, dirnames, filenames in os.walk(root):  # several times faster than rglob
        dirnames[:] = [d for d in dirnames if d not in ("site-packages", "dist-packages")]
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath, name)
                rel = path.relative_to(root).as_posix()
                split["heldout" if _is_heldout(rel) else "train"].append(path)
    return {k: tuple(sorted(v)) for k, v in split.items()}


def source_files(split: str) -> list[Path]:
    """Sorted `.py` files of the stdlib for `split` in {"train", "heldout"}; site-packages excluded."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    return list(_split_files()[split])


def read_texts(split: str) -> list[str]:
    """The decoded text of every file of `split`; files that are not UTF-8 (a few test fixtures)
    are skipped rather than guessed at."""
    texts = []
    for path in source_files(split):
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
    return texts
