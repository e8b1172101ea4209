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
