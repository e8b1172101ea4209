"""FlashAttention-4 backend: `flash_attn.cute.flash_attn_func` with `block_sparse_tensors`, the
FlexAttention layout of kept blocks (`BlockSparseTensorsTorch`). Registered only where
`flash_attn.cute` imports. (FlashAttention-3, `flash_attn_interface`, has no block-sparse entry.)

Whole blocks only: FA4 applies the element masks of partial blocks through a CuTe-DSL `mask_mod`
compiled into the kernel, not from tensors, so masks with partial-block slots are refused (use
"triton" or "flex"). Its block-sparse tiles are 128x128 on Hopper and Blackwell, so the mask's
blocks must be too, and the lengths whole blocks.

Source: https://github.com/Dao-AILab/flash-attention, `flash_attn/cute/interface.py` and
`flash_attn/cute/block_sparsity.py`.
"""

from __future__ import annotations

import inspect

import torch

from ..mask import BlockSparseMask
from .layouts import attending_rows, padded_full_lists
from .registry import register_backend

try:
    from flash_attn.cute import flash_attn_func
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
except (ImportError, OSError, RuntimeError):  # not installed, or no CUDA runtime to load
    flash_attn_func = None

_BLOCK = 128
# releases before `return_lse=` returned (out, lse) always; later ones only when asked
_LSE_KWARG = ({"return_lse": True} if flash_attn_func is not None
              and "return_lse" in inspect.signature(flash_attn_func).parameters else {})


def _device(q, k, v, mask):
    if q.device.type != "cuda":
        return f"FlashAttention-4 needs CUDA tensors, got {q.device.type}"
    major = torch.cuda.get_device_capability(q.device)[0]
    if major not in (9, 10):
        return f"FlashAttention-4's block sparsity runs on SM90/SM100, got SM{major}x"
    return None


def _dtype(q, k, v, mask):
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"FlashAttention-4 takes float16 or bfloat16, got {q.dtype}"
    if q.shape[-1] not in (64, 96, 128):
        return f"FlashAttention-4's block-sparse path takes head dims 64, 96, 128, got {q.shape[-1]}"
    return None


def _blocks(q, k, v, mask):
    if mask.block_size != (_BLOCK, _BLOCK):
        return f"FlashAttention-4's block-sparse tiles are {_BLOCK}x{_BLOCK}, got {mask.block_size}"
    if mask.q_len % _BLOCK or mask.kv_len % _BLOCK:
        return (f"FlashAttention-4 takes whole {_BLOCK}-token blocks, got q_len {mask.q_len} and "
                f"kv_len {mask.kv_len}")
    if mask.kv_indices.shape[-1]:
        return ("FlashAttention-4 applies partial blocks' element masks only through a CuTe "
                "mask_mod, not from tensors: this mask has partial blocks")
    return None


def fa4_backend(q, k, v, mask: BlockSparseMask, scale: float, softcap: float = 0.0):
    b, hq, nq, _ = q.shape
    counts, indices = padded_full_lists(mask, b, hq)
    fields = dict(mask_block_cnt=torch.zeros_like(counts), mask_block_idx=torch.zeros_like(indices),
                  full_block_cnt=counts, full_block_idx=indices)
    if "block_size" in BlockSparseTensorsTorch._fields:  # older releases assume their tile
        fields["block_size"] = mask.block_size
    # FA's layout: [B, N, H, D]
    out, lse = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                               softmax_scale=scale, softcap=softcap,
                               block_sparse_tensors=BlockSparseTensorsTorch(**fields),
                               **_LSE_KWARG)[:2]
    out = out.transpose(1, 2)
    lse = lse.float()  # [B, H, N]
    empty = ~attending_rows(mask).expand(b, hq, nq)
    return out.masked_fill(empty[..., None], 0), lse.masked_fill(empty, float("-inf"))


if flash_attn_func is not None:
    register_backend("fa4", constraints=(_device, _dtype, _blocks))(fa4_backend)
