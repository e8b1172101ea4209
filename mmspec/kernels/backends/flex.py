"""FlexAttention backend: PyTorch's `flex_attention` over the mask's `to_flex()` layout.

Full blocks run unmasked; partial blocks read this mask's element masks through a `mask_mod`
(a map from (query block, key block) to its state and partial slot, so no `[N, N]` token mask is
built).
On CUDA the call is `torch.compile`d once per process (FlexAttention's Triton kernels); on the
CPU it runs eagerly, as a comparator in tests (the eager path materialises the scores).
"""

from __future__ import annotations

import functools
import warnings

import torch

from ..mask import BlockSparseMask
from .registry import register_backend

try:
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # torch < 2.5
    BlockMask = flex_attention = None

try:
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:  # torch < 2.9: return_lse=True
    AuxRequest = None


@functools.cache
def _compiled():
    return torch.compile(flex_attention, dynamic=False)


# FlexAttention's GPU kernel tiles must fit inside the mask's blocks and the GPU's shared memory;
# its default tile does not for every block size, head dim and dtype (an H100 refused D=64 bf16
# with 128x128 blocks and fp32 with 32x32 ones). The first of these that compiles is kept per
# (device, dtype, head dim, block size).
def _tile_options(bq: int, bk: int) -> list:
    options = [None] if min(bq, bk) >= 128 else []
    for m, stages in ((64, 2), (32, 1), (16, 1)):
        options.append({"BLOCK_M": min(m, bq), "BLOCK_N": min(m, bk), "num_stages": stages})
    return options


_CHOSEN: dict = {}


def _block_states(mask: BlockSparseMask) -> torch.Tensor:
    """int32 `[B, H, Mq, Nk]`: -2 for a skipped (query block, key block), -1 for a full one, the
    partial slot (>= 0) for a partial one."""
    b, h, mq = mask.kv_num_blocks.shape
    nk = mask.num_kv_blocks
    states = torch.full((b, h, mq, nk + 1), -2, dtype=torch.int32, device=mask.device)
    for num, idx, value in ((mask.full_kv_num_blocks, mask.full_kv_indices, None),
                            (mask.kv_num_blocks, mask.kv_indices, "slot")):
        width = idx.shape[-1]
        used = torch.arange(width, device=mask.device) < num[..., None]
        # unused entries write into the spare last column, which is dropped
        col = torch.where(used, idx.long(), nk)
        src = (torch.arange(width, dtype=torch.int32, device=mask.device) if value == "slot"
               else torch.full((width,), -1, dtype=torch.int32, device=mask.device))
        states.scatter_(-1, col, src.expand_as(col).contiguous())
    return states[..., :-1].contiguous()


def flex_block_mask(mask: BlockSparseMask):
    """`mask` as a FlexAttention `BlockMask`. Its `mask_mod` gives the whole mask (full blocks,
    partial element masks, nothing elsewhere): the compiled kernel calls it on partial blocks
    only, while the eager CPU path applies it to every (query, key) pair."""
    nk = mask.num_kv_blocks
    bq, bk = mask.block_size

    def pad(idx):  # FlexAttention reads the number of key blocks from the index width
        out = torch.zeros(*idx.shape[:-1], nk, dtype=torch.int32, device=mask.device)
        width = min(idx.shape[-1], nk)
        out[..., :width] = idx[..., :width]
        return out

    states = _block_states(mask)
    elements = mask.partial_masks
    if elements.shape[3] == 0:  # no partial slot: one all-False slot to index
        elements = elements.new_zeros(*elements.shape[:3], 1, bq, bk)
    bb, hb = states.shape[:2]

    def mask_mod(b, h, q_idx, kv_idx):
        bi = b if bb > 1 else 0
        hi = h if hb > 1 else 0
        qb, kb = q_idx // bq, kv_idx // bk
        state = states[bi, hi, qb, kb]
        partial = elements[bi, hi, qb, state.clamp(min=0), q_idx % bq, kv_idx % bk]
        return (state == -1) | ((state >= 0) & partial)

    return BlockMask.from_kv_blocks(
        mask.kv_num_blocks, pad(mask.kv_indices), mask.full_kv_num_blocks,
        pad(mask.full_kv_indices), BLOCK_SIZE=(bq, bk), mask_mod=mask_mod,
        seq_lengths=(mask.q_len, mask.kv_len))


def _available(q, k, v, mask):
    if flex_attention is None:
        return "needs torch.nn.attention.flex_attention (torch >= 2.5)"
    return None


def _block_sizes(q, k, v, mask):
    if q.device.type == "cuda" and any(s % 16 for s in mask.block_size):
        return (f"FlexAttention's GPU kernel needs block sizes that are multiples of 16, got "
                f"{mask.block_size}")
    return None


def _head_dim(q, k, v, mask):
    d = q.shape[-1]
    if q.device.type == "cuda" and (d < 16 or d & (d - 1)):
        return f"FlexAttention's GPU kernel needs a power-of-two head dim >= 16, got {d}"
    return None


def _call(fn, q, k, v, kwargs):
    if AuxRequest is not None:
        out, aux = fn(q, k, v, return_aux=AuxRequest(lse=True), **kwargs)
        return out, aux.lse
    return fn(q, k, v, return_lse=True, **kwargs)


@register_backend("flex", constraints=(_available, _block_sizes, _head_dim))
def flex_backend(q, k, v, mask: BlockSparseMask, scale: float, softcap: float = 0.0):
    score_mod = None
    if softcap:
        def score_mod(score, b, h, q_idx, kv_idx):
            return softcap * torch.tanh(score / softcap)

    gqa = q.shape[1] != k.shape[1]
    kwargs = dict(score_mod=score_mod, block_mask=flex_block_mask(mask), scale=scale,
                  enable_gqa=gqa)
    if q.device.type != "cuda":
        with warnings.catch_warnings():  # the eager CPU path warns that it is unfused: we know
            warnings.filterwarnings("ignore",
                                    message="flex_attention called without torch.compile")
            out, lse = _call(flex_attention, q, k, v, kwargs)
    else:
        key = (q.device, q.dtype, q.shape[-1], mask.block_size)
        options = _tile_options(*mask.block_size)
        start = _CHOSEN.get(key, 0)
        for i in range(start, len(options)):
            try:
                out, lse = _call(_compiled(), q, k, v, {**kwargs, "kernel_options": options[i]})
                _CHOSEN[key] = i
                break
            except Exception as err:  # inductor/Triton: no config fits this tile
                if i == len(options) - 1 or key in _CHOSEN:
                    raise RuntimeError(
                        f"FlexAttention could not compile for {q.dtype}, head dim "
                        f"{q.shape[-1]}, blocks {mask.block_size} with any of its tile "
                        f"options ({type(err).__name__}); use backend='triton'") from err
    lse = lse.float()
    # rows that attend nothing: 0 and -inf, as every backend (no host sync: no `.any()` test)
    empty = ~torch.isfinite(lse)
    out = out.masked_fill(empty[..., None], 0)
    return out, lse.masked_fill(empty, float("-inf"))
