import subprocess
import sys

import pytest

from mmspec.kernels.masks.__main__ import main


def test_prints_the_named_builders_only(capsys):
    main(["tree", "causal"])
    out = capsys.readouterr().out
    assert "== tree ==" in out and "ancestors" in out and "== causal ==" in out
    assert "prefix_block" not in out


def test_output_has_a_legend_and_no_wrapped_tensor(capsys):
    # the tree example printed its dense 8 x 48 mask as a torch tensor, wrapped over 16 lines,
    # and no builder said what the block pictures' characters mean
    main([])
    out = capsys.readouterr().out
    assert "tensor(" not in out and max(len(line) for line in out.splitlines()) <= 99
    assert "█ every query attends every key of the block, ░ some do, ' ' none" in out
    assert "(█ attends, · does not)" in out
    tree_rows = [line.split() for line in out.splitlines() if line.endswith("█ █ · █ · · █ █")]
    assert tree_rows == [["7", "6", "4", "all", "40", *"█ █ · █ · · █ █".split()]]


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
