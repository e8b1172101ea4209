"""FlexAttention backend: PyTorch's `flex_attention` over the mask's `to_flex()` layout.

Full blocks run unmasked; partial blocks read the mask's element masks through `to_flex()`'s
`mask_mod` (no `[N, N]` token mask is built).
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
    from torch.nn.attention.flex_attention import flex_attention
except ImportError:  # torch < 2.5
    flex_attention = None

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
    kwargs = dict(score_mod=score_mod, block_mask=mask.to_flex(), scale=scale,
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
