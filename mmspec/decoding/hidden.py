"""The target's hidden states a drafter reads (`Drafter.needs_target_hidden`): the entries of
transformers' `hidden_states` tuple it names, checked once on the prefill's forward, before the
first token, then gathered side by side after every forward.

A drafter is made for `[batch, tokens, width]` tensors at the entries it names. Not every model
returns those: some stack parallel residual streams on an extra axis (Gemma 3n's AltUp
predictions `[streams, B, L, H]`, HunYuan-V4's hyper-connections `[B, L, streams, H]`), some
flatten them into a wider last axis (Qwen4-Exp's inner layers), and some count sublayers in
`num_hidden_layers` that the tuple does not have an entry for (LongCat-Flash: two per entry). No
drafter made for plain layers can read those, so such a target is refused (`UnsupportedTarget`,
one line naming the entry and the shape found against the one expected) before any token is
emitted or streamed, instead of failing inside the gathering or in the drafter's first round.
"""

from __future__ import annotations

import torch

from .admission import UnsupportedTarget


def check_hidden(target, hidden_states, layers: tuple, width: int | None, batch: int,
                 length: int) -> None:
    """Raise `UnsupportedTarget` unless every entry `layers` of the prefill's `hidden_states`
    exists and is `[batch, length, width]` (`width` None: any width)."""
    name, asked = type(target).__name__, list(layers)
    if hidden_states is None:
        raise UnsupportedTarget(
            f"{name}: its forward returns no hidden_states (output_hidden_states=True), and the "
            f"drafter reads entries {asked} of them (needs_target_hidden); use another drafter "
            f"or target.generate")
    n = len(hidden_states)
    for i in layers:
        if not -n <= i < n:
            raise UnsupportedTarget(
                f"{name}: the drafter reads hidden_states entry {i} (target_hidden_layers "
                f"{asked}), but the target's forward returns {n} entries (ids in [-{n}, {n})); "
                f"use a drafter made for this target or target.generate")
        found = hidden_states[i]
        shape = list(found.shape) if isinstance(found, torch.Tensor) else type(found).__name__
        want = [batch, length, "width" if width is None else width]
        if not (isinstance(found, torch.Tensor) and found.dim() == 3
                and list(found.shape[:2]) == want[:2] and width in (None, found.shape[2])):
            raise UnsupportedTarget(
                f"{name}: its hidden_states entry {i} is {shape}, but the drafter "
                f"(target_hidden_layers {asked}) reads [batch, prompt tokens, width] = {want}; "
                f"use a drafter made for this target's hidden states or target.generate")


def gather_hidden(hidden_states, layers: tuple) -> torch.Tensor:
    """The drafter's features: the entries `layers`, concatenated `[B, L, H * len(layers)]`."""
    return torch.cat([hidden_states[i] for i in layers], dim=-1)
