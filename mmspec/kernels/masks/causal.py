"""Causal block mask, bottom-right aligned: query i sees key j iff j <= i + (kv_len - q_len).

Bottom-right alignment is flash-attention's convention for Nq != Nk and is what decoding needs: the
Nq new queries sit at the end of the Nk cached-plus-new keys. Blocks strictly below the diagonal
are full, blocks crossing it are partial, blocks above it are skipped (attention-gym's
`create_causal_block_mask_fast`, built from block flags without evaluating every element).
"""

import math

import torch

from ..mask import BlockSparseMask, _length, _pair


def causal_predicate(offset: int):
    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    causal.__name__ = f"causal_offset_{offset}"
    return causal


def causal_block_mask(q_len: int, kv_len: int, block_size=128, device="cpu",
                      offset: int | None = None) -> BlockSparseMask:
    """Causal `BlockSparseMask` of shape `[1, 1, q_len, kv_len]` (broadcasts over batch and heads):
    query i sees keys 0 .. i + offset. `offset` defaults to `kv_len - q_len` (bottom-right
    aligned: the queries are the last tokens); 0 is SDPA's `is_causal` (top-left)."""
    bq, bk = _pair(block_size)
    q_len, kv_len = _length("q_len", q_len), _length("kv_len", kv_len)
    if offset is None:
        offset = kv_len - q_len
    mq, nk = math.ceil(q_len / bq), math.ceil(kv_len / bk)
    q_first = torch.arange(mq, device=device) * bq  # first row of each query block
    q_last = torch.clamp(q_first + bq - 1, max=q_len - 1)
    k_first = torch.arange(nk, device=device) * bk
    k_last = torch.clamp(k_first + bk - 1, max=kv_len - 1)
    full = k_last[None, :] <= q_first[:, None] + offset  # [Mq, Nk]
    any_kept = k_first[None, :] <= q_last[:, None] + offset
    return BlockSparseMask.from_block_flags(
        full[None, None], (any_kept & ~full)[None, None], causal_predicate(offset),
        (bq, bk), q_len, kv_len,
    )


def main():
    mask = causal_block_mask(300, 500, block_size=64)
    print(mask)
    print(mask.to_string())

