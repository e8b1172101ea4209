"""Verification of a draft tree against the target's logits at every node.

Both rules return, per row, the deepest accepted node (0 = the root: nothing accepted) and the
bonus token the target adds after it.

Greedy: node i is accepted when it and all its ancestors equal the target's argmax at their parent;
the deepest accepted node wins (first in node order among equals). The committed tokens are then
exactly the target's argmax continuation, so the output equals `generate(do_sample=False)`.

Sampling (Leviathan et al. 2023 / Chen et al. 2023, extended to trees as in SpecInfer, Miao et al.
2024, Alg. 2): at the current node with target distribution p, try its children in node order; child
x drawn from q is accepted with probability min(1, p(x) / q(x)); on rejection p becomes
norm(max(p - q, 0)) and the next child is tried against it. When no child is accepted, or a leaf is
reached, the bonus token is drawn from the current p. A draft without probabilities is a point mass
q = onehot(x): accept with probability p(x), on rejection remove x from p. Each emitted token is
then an exact sample of the target distribution, whatever the drafter proposes. (This is EAGLE's
recursive rejection when all candidates are point masses, `SafeAILab/EAGLE#221`.)
"""

from __future__ import annotations

import torch

from .sampling import residual
from .tree import Tree


def _deepest(tree: Tree, ok: torch.Tensor) -> torch.Tensor:
    """ok bool `[B, N]` (accepted nodes) -> long `[B]` deepest accepted node, first among equals."""
    score = torch.where(ok, tree.depth, -1)
    return score.argmax(-1)


def verify_greedy(tree: Tree, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits `[B, N, V]` -> (best `[B]`, bonus `[B]`)."""
    pred = logits.argmax(-1)  # [B, N]
    at_parent = pred.gather(1, tree.parents.clamp_min(0))  # [B, N] target's token at each parent
    match = (tree.tokens == at_parent) & tree.valid
    match[:, 0] = True
    ok = ~(tree.anc & ~match[:, None, :]).any(-1)  # every ancestor (and itself) matches
    best = _deepest(tree, ok)
    return best, pred.gather(1, best[:, None])[:, 0]


def _children(tree: Tree) -> torch.Tensor:
    """long `[B, N, R]`: the children of each node in node order, -1 padded, from the host
    shape (no device read). Invalid nodes stay listed: the verifier skips them in order, which
    leaves the order of the valid ones as it is."""
    lists = []
    for row in tree.host_parents:
        kids = [[] for _ in row]
        for i, p in enumerate(row[1:], start=1):
            kids[p].append(i)
        lists.append(kids)
    r = max(1, max(len(k) for kids in lists for k in kids))
    table = [[k + [-1] * (r - len(k)) for k in kids] for kids in lists]
    return torch.tensor(table, dtype=torch.long, device=tree.tokens.device)


def verify_sampling(tree: Tree, probs: torch.Tensor, generator=None):
    """probs `[B, N, V]` target distributions at each node -> (best `[B]`, bonus `[B]`).

    A fixed number of steps (the tree's depth times its widest fan-out, from the host shape): no
    step waits on the device to learn whether a row is still moving."""
    b, _n, v = probs.shape
    rows = torch.arange(b, device=probs.device)
    children = _children(tree)  # [B, N, R]
    cur = torch.zeros(b, dtype=torch.long, device=probs.device)
    p = probs[:, 0].clone()  # [B, V] distribution at the current node
    live = torch.ones(b, dtype=torch.bool, device=probs.device)
    for _ in range(tree.max_depth):
        moved = torch.zeros_like(live)
        for r in range(children.shape[2]):
            child = children[rows, cur, r]  # [B]
            c = child.clamp_min(0)
            active = live & ~moved & (child >= 0) & tree.valid[rows, c]
            x = tree.tokens[rows, c]  # [B]
            if tree.probs is None:
                # a point mass; one_hot would check x's range on the host
                q = torch.zeros_like(p).scatter_(1, x[:, None], 1.0)  # [B, V]
            else:
                q = tree.probs[rows, (c - 1).clamp_min(0)].to(p.dtype)
            ratio = p[rows, x] / q[rows, x].clamp_min(1e-30)
            u = torch.rand(b, device=p.device, generator=generator)
            accept = active & (u < ratio)
            reject = active & ~accept
            p = torch.where(accept[:, None], probs[rows, c], p)
            p = torch.where(reject[:, None], residual(p, q), p)
            cur = torch.where(accept, c, cur)
            moved |= accept
        live &= moved
    bonus = torch.multinomial(p, 1, generator=generator)[:, 0]
    return cur, bonus
