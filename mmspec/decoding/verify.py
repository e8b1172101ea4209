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

import functools

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


@functools.lru_cache(maxsize=16)  # a drafter's few shapes; dynamic trees churn
def _sampling_tables(shapes: tuple, device: torch.device):
    """The sequential rule's bookkeeping for the tree shapes `shapes` (each row's full parents,
    N ints; one shape where all rows share it), built on the host and kept per shape (never
    written to). With S = len(shapes): -> long `[S, N * R]` the children of each node in node
    order (0 where it has fewer than R), bool `[S, N, R]` where there is such a child, long
    `[S, N * R]` the uniform each (node, rank) edge draws (the rule tries the children of a node
    at depth d at step d, so edge (node, r) takes the draw of step d, rank r), long `[S, N - 1]`
    each non-root node's edge (parent * R + rank).

    Invalid nodes stay listed: the rule skips them in order, which leaves the order of the
    valid ones as it is."""
    kids = []
    for row in shapes:
        lists = [[] for _ in row]
        for i, p in enumerate(row[1:], start=1):
            lists[p].append(i)
        kids.append(lists)
    r = max(1, max(len(k) for lists in kids for k in lists))
    steps = max(1, max(max(_depths(row)) for row in shapes))
    child, exists, draw, edge = [], [], [], []
    for row, lists in zip(shapes, kids):
        depth = _depths(row)
        child.append([c for k in lists for c in k + [0] * (r - len(k))])
        exists.append([[j < len(k) for j in range(r)] for k in lists])
        draw.append([min(depth[i], steps - 1) * r + j for i in range(len(row)) for j in range(r)])
        edge.append([row[i] * r + lists[row[i]].index(i) for i in range(1, len(row))])
    return (torch.tensor(child, device=device), torch.tensor(exists, device=device),
            torch.tensor(draw, device=device), torch.tensor(edge, device=device))


def _depths(parents) -> list[int]:
    """Full parents (root -1, parents first) -> the depth of each node."""
    depth = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


def verify_sampling(tree: Tree, probs: torch.Tensor, generator=None):
    """probs `[B, N, V]` target distributions at each node -> (best `[B]`, bonus `[B]`).

    The rule of the module docstring, walked one (step, rank) at a time, vectorised: which
    distribution each child is tested against does not depend on the draws (a node's p, less its
    earlier valid siblings by `residual`), so every node's test is computed at once, one rank of
    children at a time, and the walk is the path of first accepted children from the root. The
    draws are those of the walk, in its order: one uniform `[B]` per (step, rank) over the tree's
    depth times its widest fan-out, drawn in one call (from the host shape: no step waits on the
    device), then the bonus token from the p of the node where the walk stops."""
    b, n, v = probs.shape
    if n == 1:
        return (torch.zeros(b, dtype=torch.long, device=probs.device),
                torch.multinomial(probs[:, 0], 1, generator=generator)[:, 0])
    shapes = tuple(tuple(row) for row in tree.host_parents)
    if len(set(shapes)) == 1:
        shapes = shapes[:1]
    child, exists, draw, edge = _sampling_tables(shapes, probs.device)  # [1 or B, N * R], ...
    r_max = exists.shape[2]
    # one launch for every (step, rank): row-major [steps * R, B] is the stream of drawing a
    # uniform [B] per (step, rank) in turn (on the CPU's generator, draw for draw)
    u = torch.rand(tree.max_depth * r_max, b, device=probs.device, generator=generator).T
    u = u.gather(1, draw.expand(b, -1)).view(b, n, r_max)  # [B, N, R] each edge's uniform
    flat = child.expand(b, -1)
    x = tree.tokens.gather(1, flat).view(b, n, r_max)  # [B, N, R] each child's token
    tried = exists & tree.valid.gather(1, flat).view(b, n, r_max)
    p, ratios = probs, []  # p[:, i]: node i's distribution less its children tried so far
    for r in range(r_max):
        xr = x[:, :, r, None]  # [B, N, 1]
        px = p.gather(2, xr)[..., 0]  # [B, N]
        if tree.probs is None:  # a point mass q = onehot(x): q(x) = 1
            q = xr
            ratios.append(px)
        else:
            at = (child.view(-1, n, r_max)[:, :, r] - 1).clamp_min(0).expand(b, -1)  # [B, N]
            q = tree.probs.gather(1, at[..., None].expand(b, n, v)).to(p.dtype)  # [B, N, V]
            ratios.append(px / q.gather(2, xr)[..., 0].clamp_min(1e-30))
        p = torch.where(tried[:, :, r, None], residual(p, q), p)
    accept = tried & (u < torch.stack(ratios, -1))  # [B, N, R]
    first = accept & (accept.cumsum(-1) == 1)  # each node's first accepted child
    taken = first.view(b, n * r_max).gather(1, edge.expand(b, -1))  # [B, N - 1]
    on_path = ~(tree.anc[:, :, 1:] & ~taken[:, None, :]).any(-1)  # [B, N] every ancestor taken
    best = _deepest(tree, on_path)
    stop = p.gather(1, best[:, None, None].expand(b, 1, v))[:, 0]  # [B, V]
    return best, torch.multinomial(stop, 1, generator=generator)[:, 0]
