"""The verification tree: a row's root (its last committed token) plus the draft's nodes.

Node 0 is the root; draft node i becomes node i + 1, so a draft parent -1 becomes 0. Ancestor sets
come from `mmspec.kernels.tree_ancestors`, the same rule the attention mask uses, and the mask for
the verification forward is built with `BlockSparseMask.from_token_mask` of the shared layer: each
node attends the row's valid cache slots, itself and its ancestors.

A chain needs no tree mask: its mask is causal plus the rows' padding and holes, which the model's
own attention builds from a 2-D attention mask. The engine verifies chains that way (SDPA), because
on CPU the shared layer's torch backend costs about 2x SDPA's time for a few queries against a long
cache (measured: 34 ms vs 16 ms per forward of the built-in 4-layer model, 6 queries, 206 keys).
On a model with sliding-window layers chains go through the shared layer too: transformers counts
the window in cache slots, which the holes of a batch's rejected tokens would shift (`windows.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmspec.kernels import tree_ancestors

from .draft import Draft
from .windows import block_masks

# key block of the verification mask; 16 runs on the torch (CPU) and triton backends
BLOCK_SIZE = 16


@dataclass
class Tree:
    """tokens, parents, depth, valid: `[B, N]` (N = 1 + T); anc: bool `[B, N, N]`; probs `[B, T, V]`."""

    tokens: torch.Tensor
    parents: torch.Tensor
    anc: torch.Tensor
    depth: torch.Tensor
    valid: torch.Tensor
    probs: torch.Tensor | None

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @property
    def is_chain(self) -> bool:
        """Every node's parent is the node before it: the tree mask is plain causal."""
        n = self.num_nodes
        return bool((self.parents[:, 1:] == torch.arange(n - 1, device=self.parents.device)).all())


def _full_ancestors(parents: torch.Tensor) -> torch.Tensor:
    """parents long `[T]` of the draft -> bool `[1+T, 1+T]` ancestors with the root prepended."""
    full = torch.cat([parents.new_tensor([-1]), torch.where(parents < 0, 0, parents + 1)])
    return tree_ancestors(full)


def _check_draft(draft: Draft, batch: int, vocab: int) -> None:
    tokens, parents = draft.tokens, draft.parents
    if tokens.ndim != 2 or tokens.shape[0] != batch or tokens.dtype != torch.long:
        raise ValueError(f"Draft.tokens must be long [B={batch}, T], got {tokens.dtype} "
                         f"{tuple(tokens.shape)}")
    t = tokens.shape[1]
    if parents.shape not in ((t,), (batch, t)):
        raise ValueError(f"Draft.parents must be [T={t}] or [B={batch}, T={t}], got "
                         f"{tuple(parents.shape)}")
    n = draft.num_tokens
    if n is not None and (not isinstance(n, torch.Tensor) or n.shape != (batch,)
                          or n.dtype != torch.long):
        raise ValueError(f"Draft.num_tokens must be None or long [B={batch}], got "
                         f"{n.dtype if isinstance(n, torch.Tensor) else type(n).__name__} "
                         f"{tuple(n.shape) if isinstance(n, torch.Tensor) else n!r}")
    if draft.probs is not None and draft.probs.shape != (batch, t, vocab):
        raise ValueError(f"Draft.probs must be [B={batch}, T={t}, V={vocab}], got "
                         f"{tuple(draft.probs.shape)}")
    # the value checks in one host sync (a round's draft is checked every round)
    bad = [((parents < -1) | (parents >= torch.arange(t, device=parents.device))).any()]
    if t:
        bad.append(((tokens < 0) | (tokens >= vocab)).any().to(parents.device))
    if n is not None:
        bad.append(((n < 0) | (n > t)).any().to(parents.device))
    bad = torch.stack(bad).tolist()
    if bad[0]:
        raise ValueError(f"Draft.parents[..., i] must be -1 or an earlier node in [0, i), got "
                         f"{parents.tolist()}")
    if t and bad[1]:
        raise ValueError(f"Draft.tokens must lie in [0, {vocab}) (the target's vocabulary), got "
                         f"range [{int(tokens.min())}, {int(tokens.max())}]")
    if n is not None and bad[-1]:
        raise ValueError(f"Draft.num_tokens must lie in [0, T={t}], got {n.tolist()}")


def build_tree(roots: torch.Tensor, draft: Draft, vocab: int) -> Tree:
    """roots: long `[B]` last committed tokens. Returns the `Tree` of `1 + T` nodes per row."""
    b = roots.shape[0]
    _check_draft(draft, b, vocab)
    t = draft.tokens.shape[1]
    parents = draft.parents.to(roots.device)
    if parents.ndim == 1:
        anc = _full_ancestors(parents).expand(b, t + 1, t + 1)
    else:  # rows often share a tree shape: one ancestor matrix per distinct shape
        shapes, which = torch.unique(parents, dim=0, return_inverse=True)
        anc = torch.stack([_full_ancestors(p) for p in shapes])[which]
    full_parents = torch.cat([parents.new_full((*parents.shape[:-1], 1), -1),
                              torch.where(parents < 0, 0, parents + 1)], dim=-1)
    valid = torch.ones(b, t + 1, dtype=torch.bool, device=roots.device)
    if draft.num_tokens is not None:
        valid[:, 1:] = torch.arange(t, device=roots.device) < draft.num_tokens.to(roots.device)[:, None]
    return Tree(
        tokens=torch.cat([roots[:, None], draft.tokens.to(roots.device)], dim=1),
        parents=full_parents.expand(b, t + 1),
        anc=anc,
        depth=anc.sum(-1) - 1,
        valid=valid,
        probs=None if draft.probs is None else draft.probs.to(roots.device),
    )


def verify_token_mask(tree: Tree, cache_valid: torch.Tensor) -> torch.Tensor:
    """bool `[B, N, C + N]`: node i sees the row's valid cache slots and its ancestors."""
    b, c = cache_valid.shape
    return torch.cat([cache_valid[:, None, :].expand(b, tree.num_nodes, c), tree.anc], dim=-1)


def verify_mask(tree: Tree, cache_valid: torch.Tensor, windows: tuple[int, ...] = ()):
    """Mask `[B, 1, N, C + N]`: node i sees the row's valid cache slots and its ancestors.

    cache_valid: bool `[B, C]`, False on left padding and holes.
    windows: the target's sliding windows; with any, a dict of masks per window (`windows.py`),
    positions counted over valid slots.
    """
    token = verify_token_mask(tree, cache_valid)  # [B, N, C + N]

    def positions():
        cached = cache_valid.long()
        q_pos = cached.sum(-1, keepdim=True) + tree.depth  # [B, N]
        return q_pos, torch.cat([cached.cumsum(-1) - 1, q_pos], dim=-1)  # [B, C + N]

    return block_masks(token, BLOCK_SIZE, windows, positions)
