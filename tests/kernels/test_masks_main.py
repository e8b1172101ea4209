import subprocess
import sys

import pytest

from mmspec.kernels.masks.__main__ import main


def test_prints_the_named_builders_only(capsys):
    main(["tree", "causal"])
    out = capsys.readouterr().out
    assert "== tree ==" in out and "ancestors" in out and "== causal ==" in out
    assert "prefix_block" not in out


def test_unknown_name_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        main(["trees"])
    assert "NAME must be one of causal, prefix_block, tree, got trees" in capsys.readouterr().err


def test_module_runs_without_a_runpy_warning():
    # `python -m mmspec.kernels.masks.tree` ran tree.py twice and warned (RuntimeWarning)
    run = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m",
                          "mmspec.kernels.masks", "prefix_block"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "prefix_causal=False" in run.stdout
