"""`SpecStats`: what a speculative `generate` call did, and how fast.

tau conventions (vispec.md §1.5): EAGLE papers report tau *with* the bonus token (tokens per
target forward), ViSpec without it. Both are given, averaged over (row, round) pairs so that batch
rows count like separate requests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class SpecStats:
    rounds: int = 0  # verification forwards of the target (the prefill not counted)
    row_rounds: int = 0  # (row, round) pairs with the row still generating
    drafted: int = 0  # draft nodes proposed to live rows
    accepted: int = 0  # draft tokens accepted and committed (bonus excluded, cut at EOS/budget)
    committed: int = 0  # tokens the rounds committed to live rows (accepted + bonus, cut alike)
    new_tokens: int = 0  # tokens committed, all rows, the prefill's first token included
    draft_time: float = 0.0  # seconds in drafter.propose and drafter.update
    verify_time: float = 0.0  # the rest of the rounds: target forwards plus the engine's own work
    target_forward_time: float = 0.0  # seconds in the target's verification forwards alone
    prefill_time: float = 0.0
    replays: int = 0  # rounds that fed the committed tokens again (recurrent targets, recurrent.py)
    replay_time: float = 0.0  # seconds in those replays (part of target_forward_time)
    total_time: float = 0.0
    compile_time: float = 0.0  # compile=True: seconds of the forwards that compiled a graph

    @property
    def mean_accepted(self) -> float:
        """tau with the bonus token: tokens committed per row per target forward (a round cut
        by EOS or the budget inside the accepted draft commits no bonus token, and counts none)."""
        return self.committed / max(self.row_rounds, 1)

    @property
    def mean_accepted_no_bonus(self) -> float:
        """tau without the bonus token (ViSpec's convention)."""
        return self.accepted / max(self.row_rounds, 1)

    @property
    def engine_time(self) -> float:
        """The engine's own cost: rounds minus drafter calls minus target forwards."""
        return self.verify_time - self.target_forward_time

    @property
    def tokens_per_s(self) -> float:
        """Throughput without compilation (`compile_time`, part of `total_time`)."""
        seconds = self.total_time - self.compile_time
        return self.new_tokens / seconds if seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "mean_accepted": self.mean_accepted,
                "mean_accepted_no_bonus": self.mean_accepted_no_bonus,
                "engine_time": self.engine_time,
                "tokens_per_s": self.tokens_per_s}

    def __str__(self) -> str:
        return (f"{self.new_tokens} tokens in {self.total_time:.2f} s ({self.tokens_per_s:.1f} tok/s), "
                f"{self.rounds} rounds, tau {self.mean_accepted:.2f} with bonus / "
                f"{self.mean_accepted_no_bonus:.2f} without, accepted {self.accepted}/"
                f"{self.drafted} drafted, draft {self.draft_time:.2f} s, "
                f"verify {self.verify_time:.2f} s"
                + (f", compile {self.compile_time:.2f} s (not in tok/s)" if self.compile_time
                   else ""))
