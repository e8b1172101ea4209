"""Each demo, run without the demo extra (gradio, ...), says in one line how to install it into
the venv, before any import fails (`demos/extras.py`)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# gradio imported as absent (None in sys.modules), whether or not this venv has it
HIDE = "import runpy, sys; sys.modules['gradio'] = None; sys.argv = [sys.argv[1]]; " \
       "runpy.run_path(sys.argv[0], run_name='__main__')"


@pytest.mark.parametrize("demo", ["vlm_chat", "dlm_lattice", "video_draft"])
def test_a_demo_without_its_extra_names_the_install_command(demo):
    run = subprocess.run([sys.executable, "-c", HIDE, f"demos/{demo}.py"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert re.fullmatch(rf"demos/{demo}.py needs gradio(, matplotlib)?(, pandas)?, of the demo "
                        rf"extra: install the extra into the venv from the repository root with "
                        rf"\.venv/bin/pip install -c constraints\.txt -e '\.\[demo\]'\n",
                        run.stderr), run.stderr
