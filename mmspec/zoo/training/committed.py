"""Fine-tunes start from a committed zoo entry, `<git rev>:<entry dir>` (e.g.
`HEAD~1:assets/zoo/text-dlm`), read with `git show`: the run may overwrite the entry it started
from, and the new card records the ref and that entry's own card."""

from __future__ import annotations

import subprocess

import torch

from mmspec.zoo.paths import REPO_ROOT


def git_show(ref: str, name: str) -> bytes:
    """The bytes of file `name` in the entry `ref` = `<git rev>:<entry dir>`."""
    if ":" not in ref:
        raise ValueError(f"init_from must be '<git rev>:<entry dir>', e.g. "
                         f"'HEAD:assets/zoo/text-dlm', got {ref!r}")
    rev, entry = ref.split(":", 1)
    done = subprocess.run(["git", "show", f"{rev}:{entry}/{name}"], capture_output=True,
                          cwd=REPO_ROOT)
    if done.returncode:
        raise ValueError(f"init_from {ref!r}: git cannot show {rev}:{entry}/{name}: "
                         f"{done.stderr.decode().strip()}")
    return done.stdout


def committed_card(ref: str) -> dict:
    """`ref`'s card, without its `attempts` (the new card carries those)."""
    import json

    card = json.loads(git_show(ref, "card.json"))
    card.pop("attempts", None)
    return card


def committed_state(ref: str) -> dict[str, torch.Tensor]:
    """`ref`'s `model.safetensors`, every tensor in fp32."""
    from safetensors.torch import load

    return {k: v.float() for k, v in load(git_show(ref, "model.safetensors")).items()}


def load_committed(module: torch.nn.Module, state: dict, ref: str, may_miss=()) -> None:
    """Load `state` into `module`; anything but the names ending in `may_miss` (tied weights)
    missing, unexpected or of another shape is a ValueError naming `ref`."""
    try:
        missing, unexpected = module.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shape mismatches
        raise ValueError(f"--init-from {ref}: its weights do not match this model: {err}") from err
    missing = [k for k in missing if not k.endswith(tuple(may_miss))]
    if missing or unexpected:
        raise ValueError(f"--init-from {ref}: its weights do not match this model: missing "
                         f"{missing}, unexpected {unexpected}")
