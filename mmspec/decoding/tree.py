"""The verification tree: a row's root (its last committed token) plus the draft's nodes.

Node 0 is the root; draft node i becomes node i + 1, so a draft parent -1 becomes 0. Ancestor sets
follow `mmspec.kernels.tree_ancestors`, the rule the attention mask uses (worked out on the host
from the parents, so a round reads no tree shape back from the device), and the mask for
the verification forward is built with `BlockSparseMask.from_token_mask` of the shared layer: each
node attends the row's valid cache slots, itself and its ancestors.

A chain needs no tree mask: its mask is causal plus the rows' padding and holes, which the model's
own attention builds from a 2-D attention mask. The engine verifies chains that way (SDPA), because
on CPU the shared layer's torch backend takes longer than SDPA for a few queries against a long
cache (BENCHMARKS.md, "Figures taken out of package comments").
On a model with sliding-window layers chains go through the shared layer too: transformers counts
the window in cache slots, which the holes of a batch's rejected tokens would shift (`windows.py`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .draft import Draft
from .windows import block_masks

# key block of the verification mask; 16 runs on the torch (CPU) and triton backends
BLOCK_SIZE = 16


@dataclass
class Tree:
    """tokens, parents, depth, valid: `[B, N]` (N = 1 + T); anc: bool `[B, N, N]`; probs `[B, T, V]`.

    The shape also lives on the host, as Python lists (the engine reads it without touching the
    device): `host_parents[b]` and `host_depth[b]`, N ints per row (rows sharing a shape share
    the list). `checks`: long `[2]` or `[4]` on the device, the draft's deferred value checks
    (`_check_draft`, `build_tree(defer_checks=True)`), else None.

    parents, anc, depth (and valid, for a draft without `num_tokens`) are shared by every tree of
    the same shape (`_shape_tensors`): read them, never write to them.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    anc: torch.Tensor
    depth: torch.Tensor
    valid: torch.Tensor
    probs: torch.Tensor | None
    host_parents: list = None
    host_depth: list = None
    checks: torch.Tensor | None = None

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @property
    def max_depth(self) -> int:
        return max(max(row) for row in self.host_depth)

    @property
    def is_chain(self) -> bool:
        """Every node's parent is the node before it: the tree mask is plain causal."""
        return all(row[1:] == list(range(len(row) - 1)) for row in self.host_parents)


def _host_shape(parents: list[int]):
    """Draft parents (T ints) -> (full parents, ancestors `[1+T][1+T]` bools, depths) with the
    root prepended, on the host; the rule of `mmspec.kernels.tree_ancestors`."""
    full = [-1] + [0 if p < 0 else p + 1 for p in parents]
    n = len(full)
    anc, depth = [], []
    for i, p in enumerate(full):  # parents come first, so anc[p] is final here
        row = list(anc[p]) if p >= 0 else [False] * n
        row[i] = True
        anc.append(row)
        depth.append(0 if p < 0 else depth[p] + 1)
    return full, anc, depth


@functools.lru_cache(maxsize=16)  # a drafter's few shapes; dynamic trees churn
def _shape_tensors(shapes: tuple, device: torch.device):
    """The device side of the tree shapes `shapes` (each row's draft parents, or one shape that
    every row shares), made once per shape: a round of a drafter whose shape repeats copies
    nothing to the device. -> full parents, ancestors, depths and all-valid `[S, ...]` (S =
    len(shapes)), never written to, and the host lists (full parents, depths) of each shape."""
    full, anc, depth = zip(*(_host_shape(list(shape)) for shape in shapes))
    return (torch.tensor(full, device=device), torch.tensor(anc, dtype=torch.bool, device=device),
            torch.tensor(depth, device=device),
            torch.ones(len(shapes), len(full[0]), dtype=torch.bool, device=device), full, depth)


