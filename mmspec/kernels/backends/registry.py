"""Backend registry for `block_sparse_attention`, in the style of diffusers' `attention_dispatch.py`.

Each backend is a function `(q, k, v, mask, scale, softcap) -> (out, lse)` (softcap 0 means none)
registered with declarative constraints, and optionally a gathered form `(q, k, v, mask, scale,
softcap, rows)` that reads the mask's row i at token `rows[i]` of q, k and v and writes out and lse
in their own order (`block_sparse_attention(token_order=)`; the others gather and scatter around
the plain function). A constraint returns None when it holds and a sentence
saying why not otherwise. `"auto"` picks the first backend whose constraints all hold, in the order
of this machine's timing table (`timings.py`: fastest first for the call's device, dtype, head dim
and density) where it has an entry, then in the fixed order below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..mask import BlockSparseMask
from . import timings

BackendFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, BlockSparseMask, float, float],
    tuple[torch.Tensor, torch.Tensor],
]
Constraint = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, BlockSparseMask], Optional[str]]


@dataclass(frozen=True)
class Backend:
    name: str
    fn: BackendFn
    constraints: tuple[Constraint, ...] = field(default=())
    gathered: Callable | None = None  # fn with a row index in its loads, where the kernel has one

    def problems(self, q, k, v, mask) -> list[str]:
        return [msg for check in self.constraints if (msg := check(q, k, v, mask)) is not None]


_BACKENDS: dict[str, Backend] = {}
# without a timing table "auto" tries these in order; Triton only for CUDA tensors (never the
# interpreter, which is for testing the kernel, not for running models)
_AUTO_ORDER = {"cuda": ("triton", "torch")}
_AUTO_DEFAULT = ("torch",)


def register_backend(name: str, constraints: tuple[Constraint, ...] = (),
                     gathered: Callable | None = None):
    def wrap(fn: BackendFn) -> BackendFn:
        _BACKENDS[name] = Backend(name, fn, tuple(constraints), gathered)
        return fn

    return wrap


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def get_backend(name: str) -> Backend:
    return _BACKENDS[name]


def resolve_backend(name: str, q, k, v, mask) -> Backend:
    if name == "auto":
        fixed = _AUTO_ORDER.get(q.device.type, _AUTO_DEFAULT)
        measured = timings.ranking(q, mask) or ()
        order = tuple(measured) + tuple(n for n in fixed if n not in measured)
        for candidate in order:
            backend = _BACKENDS.get(candidate)
            if backend is not None and not backend.problems(q, k, v, mask):
                return backend
        raise ValueError(
            "no backend accepts these inputs: "
            + "; ".join(f"{n}: {', '.join(_BACKENDS[n].problems(q, k, v, mask))}"
                        for n in order if n in _BACKENDS)
        )
    if name not in _BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {available_backends()}, got {name!r}")
    backend = _BACKENDS[name]
    problems = backend.problems(q, k, v, mask)
    if problems:
        raise ValueError(f"backend {name!r} cannot run these inputs: {'; '.join(problems)}")
    return backend
