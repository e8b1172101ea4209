"""The docs site (mkdocs.yml: docs/ and the API reference from the docstrings) builds with warnings
as errors, as `make docs` builds it; `make test` installs the tools with the dev extra."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs tools: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings[python]")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                          str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("mmspec.generate", "mmspec.ModelDrafter", "mmspec.hub.resolve_model"):
        assert f'id="{name}"' in api, name  # the docstrings made it in