def _check_draft(draft: Draft, parents: list, batch: int, vocab: int):
    """Shape checks, and the parents' values on the host (`parents`: a nested list). Returns
    the value checks of the tokens and `num_tokens`, long on the device: the smallest and the
    largest token, then those of `num_tokens` where it is given (`[2]` or `[4]`)."""
    tokens = draft.tokens
    if tokens.ndim != 2 or tokens.shape[0] != batch or tokens.dtype != torch.long:
        raise ValueError(f"Draft.tokens must be long [B={batch}, T], got {tokens.dtype} "
                         f"{tuple(tokens.shape)}")
    t = tokens.shape[1]
    if tuple(draft.parents.shape) not in ((t,), (batch, t)):
        raise ValueError(f"Draft.parents must be [T={t}] or [B={batch}, T={t}], got "
                         f"{tuple(draft.parents.shape)}")
    n = draft.num_tokens
    if n is not None and (not isinstance(n, torch.Tensor) or n.shape != (batch,)
                          or n.dtype != torch.long):
        raise ValueError(f"Draft.num_tokens must be None or long [B={batch}], got "
                         f"{n.dtype if isinstance(n, torch.Tensor) else type(n).__name__} "
                         f"{tuple(n.shape) if isinstance(n, torch.Tensor) else n!r}")
    if draft.probs is not None and draft.probs.shape != (batch, t, vocab):
        raise ValueError(f"Draft.probs must be [B={batch}, T={t}, V={vocab}], got "
                         f"{tuple(draft.probs.shape)}")
    rows = parents if draft.parents.ndim == 2 else [parents]
    if any(not -1 <= p < i for row in rows for i, p in enumerate(row)):
        raise ValueError(f"Draft.parents[..., i] must be -1 or an earlier node in [0, i), got "
                         f"{parents}")
    checks = [*torch.aminmax(tokens)] if t else [tokens.new_zeros(())] * 2
    if n is not None:
        checks += torch.aminmax(n.to(tokens.device))
    return torch.stack(checks)


def raise_draft_errors(checks: list[int], draft: Draft, vocab: int) -> None:
    """The ValueError of a failed deferred check (`checks`: `Tree.checks` read to the host)."""
    t = draft.tokens.shape[1]
    low, high = checks[:2]
    if t and (low < 0 or high >= vocab):
        raise ValueError(f"Draft.tokens must lie in [0, {vocab}) (the target's vocabulary), got "
                         f"range [{low}, {high}]")
    if len(checks) > 2 and (checks[2] < 0 or checks[3] > t):
        raise ValueError(f"Draft.num_tokens must lie in [0, T={draft.tokens.shape[1]}], got "
                         f"{draft.num_tokens.tolist()}")


