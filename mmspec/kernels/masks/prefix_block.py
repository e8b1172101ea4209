"""Prefix plus bidirectional block: the attention of a diffusion-LM drafter.

The sequence is `[prefix (prefix_len), draft block (block_len)]`. Draft-block queries attend
everything, prefix and the whole block, in both directions (the masked-diffusion denoiser).
Prefix queries attend the prefix only: causally for block-causal DLMs whose prompt KV is reused
(`prefix_causal=True`), or fully for Dream/LLaDA-style bidirectional models.
"""

import math

import torch

from ..mask import BlockSparseMask, _length, _pair


def prefix_block_predicate(prefix_len: int, prefix_causal: bool):
    def prefix_block(b, h, q_idx, kv_idx):
        in_block = q_idx >= prefix_len
        prefix_ok = kv_idx < prefix_len
        if prefix_causal:
            prefix_ok = prefix_ok & (kv_idx <= q_idx)
        return in_block | prefix_ok

    prefix_block.__name__ = f"prefix_{prefix_len}_block{'_causal' if prefix_causal else ''}"
    return prefix_block


def prefix_block_mask(prefix_len: int, block_len: int, block_size=64, prefix_causal: bool = True,
                      device="cpu") -> BlockSparseMask:
    """`BlockSparseMask` `[1, 1, n, n]` with `n = prefix_len + block_len`."""
    bq, bk = _pair(block_size)
    prefix_len = _length("prefix_len", prefix_len, minimum=0)
    block_len = _length("block_len", block_len)
    n = prefix_len + block_len
    mq, nk = math.ceil(n / bq), math.ceil(n / bk)
    q_first = torch.arange(mq, device=device) * bq
    q_last = torch.clamp(q_first + bq - 1, max=n - 1)
    k_first = torch.arange(nk, device=device) * bk
    k_last = torch.clamp(k_first + bk - 1, max=n - 1)
    block_rows = q_first[:, None] >= prefix_len  # every row of the query block is in the draft
    prefix_cols = k_last[None, :] < prefix_len
    if prefix_causal:
        prefix_full = prefix_cols & (k_last[None, :] <= q_first[:, None])
    else:
        prefix_full = prefix_cols & (q_last[:, None] < prefix_len)
    full = block_rows.expand(mq, nk) | prefix_full
    partial = ~full  # let the predicate decide; empty candidates are dropped
    return BlockSparseMask.from_block_flags(
        full[None, None], partial[None, None], prefix_block_predicate(prefix_len, prefix_causal),
        (bq, bk), n, n,
    )


def main():
    for causal in (True, False):
        mask = prefix_block_mask(100, 40, block_size=16, prefix_causal=causal)
        print(f"prefix_causal={causal}:", mask)
        print(mask.to_string())

