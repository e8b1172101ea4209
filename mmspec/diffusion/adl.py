"""Adaptive draft length (DiffuSpec §3.4, Eqs. 9-11), plus the fixed-k mode.

    L_gen_t = min(s_t - 1, k_t)        s_t: 1-based index of the first EOS in the raw argmax draft
    L_acc_t = accepted draft tokens    (the target's bonus/correction token excluded, Eq. 2)
    EMA:      L~ <- (1 - rho) * L~ + rho * L                      (both signals, Eq. 10)
    k_{t+1} = clip(round(L~gen_t) + delta * 1[L~acc_t >= L~gen_t], k_min, k_max)   (Eq. 11)

Both EMAs start at 0 and k_1 = k_max. The paper leaves the rounding of L~gen open; the default is
floor, like the third-party reproduction.

How the rule behaves (as the paper writes it, kept as is): accepted tokens never exceed generated
ones, so after one rejection L~acc stays below L~gen until full acceptances close the gap, which
halves per round at rho 0.5 (about 50 fully accepted rounds to reach equality in floating
point). Without an early EOS in the raw draft, k therefore settles at round(L~gen), near k_min
(round 1 already halves k_max), and grows by delta only where drafts keep running into EOS.
The zoo text preset (k in [4, 10]) drafts k = 5 in every round after its first
(tests/zoo/test_text_models.py, on the preset's held-out prompt).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ROUNDING = {"floor": math.floor, "round": round, "ceil": math.ceil}


def require_ints(config, *names: str) -> None:
    """A config's lengths and counts must be ints: a float k reached `torch.full` deep inside
    `generate` as a cryptic TypeError."""
    for name in names:
        value = getattr(config, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{type(config).__name__}.{name} must be an int, got {value!r}")


def require_types(config, **expected) -> None:
    """`name=type` (or a tuple of types; bool is never taken for a number): a string "0.5" failed
    later at a comparison with a TypeError that named neither the config nor the field."""
    for name, kinds in expected.items():
        value = getattr(config, name)
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        number = bool not in kinds and isinstance(value, bool)
        if number or not isinstance(value, kinds):
            names = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
            raise ValueError(f"{type(config).__name__}.{name} must be {names}, got {value!r}")


@dataclass(frozen=True)
class ADLConfig:
    k_min: int = 20  # paper §4.1: k in [20, 30]
    k_max: int = 30  # paper §4.1; also k_1
    delta: int = 10  # paper §4.1: growth step
    rho: float = 0.5  # paper §4.1: EMA rate
    rounding: str = "floor"  # unspecified in the paper; floor as in the reproduction

    def __post_init__(self):
        require_ints(self, "k_min", "k_max", "delta")
        require_types(self, rho=(int, float), rounding=str)
        if not 0 < self.k_min <= self.k_max:
            raise ValueError(f"need 0 < k_min <= k_max, got k_min={self.k_min}, "
                             f"k_max={self.k_max}")
        if not 0.0 < self.rho <= 1.0:
            raise ValueError(f"rho must be in (0, 1], got {self.rho}")
        if self.delta < 0:
            raise ValueError(f"delta must be >= 0, got {self.delta}")
        if self.rounding not in ROUNDING:
            raise ValueError(f"rounding must be one of {sorted(ROUNDING)}, got {self.rounding!r}")


def generated_length(raw_draft: list[int], eos_ids) -> int:
    """Eq. 9: tokens before the first EOS of the raw draft (k when there is none)."""
    eos = set(eos_ids)
    return next((i for i, t in enumerate(raw_draft) if t in eos), len(raw_draft))


class AdaptiveDraftLength:
    """One controller per sequence. `k` is the block length of the next round."""

    def __init__(self, cfg: ADLConfig = ADLConfig()):
        self.cfg = cfg
        self.gen_ema = 0.0
        self.acc_ema = 0.0
        self.k = cfg.k_max

    def update(self, generated: int, accepted: int) -> int:
        rho = self.cfg.rho
        self.gen_ema = (1 - rho) * self.gen_ema + rho * generated
        self.acc_ema = (1 - rho) * self.acc_ema + rho * accepted
        grow = self.cfg.delta if self.acc_ema >= self.gen_ema else 0
        k = ROUNDING[self.cfg.rounding](self.gen_ema) + grow
        self.k = min(max(k, self.cfg.k_min), self.cfg.k_max)
        return self.k


class FixedDraftLength:
    """The fixed-k mode: the same block length every round."""

    def __init__(self, k: int):
        if k <= 0:
            raise ValueError(f"draft length k must be > 0, got {k}")
        self.k = k

    def update(self, generated: int, accepted: int) -> int:
        return self.k
