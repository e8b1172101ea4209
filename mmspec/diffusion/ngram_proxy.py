"""CPS's default causal proxy: a token-id n-gram model fitted online to the prompt and the output.

The paper scores paths with a word-level 3-gram KenLM trained offline (DiffuSpec §3.3, App. A). This
is the reference notes' §1.4 (c) alternative: an n-gram over the target's token ids, so no
detokenisation and no extra corpus; it learns the prompt and everything committed so far, which is
where speculative decoding's repeats come from (the PLD observation).

Smoothing is interpolated absolute discounting down to a uniform distribution over the vocabulary:

    P_n(w | h) = (max(c(h, w) - D, 0) + D * N1+(h .) * P_{n-1}(w | h')) / c(h),   P_0(w) = 1 / V

where h' drops the oldest token of h; an unseen context falls back to the shorter one. Every P_n is
a proper distribution.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import torch


class NgramProxy:
    """Online token n-gram for one sequence. `begin(history)` fits the tokens it has not seen yet
    (or refits from scratch when `history` does not extend what it saw: a new prompt)."""

    def __init__(self, vocab_size: int, order: int = 3, discount: float = 0.75):
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        if not 0.0 < discount < 1.0:
            raise ValueError(f"discount must be in (0, 1), got {discount}")
        self.vocab_size, self.order, self.discount = vocab_size, order, discount
        self.history: list[int] = []
        self.counts: dict = defaultdict(Counter)  # context tuple -> Counter(next token)
        self.totals: Counter = Counter()  # context tuple -> c(h)

    def begin(self, history: torch.Tensor) -> None:
        tokens = history.tolist()
        seen = len(self.history)
        if tokens[:seen] != self.history:
            self.history, self.counts, self.totals, seen = [], defaultdict(Counter), Counter(), 0
        self.history = tokens
        for t in range(seen, len(tokens)):
            for n in range(self.order):  # contexts of length 0 .. order-1
                if t - n < 0:
                    break
                context = tuple(tokens[t - n:t])
                self.counts[context][tokens[t]] += 1
                self.totals[context] += 1

    def prob(self, context: list[int], token: int) -> float:
        """P(token | last order-1 tokens of context)."""
        context = context[-(self.order - 1):] if self.order > 1 else []
        p = 1.0 / self.vocab_size
        for n in range(len(context) + 1):
            h = tuple(context[len(context) - n:])
            counts = self.counts.get(h)
            if not counts:
                break  # a longer context containing this one is unseen too
            p = (max(counts[token] - self.discount, 0.0) + self.discount * len(counts) * p)
            p /= self.totals[h]
        return p

    def score(self, paths: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """paths `[n, d]`, candidates `[C]` -> log-probs `[n, C]`; `prob` for every pair, with the
        context lookups done once per path instead of once per candidate (CPS's hot loop)."""
        rows = self.score_lists(paths.tolist(), candidates.tolist())
        return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), candidates.numel())

    def score_lists(self, paths: list[list[int]], cands: list[int]) -> list[list[float]]:
        """`score` on plain lists: CPS calls this when a proxy has it, skipping the tensor round
        trips that cost about a third of a search on CPU."""
        uniform, discount = 1.0 / self.vocab_size, self.discount
        rows = []
        for path in paths:
            context = (self.history[-self.order:] + path)[-(self.order - 1):] if self.order > 1 \
                else []
            probs = [uniform] * len(cands)
            for n in range(len(context) + 1):
                h = tuple(context[len(context) - n:])
                counts = self.counts.get(h)
                if not counts:
                    break
                back, total = discount * len(counts), self.totals[h]
                probs = [(max(counts.get(c, 0) - discount, 0.0) + back * p) / total
                         for c, p in zip(cands, probs)]
            rows.append([math.log(p) for p in probs])
        return rows
