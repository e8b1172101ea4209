import os
import signal

import pytest

from mmspec.__main__ import main
from mmspec.cli import bench
from mmspec.cli import generate as cli_generate
from mmspec.interrupt import run_command, uninterrupted


def test_ctrl_c_in_mmspec_generate_is_one_line_and_exit_130(interrupt_on_call, capsys):
    interrupt_on_call(cli_generate, "_setup", 1)
    assert main(["generate", "--target", "builtin", "--no-baseline"]) == 130
    err = capsys.readouterr().err
    assert err == ("interrupted: mmspec generate stopped; it saves nothing, so rerun it to start "
                   "again\n")


def test_ctrl_c_in_mmspec_bench_names_what_finished_and_what_is_left(monkeypatch, capsys):
    ran = []

    def call(cmd, **kwargs):  # the first benchmark finishes, Ctrl-C in the second
        ran.append(cmd[1])
        if len(ran) == 2:
            raise KeyboardInterrupt
        return 0

    monkeypatch.setattr(bench, "_options", lambda script: {"--plot"})
    monkeypatch.setattr(bench.subprocess, "call", call)
    assert main(["bench", "kernels", "text", "vlm", "--plot"]) == 130
    last = capsys.readouterr().err.strip().splitlines()
    assert last == ["interrupted: text stopped (nothing of it written); finished before it: "
                    "kernels; `mmspec bench text vlm --plot` runs the rest"]


def test_a_ctrl_c_inside_uninterrupted_waits_for_the_block_to_end():
    finished, before = [], signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)  # delivered now, raised at the block's end
            finished.append(True)
    assert finished == [True]
    assert signal.getsignal(signal.SIGINT) is before


def test_run_command_passes_the_return_value_through():
    assert run_command(lambda argv: 3) == 3 and run_command(lambda argv: None) == 0
