"""Causal-consistency path search (DiffuSpec §3.3, Eqs. 7-8).

The DLM lattice holds per-position candidates whose top-1 tokens need not read well left to right.
CPS prunes every position to the smallest top-m set reaching cumulative mass tau (m <= M_max, Eq. 7),
always keeps EOS, stops expanding after the first EOS, and runs a left-to-right beam search of width
B with the score (Eq. 8)

    S(pi) = sum_i  lam * l_dlm_i(pi_i) + (1 - lam) * l_proxy(pi_i | prefix, pi_<i).

Two choices the paper leaves open are options here (reference notes §1.4 (a), (b)):
- `eos_stop="top1"`: the search ends at the first position whose top-1 token is EOS (the same event
  that ends ADL's raw draft, Eq. 9). `"in_mass"`: at the first position where EOS falls inside the
  mass-tau set before EOS is force-added (the third-party reproduction's reading).
- `rank`: how beams of different lengths are compared. `"equal_depth"` (default) returns the best
  beam among the deepest ones, so an early EOS never wins only by having fewer negative terms;
  `"sum"` is Eq. 8 literally; `"mean"` normalises by length.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Protocol

import torch

from .adl import require_ints, require_types


@dataclass(frozen=True)
class CPSConfig:
    tau: float = 0.8  # paper §4.1 / Fig. 7c: cumulative mass kept per position
    max_candidates: int = 15  # paper §4.1 / Fig. 7b: M_max
    beam_width: int = 3  # paper §4.1 / Fig. 7a: B
    lam: float = 0.5  # paper §4.1: weight of the DLM log-prob against the causal proxy
    eos_stop: str = "top1"  # reference notes §1.4 (a)
    rank: str = "equal_depth"  # reference notes §1.4 (b)

    def __post_init__(self):
        require_ints(self, "max_candidates", "beam_width")
        require_types(self, tau=(int, float), lam=(int, float), eos_stop=str, rank=str)
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if self.max_candidates < 1 or self.beam_width < 1:
            raise ValueError(f"max_candidates and beam_width must be >= 1, got "
                             f"{self.max_candidates} and {self.beam_width}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")
        if self.eos_stop not in ("top1", "in_mass"):
            raise ValueError(f"eos_stop must be 'top1' or 'in_mass', got {self.eos_stop!r}")
        if self.rank not in ("equal_depth", "sum", "mean"):
            raise ValueError(f"rank must be 'equal_depth', 'sum' or 'mean', got {self.rank!r}")


class CausalProxy(Protocol):
    """A left-to-right scorer for one sequence: `begin` once per round, then `score` per depth."""

    def begin(self, history: torch.Tensor) -> None:
        """history: long `[L]`, the prompt plus the committed output (no padding)."""

    def score(self, paths: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """paths `[n, d]` (beam prefixes after history), candidates `[C]` -> log-probs `[n, C]`."""


@dataclass
class Beam:
    tokens: list
    score: float
    finished: bool  # ended with EOS


def candidate_sets(logprobs: torch.Tensor, cfg: CPSConfig, eos_ids: list[int]):
    """Eq. 7 plus the EOS rules for one row's lattice `[k, V]`.

    Returns a list of (token ids, DLM log-probs), two lists of floats/ints per position, in order.
    The list stops at the first EOS position (inclusive), so its length is m_max.
    """
    top = logprobs.topk(min(cfg.max_candidates, logprobs.shape[-1]), dim=-1)  # [k, M]
    probs = top.values.exp()
    mass_before = probs.cumsum(-1) - probs  # [k, M]
    finite = torch.isfinite(top.values).sum(-1)  # [k]; ids the lattice rules out never count
    keep = torch.minimum((mass_before < cfg.tau).sum(-1).clamp(min=1), finite).tolist()  # [k]
    indices, values = top.indices.tolist(), top.values.tolist()
    eos_lp = logprobs[:, eos_ids].tolist() if eos_ids else [[] for _ in keep]  # [k, E]
    eos = set(eos_ids)
    sets = []
    for i, m in enumerate(keep):
        tokens, dlm = indices[i][:m], values[i][:m]
        stop = bool(eos & set(tokens[:1] if cfg.eos_stop == "top1" else tokens))
        for e, lp in zip(eos_ids, eos_lp[i]):
            if e not in tokens and lp != float("-inf"):
                tokens, dlm = tokens + [e], dlm + [lp]
        sets.append((tokens, dlm))
        if stop:
            break
    return sets


def _rank_key(beam: Beam, rank: str):
    if rank == "equal_depth":
        return (len(beam.tokens), beam.score)
    if rank == "mean":
        return beam.score / len(beam.tokens)
    return beam.score


def beam_search(sets, cfg: CPSConfig, eos_ids: list[int],
                proxy: CausalProxy | None = None) -> list[Beam]:
    """Left-to-right beam search over `candidate_sets` output. Returns up to B beams, best first.

    At every depth the B best extensions of the live beams survive (all have equal length, so raw
    scores compare fairly); those ending in EOS are finished and no longer expanded. Plain Python
    floats: at most B x (M_max + #EOS) scores per depth.
    """
    use_proxy = cfg.lam < 1.0
    if use_proxy and proxy is None:
        raise ValueError(f"lam={cfg.lam} < 1 needs a causal proxy")
    fast_score = getattr(proxy, "score_lists", None)  # NgramProxy: lists in, lists out
    live = [Beam([], 0.0, False)]
    finished: list[Beam] = []
    eos = set(eos_ids)
    for tokens, dlm in sets:
        if cfg.lam > 0.0:  # lam == 0 must not turn a -inf DLM score into nan
            dlm = [cfg.lam * lp for lp in dlm]
        else:
            dlm = [0.0] * len(tokens)
        if use_proxy and fast_score is not None:
            causal = fast_score([b.tokens for b in live], tokens)  # [n][C], plain lists
        elif use_proxy:
            paths = torch.tensor([b.tokens for b in live], dtype=torch.long).reshape(len(live), -1)
            causal = proxy.score(paths, torch.tensor(tokens)).tolist()  # [n][C]
        extensions = []  # (score, beam index, candidate index)
        for p, beam in enumerate(live):
            for c in range(len(tokens)):
                score = beam.score + dlm[c]
                if use_proxy:
                    score += (1.0 - cfg.lam) * causal[p][c]
                extensions.append((score, p, c))
        live_next = []
        for score, p, c in heapq.nlargest(cfg.beam_width, extensions, key=lambda e: e[0]):
            beam = Beam(live[p].tokens + [tokens[c]], score, tokens[c] in eos)
            (finished if beam.finished else live_next).append(beam)
        live = live_next
        if not live:
            break
    beams = [b for b in finished + live if b.tokens]
    beams.sort(key=lambda b: _rank_key(b, cfg.rank), reverse=True)
    return beams[:cfg.beam_width]


def search(logprobs: torch.Tensor, cfg: CPSConfig, eos_ids: list[int],
           proxy: CausalProxy | None = None) -> list[Beam]:
    """CPS on one row's lattice `[k, V]` (after `proxy.begin(history)`)."""
    return beam_search(candidate_sets(logprobs, cfg, eos_ids), cfg, eos_ids, proxy)
