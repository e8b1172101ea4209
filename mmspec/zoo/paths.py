"""Where the zoo lives: shipped weights in `assets/zoo/`, training state in the git-ignored `out/`."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ZOO_DIR = REPO_ROOT / "assets" / "zoo"
OUT_DIR = REPO_ROOT / "out" / "zoo"
