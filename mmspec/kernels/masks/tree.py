"""Tree mask for speculative tree verification, from a parent array.

A draft tree of T tokens is appended after `prefix_len` cached tokens. `parents[i]` is the index of
token i's parent in the tree, or -1 for a child of the last committed token; parents come before
children (`parents[i] < i`). Token i attends the whole prefix, itself and its ancestors (the EAGLE
/ Medusa tree mask: `eye(T)` OR'd with each parent's row). Its position is `prefix_len + depth`,
so siblings share a position.

A chain is the tree with `parents = [-1, 0, 1, ...]`.
"""

import torch

from ..mask import BlockSparseMask, _length, _pair


def _check_parents(parents: torch.Tensor) -> torch.Tensor:
    raw = torch.as_tensor(parents)
    if raw.is_floating_point() or raw.is_complex() or raw.dtype == torch.bool:
        raise ValueError(f"parents must be integer node indices, got {raw.dtype} {raw.tolist()}")
    parents = raw.long()
    if parents.ndim != 1 or parents.numel() == 0:
        raise ValueError(f"parents must be a non-empty 1-D tensor, got shape {tuple(parents.shape)}")
    idx = torch.arange(parents.numel(), device=parents.device)
    bad = (parents < -1) | (parents >= idx)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"parents[{i}] = {int(parents[i])} must be -1 or an earlier node index in [0, {i})"
        )
    return parents


def tree_ancestors(parents) -> torch.Tensor:
    """bool `[T, T]`: `anc[i, j]` is True when j is i or an ancestor of i."""
    parents = _check_parents(parents)
    t = parents.numel()
    anc = torch.eye(t, dtype=torch.bool, device=parents.device)
    for i, p in enumerate(parents.tolist()):  # parents come first, so anc[p] is final here
        if p >= 0:
            anc[i] |= anc[p]
    return anc


def tree_depths(parents) -> torch.Tensor:
    """long `[T]`: 0 for children of the committed token, +1 per level below."""
    return tree_ancestors(parents).sum(1) - 1


def tree_block_mask(parents, prefix_len: int, block_size=16) -> BlockSparseMask:
    """`BlockSparseMask` `[1, 1, T, prefix_len + T]` for verifying a draft tree in one forward."""
    bq, bk = _pair(block_size)
    prefix_len = _length("prefix_len", prefix_len, minimum=0)
    anc = tree_ancestors(parents)
    t = anc.shape[0]
    kv_len = prefix_len + t
    token = torch.ones(1, 1, t, kv_len, dtype=torch.bool, device=anc.device)
    token[0, 0, :, prefix_len:] = anc
    return BlockSparseMask.from_token_mask(token, (bq, bk))


def main():
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 3, 6])
    prefix = 40
    mask = tree_block_mask(parents, prefix_len=prefix, block_size=16)
    dense = mask.to_dense()[0, 0]  # [T, prefix + T]
    t = len(parents)
    print(f"{t} draft tokens after a {prefix}-token prefix, parents {parents.tolist()}\n"
          f"(-1: a child of the last committed token)")
    print("token mask, a row per draft token: the prefix tokens it attends, then the draft tokens\n"
          "it attends, itself and its ancestors (█ attends, · does not)")
    print(f"{'token':>5} {'parent':>6} {'depth':>5} {'prefix':>7}  draft " + " ".join(
        str(j % 10) for j in range(t)))
    for i, (parent, depth) in enumerate(zip(parents.tolist(), tree_depths(parents).tolist())):
        seen = int(dense[i, :prefix].sum())
        shown = f"all {seen}" if seen == prefix else f"{seen}/{prefix}"
        row = " ".join("█" if x else "·" for x in dense[i, prefix:].tolist())
        print(f"{i:>5} {parent:>6} {depth:>5} {shown:>7}        {row}")
    print(mask)
    print(mask.to_string())

