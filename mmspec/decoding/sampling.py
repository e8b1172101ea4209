"""`SamplingConfig` (a call's sampling settings) and temperature, top-k and top-p warping.

The engine applies transformers' own processors to the target's logits (`processors.py`,
`generate.sampling_processors`); `warp_logits` / `target_probs` are for drafters that propose from
the call's warped distribution (`ModelDrafter(sample=True)`). The order and the tie rules are those
of transformers' `TemperatureLogitsWarper`, `TopKLogitsWarper` and `TopPLogitsWarper` (keep at least
one token; top-p drops the tokens whose ascending cumulative probability is at most `1 - top_p`).
"""

from __future__ import annotations

import numbers

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None  # None or 1.0: none; applies when greedy too

    def __post_init__(self):
        penalty = self.repetition_penalty
        if penalty is not None and (isinstance(penalty, bool) or not isinstance(penalty, (int, float))
                                    or not penalty > 0):
            raise ValueError(f"repetition_penalty must be a number > 0, got {penalty!r}")
        temperature = self.temperature
        if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
            raise ValueError(f"temperature must be a number, got {temperature!r}")
        if self.do_sample and not temperature > 0:
            raise ValueError(f"temperature must be > 0 when do_sample=True, got {temperature}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be None or an int >= 1, got {self.top_k!r}")
        if self.top_p is not None and (isinstance(self.top_p, bool)
                                       or not isinstance(self.top_p, numbers.Real)
                                       or not 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")


def warp_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """float `[..., V]` -> float32 `[..., V]` logits with filtered tokens at -inf."""
    logits = logits.float() / cfg.temperature
    if cfg.top_k is not None and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1)  # ascending
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum <= 1 - cfg.top_p
        drop_sorted[..., -1] = False  # keep at least one token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def target_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """float `[..., V]` -> probabilities `[..., V]` (float32) the target samples from."""
    return warp_logits(logits, cfg).softmax(-1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """`norm(max(p - q, 0))` over the last dim; rows where p <= q everywhere keep p.

    After a rejection this is the distribution the next candidate is tested against (SpecInfer
    multi-candidate rejection; with q a point mass it is p with that token removed). p: a
    distribution `[..., V]`; q: one `[..., V]`, or long `[..., 1]` the token of a point mass
    (the same values without building the one-hot: p's entries are at most 1).
    """
    if q.is_floating_point():
        r = (p - q).clamp_min(0)
    else:
        r = p.scatter(-1, q, 0.0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(1e-30), p)
