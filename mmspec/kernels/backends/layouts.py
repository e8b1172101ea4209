"""Our `BlockSparseMask` in the layouts other block-sparse kernels take. Pure tensor work, tested
on the CPU against the mask's dense form (the kernels that consume them need a GPU).

- `bsr`: one (batch, head)'s blocks in SciPy's BSR layout (`scipy.sparse.bsr_matrix`), which
  FlashInfer's `BlockSparseAttentionWrapper.plan` takes: row pointers, column block ids (full and
  partial together, ascending in each row) and each kept block's element mask.
- `padded_full_lists`: the full-block lists at width `Nk`, expanded to every (batch, head), as
  FlashAttention-4's `BlockSparseTensorsTorch` takes them (FlexAttention's layout).
- `attending_rows`: which query rows keep at least one key, to give rows that keep none the
  layer's convention (0 and lse = -inf) whatever a kernel leaves there.
"""

from __future__ import annotations

import torch

from ..mask import BlockSparseMask


def bsr(mask: BlockSparseMask, b: int, h: int):
    """(indptr int32 `[Mq + 1]`, indices int32 `[nnz]`, element masks bool `[nnz, bq, bk]`, or
    None when every kept block is full) for batch `b` and head `h` of the mask (index 0 of a
    broadcast dimension). Element masks of a ragged tail block are True past the lengths."""
    states = mask._block_states()[b, h]  # [Mq, Nk]: -2 skipped, -1 full, >= 0 partial slot
    kept = states >= -1
    indptr = torch.zeros(states.shape[0] + 1, dtype=torch.int32, device=mask.device)
    indptr[1:] = kept.sum(-1).cumsum(0)
    rows, cols = kept.nonzero(as_tuple=True)  # row-major: by row, then ascending block id
    if mask.kv_indices.shape[-1] == 0:  # no partial slots: every kept block is full
        return indptr, cols.to(torch.int32), None
    slot = states[rows, cols]
    partial = mask.partial_masks[b, h, rows, slot.clamp(min=0).long()]  # [nnz, bq, bk]
    elements = torch.where((slot >= 0)[:, None, None], partial, True)
    return indptr, cols.to(torch.int32), elements


def padded_full_lists(mask: BlockSparseMask, batch: int, heads: int):
    """(counts int32 `[B, H, Mq]`, indices int32 `[B, H, Mq, Nk]`) of the full blocks, broadcast
    dimensions expanded and the index lists padded with zeros to the number of key blocks."""
    num, idx = mask.full_kv_num_blocks, mask.full_kv_indices
    nk = mask.num_kv_blocks
    padded = torch.zeros(*idx.shape[:-1], nk, dtype=torch.int32, device=mask.device)
    padded[..., : min(idx.shape[-1], nk)] = idx[..., :nk]
    shape = (batch, heads, num.shape[2])
    return (num.expand(shape).contiguous(), padded.expand(*shape, nk).contiguous())


def attending_rows(mask: BlockSparseMask) -> torch.Tensor:
    """bool `[B|1, H|1, q_len]`: True where a query row keeps at least one key."""
    some_full = mask.full_kv_num_blocks > 0  # [B, H, Mq]
    width = mask.kv_indices.shape[-1]
    live = torch.arange(width, device=mask.device) < mask.kv_num_blocks[..., None]
    # a partial slot keeps a row when any of its in-range keys is kept (masks are 0 past kv_len)
    in_partial = (mask.partial_masks.any(-1) & live[..., None]).any(3)  # [B, H, Mq, bq]
    rows = some_full[..., None] | in_partial
    return rows.flatten(2)[..., : mask.q_len]
