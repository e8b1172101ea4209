"""Hopper backends: the Triton kernel's lookup-table loop with its tiles moved by TMA.

`"triton-tma"` and `"triton-tma-persistent"` compute what `"triton"` computes (same lookup
tables, same full/partial split, same online softmax: `triton_kernel._online_softmax`), but
Q, K, V and O travel through tensor descriptors (`triton.tools.tensor_descriptor.TensorDescriptor`,
built on the host, one per tensor and call): on sm90+ each tile is one bulk tensor copy
(`cp.async.bulk.tensor`) into shared memory instead of a gather of per-thread loads, and the
copy engine clips and zero-fills the ragged tails (keys past kv_len, head-dim columns past D,
query rows past q_len on the store), so no load carries an element mask. A key block index from
the lookup table is just a coordinate of the next copy.

- `"triton-tma"`: one program per (query tile, batch x head), as `"triton"`.
- `"triton-tma-persistent"`: one program per SM looping over the query tiles, consecutive
  programs on consecutive tiles of one head (K and V shared in L2), as in the persistent
  variant of Triton's Hopper attention tutorial (`python/tutorials/06-fused-attention.py`,
  `_attn_fwd_persist`). Its tiles cost what their masks keep, unevenly, so whether the static
  schedule beats the hardware's is measured, not assumed.

Both are registered for CUDA devices of compute capability 9.0 or later (and under
`TRITON_INTERPRET=1`, which runs descriptor loads as masked gathers, to test them on a CPU);
`auto` takes them only where this machine's timing table (`timings.py`, filled by
`benchmarks/kernels.py --gpu-only`) measured one faster, never in its fixed order. Inputs are
float16/bfloat16 and must meet TMA's layout rules (16-byte aligned base and strides): other calls
are refused and `auto` goes on to `"triton"`. Warp specialisation (`tl.range(...,
warp_specialize=True)` over the key tiles) is a launch-config switch left off by default:
`benchmarks/kernel_configs.py --tma` measures it where the compiler supports it for this loop.
"""

from __future__ import annotations

import torch

from ..mask import BlockSparseMask
from . import triton_kernel
from .registry import register_backend
from .triton_kernel import _INTERPRET, _constraints_device, _constraints_shape, triton

try:  # host-side tensor descriptors came with Triton 3.3
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor

    from .triton_kernel import _online_softmax
except ImportError:
    TensorDescriptor = None

# programs of the persistent grid under the interpreter (no SMs to count): few, so that each
# walks several tiles in tests
INTERPRET_PROGRAMS = 3


def _hopper(q, k, v, mask):
    if q.device.type == "cuda" and torch.cuda.get_device_capability(q.device)[0] < 9:
        major, minor = torch.cuda.get_device_capability(q.device)
        return f"TMA tensor descriptors need compute capability >= 9.0, got {major}.{minor}"
    return None


def _dtype(q, k, v, mask):
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"the TMA kernels take float16 or bfloat16, got {q.dtype} (\"triton\" takes it)"
    return None


def _tma_layout(q, k, v, mask):
    for name, t in (("q", q), ("k", k), ("v", v)):
        b, h, n, d = t.shape  # the strides as passed: a copy where D is not unit-stride
        strides = t.stride() if t.stride(-1) == 1 else (h * n * d, n * d, d, 1)
        if t.data_ptr() % 16 or any(s * t.element_size() % 16 or s == 0 for s in strides[:-1]):
            return (f"TMA needs {name}'s base and B/H/N strides 16-byte aligned and nonzero, got "
                    f"strides {tuple(strides)} of {t.element_size()}-byte elements")
    return None