def build_tree(roots: torch.Tensor, draft: Draft, vocab: int, defer_checks: bool = False) -> Tree:
    """roots: long `[B]` last committed tokens. Returns the `Tree` of `1 + T` nodes per row.

    The tree's shape is worked out on the host from `draft.parents`, read once (free when the
    drafter builds them on the CPU, as `Draft.chain` does; a device read otherwise).
    `defer_checks`: the token and `num_tokens` value checks stay on the device in `Tree.checks`
    (out-of-range tokens clamped) for the caller to read with its own (`raise_draft_errors`);
    else they raise here.
    """
    b = roots.shape[0]
    parents = draft.parents.tolist()
    checks = _check_draft(draft, parents, b, vocab)
    if not defer_checks:
        raise_draft_errors(checks.tolist(), draft, vocab)
    t = draft.tokens.shape[1]
    shapes = tuple(map(tuple, parents if draft.parents.ndim == 2 else [parents]))
    if len(set(shapes)) == 1:  # rows often share a tree shape: one ancestor matrix for all
        shapes = shapes[:1]
    device = roots.device
    full, anc, depth, valid, host_full, host_depth = _shape_tensors(shapes, device)
    if draft.num_tokens is not None:
        valid = torch.cat([valid[:, :1].expand(b, 1), torch.arange(t, device=device)
                           < draft.num_tokens.to(device)[:, None]], 1)  # [B, 1 + T]
    tokens = draft.tokens.to(device)
    if defer_checks and t:
        tokens = tokens.clamp(0, vocab - 1)  # never index the embedding out of range
    return Tree(
        tokens=torch.cat([roots[:, None], tokens], dim=1),
        parents=full.expand(b, -1),
        anc=anc.expand(b, -1, -1),
        depth=depth.expand(b, -1),
        valid=valid.expand(b, -1),
        probs=None if draft.probs is None else draft.probs.to(device),
        host_parents=list(host_full) if len(shapes) > 1 else [host_full[0]] * b,
        host_depth=list(host_depth) if len(shapes) > 1 else [host_depth[0]] * b,
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
    return block_masks(token, BLOCK_SIZE, windows, lambda: node_positions(tree, cache_valid),
                       pad_partials=pads_partials(token.device))


def pads_partials(device: torch.device) -> bool:
    """Whether a tree's verification mask gives every query block a slot per key block. Sizing
    the partial lists to the most a query block holds reads the device once (a host sync a
    round on a GPU); a tree has one or two query blocks, so the padded lists cost
    `N * (C + N)` bools, and the Triton kernel walks only each block's own count. The CPU's
    torch backend would walk every slot, and a CPU read costs no wait: unpadded there."""
    return device.type != "cpu"


def node_positions(tree: Tree, cache_valid: torch.Tensor):
    """The positions a window counts in (`windows.py`): long `[B, N]` of the nodes (the row's
    valid cached slots, then the node's depth) and `[B, C + N]` of the cached slots (each the
    count of valid slots before it) and the nodes."""
    cached = cache_valid.long()
    q_pos = cached.sum(-1, keepdim=True) + tree.depth  # [B, N]
    return q_pos, torch.cat([cached.cumsum(-1) - 1, q_pos], dim=-1)  # [B, C + N]


def main_path(draft: Draft) -> tuple[Draft, torch.Tensor] | None:
    """For targets on which no tree verification is exact (recurrent state, ALiBi or windows
    counted in cache slots, layers that take no tree mask): the draft cut to one chain per row,
    from the root through each node's first child (drafters list their best child first), which
    verifies exactly as any chain does. Returns (the chain, long `[B, P]`: each chain node's index
    among the draft's nodes), or None where the draft is a chain already. Its parents are read on
    the host, as `build_tree` reads them."""
    parents = draft.parents.tolist()
    rows = parents if draft.parents.ndim == 2 else [parents]
    if all(row == list(range(-1, len(row) - 1)) for row in rows):
        return None
    paths = []
    for row in rows:
        path, at = [], -1
        for i, p in enumerate(row):  # parents come first: the first node under `at` is its first child
            if p == at:
                path.append(i)
                at = i
        paths.append(path)
    b, width = draft.tokens.shape[0], max(len(p) for p in paths)
    device = draft.tokens.device
    index = torch.tensor([p + p[-1:] * (width - len(p)) for p in paths], device=device)
    index = index.expand(b, width)  # [B, P] (one row: a shape for all rows)
    lengths = torch.tensor([len(p) for p in paths], device=device).expand(b)
    num = lengths
    if draft.num_tokens is not None:  # a path node past the row's own nodes is not in its draft
        inside = index < draft.num_tokens.to(device)[:, None]
        num = torch.minimum(lengths, inside.long().cumprod(1).sum(1))
    probs = None if draft.probs is None else draft.probs.gather(
        1, index.to(draft.probs.device)[..., None].expand(-1, -1, draft.probs.shape[-1]))
    chain = Draft.chain(draft.tokens.gather(1, index), probs,
                        None if draft.num_tokens is None and len(set(map(len, paths))) == 1
                        else num)
    return chain, index
