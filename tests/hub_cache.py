"""A Hugging Face hub cache in the real layout, built from the zoo's folders: what
`huggingface_hub.snapshot_download` leaves on a machine that downloaded them.

    models--ORG--NAME/blobs/<sha256>            the files' contents
    models--ORG--NAME/snapshots/<REV>/<file>    relative symlinks to the blobs
    models--ORG--NAME/refs/main                 <REV>
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from mmspec.zoo.paths import ZOO_DIR

REVISION = "0123456789abcdef0123456789abcdef01234567"


def add_to_cache(cache: Path, repo_id: str, folder: Path, skip: tuple[str, ...] = ()) -> Path:
    """Put `folder`'s files (symlinks followed, `skip` left out) into `cache` as hub repo
    `repo_id`; returns the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.name in skip:
            continue
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


def zoo_hub_cache(cache: Path, *names: str) -> Path:
    """The zoo entries `names` as hub repos `mmspec/<name>` in `cache`."""
    for name in names:
        add_to_cache(cache, f"mmspec/{name}", ZOO_DIR / name)
    return cache