if TensorDescriptor is not None:

    @triton.jit
    def _query_tile(desc_q, desc_k, desc_v, desc_o, LSE, pid_m, pid_bh,
                    FULL_NUM, FULL_IDX, PART_NUM, PART_IDX, PART_MASK,
                    scale_log2, softcap, q_len, kv_len, H, GROUP, slb, slh,
                    sfnb, sfnh, sfnm, sfib, sfih, sfim, spnb, spnh, spnm, spib, spih, spim,
                    spmb, spmh, spmm, spms,
                    BQ: tl.constexpr, BK: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_K: tl.constexpr,
                    UPCAST: tl.constexpr, PRECISION: tl.constexpr, SOFTCAP: tl.constexpr,
                    WARP_SPECIALIZE: tl.constexpr):
        b = pid_bh // H
        h = pid_bh % H
        hk = h // GROUP
        row0 = pid_m * BLOCK_M
        mblk = row0 // BQ  # mask query block; BLOCK_M divides BQ
        offs_m = row0 + tl.arange(0, BLOCK_M)
        row_in_blk = offs_m - mblk * BQ
        q = desc_q.load([b, h, row0, 0]).reshape(BLOCK_M, BLOCK_D)  # [M, D], zero past q_len
        if UPCAST:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

        n_full = tl.load(FULL_NUM + b * sfnb + h * sfnh + mblk * sfnm)
        for i in tl.range(0, n_full, warp_specialize=WARP_SPECIALIZE):
            kb = tl.load(FULL_IDX + b * sfib + h * sfih + mblk * sfim + i)
            for j in tl.static_range(BK // BLOCK_N):
                start = kb * BK + j * BLOCK_N
                k = desc_k.load([b, hk, start, 0]).reshape(BLOCK_N, BLOCK_D)  # [N, D]
                v = desc_v.load([b, hk, start, 0]).reshape(BLOCK_N, BLOCK_D)  # zero past kv_len
                if UPCAST:
                    k = k.to(tl.float32)
                    v = v.to(tl.float32)
                s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # [M, N]
                keep = (start + tl.arange(0, BLOCK_N) < kv_len)[None, :]  # the ragged last block
                acc, m_i, l_i = _online_softmax(acc, m_i, l_i, s, keep, v, not EVEN_K,
                                                PRECISION, SOFTCAP, softcap)
        n_part = tl.load(PART_NUM + b * spnb + h * spnh + mblk * spnm)
        for i in tl.range(0, n_part, warp_specialize=WARP_SPECIALIZE):
            kb = tl.load(PART_IDX + b * spib + h * spih + mblk * spim + i)
            pm_ptr = PART_MASK + b * spmb + h * spmh + mblk * spmm + i * spms
            for j in tl.static_range(BK // BLOCK_N):
                start = kb * BK + j * BLOCK_N
                k = desc_k.load([b, hk, start, 0]).reshape(BLOCK_N, BLOCK_D)
                v = desc_v.load([b, hk, start, 0]).reshape(BLOCK_N, BLOCK_D)
                if UPCAST:
                    k = k.to(tl.float32)
                    v = v.to(tl.float32)
                s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
                cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
                em = tl.load(pm_ptr + row_in_blk[:, None] * BK + cols[None, :])  # [M, N]
                keep = (em != 0) & (start + tl.arange(0, BLOCK_N) < kv_len)[None, :]
                acc, m_i, l_i = _online_softmax(acc, m_i, l_i, s, keep, v, True,
                                                PRECISION, SOFTCAP, softcap)

        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.log2(l_i)) * 0.6931471805599453)
        # the copy engine drops the rows past q_len and the columns past D
        desc_o.store([b, h, row0, 0], out.to(desc_o.dtype).reshape(1, 1, BLOCK_M, BLOCK_D))
        tl.store(LSE + b * slb + h * slh + offs_m, lse, mask=offs_m < q_len)

    @triton.jit
    def _bsa_fwd_tma(desc_q, desc_k, desc_v, desc_o, LSE,
                     FULL_NUM, FULL_IDX, PART_NUM, PART_IDX, PART_MASK,
                     scale_log2, softcap, q_len, kv_len, H, GROUP, m_tiles, tiles, slb, slh,
                     sfnb, sfnh, sfnm, sfib, sfih, sfim, spnb, spnh, spnm, spib, spih, spim,
                     spmb, spmh, spmm, spms,
                     BQ: tl.constexpr, BK: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_K: tl.constexpr,
                     UPCAST: tl.constexpr, PRECISION: tl.constexpr, SOFTCAP: tl.constexpr,
                     WARP_SPECIALIZE: tl.constexpr, PERSISTENT: tl.constexpr):
        if PERSISTENT:  # tile t = (batch x head) * m_tiles + query tile, strided over programs
            for t in range(tl.program_id(0), tiles, tl.num_programs(0)):
                _query_tile(desc_q, desc_k, desc_v, desc_o, LSE, t % m_tiles, t // m_tiles,
                            FULL_NUM, FULL_IDX, PART_NUM, PART_IDX, PART_MASK,
                            scale_log2, softcap, q_len, kv_len, H, GROUP, slb, slh,
                            sfnb, sfnh, sfnm, sfib, sfih, sfim, spnb, spnh, spnm, spib, spih,
                            spim, spmb, spmh, spmm, spms, BQ, BK, BLOCK_M, BLOCK_N, BLOCK_D,
                            EVEN_K, UPCAST, PRECISION, SOFTCAP, WARP_SPECIALIZE)
        else:
            _query_tile(desc_q, desc_k, desc_v, desc_o, LSE, tl.program_id(0), tl.program_id(1),
                        FULL_NUM, FULL_IDX, PART_NUM, PART_IDX, PART_MASK,
                        scale_log2, softcap, q_len, kv_len, H, GROUP, slb, slh,
                        sfnb, sfnh, sfnm, sfib, sfih, sfim, spnb, spnh, spnm, spib, spih,
                        spim, spmb, spmh, spmm, spms, BQ, BK, BLOCK_M, BLOCK_N, BLOCK_D,
                        EVEN_K, UPCAST, PRECISION, SOFTCAP, WARP_SPECIALIZE)


