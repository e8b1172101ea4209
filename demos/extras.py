"""The demos' extra packages (gradio, matplotlib, pandas: `.[demo]` in pyproject.toml), checked
before they are imported: without them a demo ended in a raw ModuleNotFoundError."""

from __future__ import annotations

import importlib.util

DEMO_EXTRAS = ("gradio", "matplotlib", "pandas")
INSTALL = ".venv/bin/pip install -c constraints.txt -e '.[demo]'"


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except ValueError:  # sys.modules[name] is None: imported as absent
        return True


def require_demo_extras(script: str) -> None:
    """SystemExit with one line naming the missing packages and how to install them into the
    repository's venv (`make run` made it), before `script` imports any of them."""
    missing = [name for name in DEMO_EXTRAS if _missing(name)]
    if missing:
        raise SystemExit(f"{script} needs {', '.join(missing)}, of the demo extra: install the "
                         f"extra into the venv from the repository root with {INSTALL}")
