"""Mask builders, one per file, each with a `main()` that prints it."""

from .causal import causal_block_mask
from .prefix_block import prefix_block_mask
from .tree import tree_ancestors, tree_block_mask, tree_depths

__all__ = ["causal_block_mask", "prefix_block_mask", "tree_ancestors", "tree_block_mask", "tree_depths"]
