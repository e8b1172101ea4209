"""Attention of the EAGLE-style draft heads (EAGLE's `head.py`, ViSpec's `mmspec/vision/head.py`):
tree levels through the shared block-sparse layer where it is not slower, everything else through
dense SDPA.

A tree level is one `step` of `mmspec.decoding.dynamic_tree`: K frontier nodes per row against the
draft cache, the nodes of earlier levels and themselves. Each node sees the row's valid cached
entries, its ancestors and itself; `level_mask` turns that token mask into a `BlockSparseMask` the
way the engine builds its verification mask (`BlockSparseMask.from_token_mask`, key blocks of
`decoding/tree.BLOCK_SIZE`), and `attend` hands it to `mmspec.kernels.block_sparse_attention`
(its `auto` backend, as `ModelDrafter`'s tree levels get through `mmspec.kernels.hf`).

Dense SDPA with the same token mask (identical outputs on a CPU) stays where the block layout
has nothing to skip or costs more than it saves:
- committed entries (the prompt at round 0, the accepted tokens of later rounds): a causal mask
  over the drafter's own sequence plus padding, the case the engine leaves to SDPA for chains
  (`decoding/tree.py`);
- a frontier of one node per row (`top_k=1`, a chain): one query row per row;
- every tree level on a CPU or CUDA device (`SDPA_DEVICES`, below: measured slower on both);
- training (`mmspec.vision.train`, `eagle3_train.py`): it needs gradients, and the shared layer is
  forward-only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mmspec.decoding.tree import BLOCK_SIZE
from mmspec.kernels import BlockSparseMask, block_sparse_attention

# Devices whose tree levels stay on SDPA. On a CPU the torch backend runs masks this small (K
# queries against a few hundred keys) through the fused flash kernel SDPA runs too, after building
# the block mask (from_token_mask skips the index checks, valid by construction) and taking back
# its token form, so the zoo drafter's 30-token tree drafted slower per round through the layer
# (identical trees; BENCHMARKS.md `tree_levels`). On CUDA building a level's mask reads nothing
# back from the device (`pad_partials`), yet on an H200 the layer drafted 1.43x slower per round
# than SDPA (BENCHMARKS.md, after `tree_levels`), so CUDA stays on SDPA too (the
# tests force the shared path with `SDPA_DEVICES = ()`).
SDPA_DEVICES = ("cpu", "cuda")


def level_mask(token_mask: torch.Tensor) -> BlockSparseMask | torch.Tensor:
    """bool `[B, K, C]` (K frontier nodes against C keys) -> the mask a tree level's attention
    takes: a `BlockSparseMask`, or the token mask itself for SDPA (K = 1, or a device in
    `SDPA_DEVICES`)."""
    if token_mask.shape[1] == 1 or token_mask.device.type in SDPA_DEVICES:
        return token_mask
    # valid by construction and sized without reading the device: a slot per key block
    return BlockSparseMask.from_token_mask(token_mask[:, None], BLOCK_SIZE,  # [B, 1, K, C]
                                           pad_partials=True)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           mask: BlockSparseMask | torch.Tensor) -> torch.Tensor:
    """q `[B, H, N, Dh]`, k and v `[B, Hkv, P + N, Dh]` (grouped-query when Hkv < H), mask a
    `BlockSparseMask` (the shared layer) or bool `[B, N, P + N]` (SDPA) -> `[B, H, N, Dh]`."""
    if isinstance(mask, BlockSparseMask):
        return block_sparse_attention(q, k, v, mask)  # repeats grouped heads itself
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
