"""Ctrl-C at the command line: one line saying what was kept and how to resume, exit status 130
(128 + SIGINT, what a shell reports for a process the signal ended), never a traceback.

A long job raises `Interrupted` (a KeyboardInterrupt, so library callers and tests still see the
interrupt) carrying that line; `run_command` is the process entry point every `__main__` goes
through, and prints it. `uninterrupted` holds a Ctrl-C back for the few statements that must not
be cut in half (an optimizer step and the step counter that a checkpoint records with it).
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager

EXIT_INTERRUPTED = 130


class Interrupted(KeyboardInterrupt):
    """A KeyboardInterrupt whose message says what was kept and how to resume."""


def run_command(main, argv=None,
                default: str = "rerun the same command to resume where its last save left "
                               "off") -> int:
    """`main(argv)` as a command: its return value, or on Ctrl-C one line on stderr (an
    `Interrupted`'s message, else `default`) and 130."""
    try:
        return main(argv) or 0
    except KeyboardInterrupt as err:
        what = str(err) if isinstance(err, Interrupted) and str(err) else default
        print(f"interrupted: {what}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


@contextmanager
def uninterrupted():
    """Inside, SIGINT is held back and raised as KeyboardInterrupt when the block ends: a
    checkpoint then never holds a half-applied optimizer step. (Outside the main thread, where
    signals cannot be handled, this does nothing.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt
