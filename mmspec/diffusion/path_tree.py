"""CPS beams as one draft tree (beyond the paper): shared prefixes become shared nodes, so the
engine's tree verification checks all B beams in one target pass."""

from __future__ import annotations


def paths_to_tree(paths: list[list[int]]):
    """Merge token paths into a prefix tree.

    Returns (tokens, parents, depths), three lists over nodes in insertion order, so every parent
    comes before its children and any prefix of the node list is itself a tree. `parents[i]` is -1
    for children of the last committed token; `depths[i]` is the node's position in its path.
    """
    tokens, parents, depths = [], [], []
    node_of = {}  # (parent node, token) -> node
    for path in paths:
        parent = -1
        for depth, token in enumerate(path):
            key = (parent, token)
            if key not in node_of:
                node_of[key] = len(tokens)
                tokens.append(token)
                parents.append(parent)
                depths.append(depth)
            parent = node_of[key]
    return tokens, parents, depths