def launch_configs(bq: int, bk: int, block_d: int) -> list[tuple[int, int, int, int, bool]]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, warp_specialize), fastest first: `"triton"`'s
    list (its H100 sweep), warp specialisation off (see the module docstring)."""
    return [(*config, False) for config in triton_kernel.launch_configs(bq, bk, block_d)]


def descriptors(q, k, v, out, block_m: int, block_n: int, block_d: int):
    """Host-side TMA descriptors over the 4-D [B, H, N, D] tensors, as they are strided: one
    query or output tile is [1, 1, block_m, block_d], one key or value tile [1, 1, block_n,
    block_d]."""
    def desc(t, rows):
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, block_d])

    return desc(q, block_m), desc(k, block_n), desc(v, block_n), desc(out, block_m)


def grid(config, q, persistent: bool) -> tuple[int, ...]:
    """Programs launched: a query tile each, or, persistent, one per SM (INTERPRET_PROGRAMS under
    the interpreter) and never more than there are tiles."""
    block_m = config[0]
    b, hq, nq, _ = q.shape
    m_tiles = triton.cdiv(nq, block_m)
    if not persistent:
        return (m_tiles, b * hq)
    programs = (INTERPRET_PROGRAMS if q.device.type != "cuda"
                else torch.cuda.get_device_properties(q.device).multi_processor_count)
    return (min(programs, m_tiles * b * hq),)


def _attention(q, k, v, mask: BlockSparseMask, scale: float, softcap: float, persistent: bool):
    b, hq, nq, d = q.shape
    bq, bk = mask.block_size
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty_like(q)
    lse = torch.empty(b, hq, nq, device=q.device, dtype=torch.float32)
    tables = triton_kernel.lookup_tables(mask, b, hq)
    block_d = max(16, triton.next_power_of_2(d))
    key = ("triton-tma", q.device, bq, bk, block_d, q.dtype, bool(softcap), persistent)
    triton_kernel.launch_first_fitting(key, launch_configs(bq, bk, block_d), lambda config: _launch(
        config, persistent, q, k, v, out, lse, tables, scale, softcap, (bq, bk, block_d)))
    return out, lse


def _launch(config, persistent, q, k, v, out, lse, tables, scale, softcap, blocks):
    """`blocks`: the mask's (query, key) block sizes and the head size padded to a power of 2."""
    block_m, block_n, num_warps, num_stages, warp_specialize = config
    bq, bk, block_d = blocks
    full_num, full_idx, part_num, part_idx, part_mask = tables
    b, hq, nq, _ = q.shape
    kv_len = k.shape[2]
    _bsa_fwd_tma[grid(config, q, persistent)](
        *descriptors(q, k, v, out, block_m, block_n, block_d), lse,
        full_num, full_idx, part_num, part_idx, part_mask,
        scale * 1.4426950408889634, softcap or 1.0, nq, kv_len, hq, hq // k.shape[1],
        triton.cdiv(nq, block_m), triton.cdiv(nq, block_m) * b * hq, *lse.stride()[:2],
        *full_num.stride(), *full_idx.stride()[:3], *part_num.stride(), *part_idx.stride()[:3],
        *part_mask.stride()[:4],
        BQ=bq, BK=bk, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        EVEN_K=kv_len % bk == 0, UPCAST=_INTERPRET, PRECISION="tf32",
        SOFTCAP=bool(softcap), WARP_SPECIALIZE=warp_specialize, PERSISTENT=persistent,
        num_warps=num_warps, num_stages=num_stages,
    )


def triton_tma_attention(q, k, v, mask: BlockSparseMask, scale: float, softcap: float = 0.0):
    return _attention(q, k, v, mask, scale, softcap, persistent=False)


def triton_tma_persistent_attention(q, k, v, mask: BlockSparseMask, scale: float,
                                    softcap: float = 0.0):
    return _attention(q, k, v, mask, scale, softcap, persistent=True)


if TensorDescriptor is not None:
    _CONSTRAINTS = (_constraints_device, _hopper, _dtype, _constraints_shape, _tma_layout)
    register_backend("triton-tma", constraints=_CONSTRAINTS)(triton_tma_attention)
    register_backend("triton-tma-persistent", constraints=_CONSTRAINTS)(
        triton_tma_persistent_attention)
