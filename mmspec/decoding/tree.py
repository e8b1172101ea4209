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
    """tokens, parents, depth, valid: `[B, N]` (N = 1 + T); anc: bool `[B, N, N]`; probs `[B, T, V]`.

    The shape also lives on the host: `host_parents` long `[N]` or `[B, N]` and `host_depth` (CPU
    tensors, read by the engine without a device sync); `checks`: long `[4]` on the device, the
    draft's deferred value checks (`build_tree(defer_checks=True)`), else None.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    anc: torch.Tensor
    depth: torch.Tensor
    valid: torch.Tensor
    probs: torch.Tensor | None
    host_parents: torch.Tensor | None = None
    host_depth: torch.Tensor | None = None
    checks: torch.Tensor | None = None

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @property
    def max_depth(self) -> int:
        return int(self.host_depth.max()) if self.host_depth.numel() else 0

    @property
    def is_chain(self) -> bool:
        """Every node's parent is the node before it: the tree mask is plain causal."""
        n = self.num_nodes
        return bool((self.host_parents[..., 1:] == torch.arange(n - 1)).all())


def _full_ancestors(parents: torch.Tensor) -> torch.Tensor:
    """parents long `[T]` of the draft -> bool `[1+T, 1+T]` ancestors with the root prepended."""
    full = torch.cat([parents.new_tensor([-1]), torch.where(parents < 0, 0, parents + 1)])
    return tree_ancestors(full)


def _check_draft(draft: Draft, parents: torch.Tensor, batch: int, vocab: int):
    """Shape checks, and the parents' values on the host (`parents`: a CPU copy). Returns the
    value checks of the tokens and `num_tokens`, long `[4]` on the device: (any token out of
    range, min token, max token, any num_tokens out of range)."""
    tokens = draft.tokens
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
    if bool(((parents < -1) | (parents >= torch.arange(t))).any()):
        raise ValueError(f"Draft.parents[..., i] must be -1 or an earlier node in [0, i), got "
                         f"{parents.tolist()}")
    zero = torch.zeros((), dtype=torch.long, device=tokens.device)
    if t:
        checks = [((tokens < 0) | (tokens >= vocab)).any().long(), tokens.min(), tokens.max()]
    else:
        checks = [zero, zero, zero]
    checks.append(zero if n is None else ((n < 0) | (n > t)).any().long().to(tokens.device))
    return torch.stack(checks)


def raise_draft_errors(checks: list[int], draft: Draft, vocab: int) -> None:
    """The ValueError of a failed deferred check (`checks`: `Tree.checks` read to the host)."""
    bad_tokens, low, high, bad_num = checks
    if bad_tokens:
        raise ValueError(f"Draft.tokens must lie in [0, {vocab}) (the target's vocabulary), got "
                         f"range [{low}, {high}]")
    if bad_num:
        raise ValueError(f"Draft.num_tokens must lie in [0, T={draft.tokens.shape[1]}], got "
                         f"{draft.num_tokens.tolist()}")


def build_tree(roots: torch.Tensor, draft: Draft, vocab: int, defer_checks: bool = False) -> Tree:
    """roots: long `[B]` last committed tokens. Returns the `Tree` of `1 + T` nodes per row.

    The tree's shape is worked out on the host from `draft.parents` (free when the drafter builds
    them on the CPU, as `Draft.chain` does; one read otherwise). `defer_checks`: the token and
    `num_tokens` value checks stay on the device in `Tree.checks` (out-of-range tokens clamped)
    for the caller to read with its own (`raise_draft_errors`); else they raise here.
    """
    b = roots.shape[0]
    host = draft.parents.cpu()
    checks = _check_draft(draft, host, b, vocab)
    if not defer_checks:
        raise_draft_errors(checks.tolist(), draft, vocab)
    t = draft.tokens.shape[1]
    if host.ndim == 1:
        anc = _full_ancestors(host).expand(b, t + 1, t + 1)
    else:  # rows often share a tree shape: one ancestor matrix per distinct shape
        shapes, which = torch.unique(host, dim=0, return_inverse=True)
        anc = torch.stack([_full_ancestors(p) for p in shapes])[which]
    full_parents = torch.cat([host.new_full((*host.shape[:-1], 1), -1),
                              torch.where(host < 0, 0, host + 1)], dim=-1)
    host_depth = anc.sum(-1) - 1  # [B, N]
    valid = torch.ones(b, t + 1, dtype=torch.bool, device=roots.device)
    if draft.num_tokens is not None:
        valid[:, 1:] = torch.arange(t, device=roots.device) < draft.num_tokens.to(roots.device)[:, None]
    tokens = draft.tokens.to(roots.device)
    if defer_checks and t:
        tokens = tokens.clamp(0, vocab - 1)  # never index the embedding out of range
    return Tree(
        tokens=torch.cat([roots[:, None], tokens], dim=1),
        parents=full_parents.expand(b, t + 1).to(roots.device),
        anc=anc.to(roots.device),
        depth=host_depth.to(roots.device),
        valid=valid,
        probs=None if draft.probs is None else draft.probs.to(roots.device),
        host_parents=full_parents,
        host_depth=host_depth,
        checks=checks if defer_checks else None,
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
