"""The draft heads' KV bookkeeping, shared by EAGLE's and ViSpec's drafters and their training.

A draft layer's KV is (k, v), each `[B, H, P, Dh]`, over the drafter's own short sequence. The
committed entries (the prompt at round 0, later the accepted tokens) stay in the drafter's cache
across rounds (the reference's `stable_kv`); a round's tree nodes live in a `TreeKV` beside it,
level after level, and are dropped with it after the round.
"""

from __future__ import annotations

import torch

KV = tuple  # (k, v), each `[B, H, P, Dh]`


def extend(past: KV | None, k: torch.Tensor, v: torch.Tensor) -> KV:
    """One layer: `past` `[B, H, P, Dh]` (None: nothing yet) followed by k, v `[B, H, N, Dh]` along
    the sequence -> `[B, H, P + N, Dh]`."""
    if past is None:
        return k, v
    return torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)


def append_kv(past: list | None, new: list) -> list:
    """Every layer's `extend`: per-layer `past` (None or empty: nothing yet) followed by `new`."""
    if not past:
        return list(new)
    return [extend(layer, k, v) for layer, (k, v) in zip(past, new)]


class TreeKV:
    """One round's tree nodes over the committed draft cache `committed` (per layer (k, v))."""

    def __init__(self, committed: list):
        self.committed, self.nodes = committed, []

    def past(self) -> list:
        """Per layer: the committed entries, then the nodes of every level drafted so far."""
        return append_kv(self.committed, self.nodes) if self.nodes else self.committed

    def add(self, level: list) -> None:
        """Append one level's nodes (per layer (k, v) `[B, H, K, Dh]`)."""
        self.nodes = append_kv(self.nodes, level)
