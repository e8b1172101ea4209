"""FlashInfer backend: `flashinfer.BlockSparseAttentionWrapper` (plan, then run) over the mask's
BSR layout (`layouts.bsr`). Registered only where the `flashinfer` package imports.

FlashInfer's block-sparse pattern has no batch and is shared by every head of a call, so a mask
with per-head (or per-batch) blocks takes one plan and run per head (and batch): the plan reads
the layout on the host, a sync per call. Partial blocks pass their element masks (`mask=` of
`plan`, `[nnz, R, C]`); whole blocks only: its kernel pages keys in blocks of C and rounds query
rows to R, so lengths that are not multiples of the block size are refused. Its lse is in base 2
(FlashInfer's kernels fold log2(e) into the scale: flashinfer issue #2113, PR #5257, whose
`lse_base="log2"` default keeps it) and converted here to the natural log every backend returns.

Docs: https://docs.flashinfer.ai/api/sparse.html (`flashinfer/sparse.py`).
"""

from __future__ import annotations

import math

import torch

from ..mask import BlockSparseMask
from .layouts import attending_rows, bsr
from .registry import register_backend

try:
    import flashinfer
except (ImportError, OSError, RuntimeError):  # not installed, or no CUDA runtime to load
    flashinfer = None

_WORKSPACE: dict = {}  # per device: the float workspace of FlashInfer's split-k (128 MB, its docs)


def _workspace(device: torch.device) -> torch.Tensor:
    if device not in _WORKSPACE:
        _WORKSPACE[device] = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    return _WORKSPACE[device]


def _device(q, k, v, mask):
    if q.device.type != "cuda":
        return f"FlashInfer needs CUDA tensors, got {q.device.type}"
    return None


def _dtype(q, k, v, mask):
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"FlashInfer's kernels take float16 or bfloat16, got {q.dtype}"
    return None


def _head_dim(q, k, v, mask):
    if q.shape[-1] not in (64, 128, 256):
        return f"FlashInfer's prefill kernels are built for head dims 64, 128 and 256, got {q.shape[-1]}"
    return None


def _whole_blocks(q, k, v, mask):
    bq, bk = mask.block_size
    if mask.q_len % bq or mask.kv_len % bk:
        return (f"FlashInfer's BSR kernel takes whole blocks: q_len and kv_len must be multiples "
                f"of block_size {mask.block_size}, got {mask.q_len} and {mask.kv_len}")
    return None


def flashinfer_backend(q, k, v, mask: BlockSparseMask, scale: float, softcap: float = 0.0):
    b, hq, nq, d = q.shape
    hkv = k.shape[1]
    mb, mh = mask.kv_num_blocks.shape[:2]
    bq, bk = mask.block_size
    group = hq // hkv
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(b, hq, nq, dtype=torch.float32, device=q.device)
    wrapper = flashinfer.BlockSparseAttentionWrapper(_workspace(q.device))
    for bi in range(b):
        for hi in range(mh):  # one pattern per call: every head, or one head at a time
            heads = slice(None) if mh == 1 else slice(hi, hi + 1)
            kv_heads = slice(None) if mh == 1 else slice(hi // group, hi // group + 1)
            indptr, indices, elements = bsr(mask, bi if mb > 1 else 0, hi)
            n_qo = hq if mh == 1 else 1
            wrapper.plan(indptr, indices, nq, k.shape[2], bq, bk, n_qo, hkv if mh == 1 else 1, d,
                         mask=elements, logits_soft_cap=softcap or None, sm_scale=scale,
                         q_data_type=q.dtype, kv_data_type=k.dtype, o_data_type=q.dtype)
            # FlashInfer's NHD layout: [N, H, D]
            o, l2 = wrapper.run(q[bi, heads].transpose(0, 1).contiguous(),
                                k[bi, kv_heads].transpose(0, 1).contiguous(),
                                v[bi, kv_heads].transpose(0, 1).contiguous(), return_lse=True)
            out[bi, heads] = o.transpose(0, 1)
            lse[bi, heads] = l2.transpose(0, 1).float() * math.log(2.0)
    empty = ~attending_rows(mask).expand(b, hq, nq)  # rows that keep nothing: 0 and -inf
    return out.masked_fill(empty[..., None], 0), lse.masked_fill(empty, float("-inf"))


if flashinfer is not None:
    register_backend("flashinfer", constraints=(_device, _dtype, _head_dim, _whole_blocks))(
        flashinfer_backend)
