"""Where the zoo lives: shipped weights in `assets/zoo/`, training state in the git-ignored `out/`."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ZOO_DIR = REPO_ROOT / "assets" / "zoo"
OUT_DIR = REPO_ROOT / "out" / "zoo"


def positive_int(text: str) -> int:
    """argparse type of the trainers' `--steps`: a run of 0 steps has no loss to put on a card."""
    import argparse

    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {value}")
    return value


def model_path(text: str) -> str:
    """A model argument as a path: a zoo entry's name (`video-dit`, `text-target`) is its folder
    in `assets/zoo/` (as `mmspec.zoo.load` takes it), anything else (a path) is as given."""
    if "/" in text or Path(text).exists() or not (ZOO_DIR / text / "card.json").is_file():
        return text
    return str(ZOO_DIR / text)


def zoo_kind(path: str | Path) -> str | None:
    """The `kind` a zoo entry folder's card names (`vispec`, `video-dit`, ...); None for a folder
    without a card (any Hugging Face or diffusers folder)."""
    from mmspec.zoo.cards import read_card

    if not (Path(path) / "card.json").is_file():
        return None
    return read_card(path).get("kind")
