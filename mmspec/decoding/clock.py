"""The engine's stopwatch: wall time by default, CUDA events with `profile=True`."""

from __future__ import annotations

import time

import torch


class Clock:
    """Stamps of a call's phases. `profile=True` on a CUDA device: CUDA events, read once when
    the call is over (no round waits for them); otherwise wall time, which on a GPU is the host's
    view (kernels launched, not finished): only the call's total is then synchronised."""

    def __init__(self, device: torch.device, profile: bool):
        self.device = device
        self.events = profile and device.type == "cuda"
        self.spans: dict = {}  # name -> event pairs, or seconds so far

    def now(self):
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def add(self, name: str, start, end) -> None:
        if self.events:
            self.spans.setdefault(name, []).append((start, end))
        else:
            self.spans[name] = self.spans.get(name, 0.0) + (end - start)

    def seconds(self, name: str) -> float:
        if self.events:
            return sum(a.elapsed_time(b) for a, b in self.spans.get(name, [])) / 1000
        return self.spans.get(name, 0.0)

    def finish(self) -> float:
        """Wait for the device once; the wall time now."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def fill_times(stats, clock) -> None:
    stats.prefill_time = clock.seconds("prefill")
    stats.draft_time = clock.seconds("draft")
    stats.verify_time = clock.seconds("round") - stats.draft_time
    stats.target_forward_time = clock.seconds("forward")
    stats.replay_time = clock.seconds("replay")
