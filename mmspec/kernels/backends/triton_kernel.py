"""Triton backend: a FlashAttention-2 style forward over a lookup table of kept key blocks.

One program computes BLOCK_M query rows of one (batch, head). It reads its mask row's counts, walks
the *full* blocks without an element mask and then the *partial* blocks with their `[bq, bk]` element
mask, and keeps an online softmax in base 2 (`exp2` with a `log2(e)`-prescaled scale, as in Triton's
`06-fused-attention.py`). It stores O and the natural-log lse. Rows with no kept key get O = 0 and
lse = -inf: the `m == -inf` and `l == 0` cases are guarded, so no NaN appears. With `SOFTCAP` the
logits are soft-capped first, `s -> softcap * tanh(s / softcap)` (Gemma 2).

With `GATHER` (`triton_attention_gathered`) the mask's query row i is token `ROWS[i]` of q and
its key column j token `KROWS[j]` of k and v (the sample's own list when KROWS has one per
sample), all in the model's order: each load goes through that index, and O and lse are stored at
the model's rows. An index outside [0, N) is a slot with no token: its query row is neither
loaded nor stored, its key is left out of the softmax, exactly (frames padded to whole tiles,
masked text keys). DraftAttention reads its tile order this way instead of copying q, k and v
into it and the output back (`mmspec/video_dit/sparse_attention.py`).

Caveats:
- no autotune: it raises on machines without a GPU driver, which breaks `TRITON_INTERPRET=1`;
  tile sizes are fixed from the block size and head dim instead;
- bf16 under the interpreter multiplies raw bit patterns (triton#11584), so the interpreter path
  upcasts to fp32 inside the kernel (`UPCAST`); on a GPU bf16/fp16 feed `tl.dot` natively;
- fp32 inputs use `input_precision="ieee"` so results match the fp32 reference, not TF32.
"""

import os

import torch

from ..mask import BlockSparseMask
from .registry import register_backend

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is Linux-only; the torch backend covers other platforms
    triton = None

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _pow2_at_least_16(n: int) -> bool:
    return n >= 16 and n & (n - 1) == 0


def _constraints_device(q, k, v, mask):
    if triton is None:
        return "triton is not installed"
    if q.device.type != "cuda" and not _INTERPRET:
        return f"needs a CUDA tensor (or TRITON_INTERPRET=1), got {q.device.type}"
    return None


def _constraints_shape(q, k, v, mask):
    bq, bk = mask.block_size
    if not (_pow2_at_least_16(bq) and _pow2_at_least_16(bk)):
        return f"block_size must be powers of two >= 16, got {(bq, bk)}"
    if q.shape[-1] > 256:
        return f"head dim must be <= 256, got {q.shape[-1]}"
    return None


if triton is not None:

    @triton.jit
    def _tanh(x):
        """tanh in fp32 without libdevice (which the interpreter lacks): an odd Taylor polynomial
        near 0, where (1 - e) / (1 + e) would lose digits to cancellation, and that elsewhere."""
        a = tl.abs(x)
        e = tl.exp(-2.0 * a)
        big = (1.0 - e) / (1.0 + e)
        x2 = x * x
        small = a * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333
                                                              - x2 * 0.05396825396825397)))
        return tl.where(x < 0, -1.0, 1.0) * tl.where(a < 0.125, small, big)

    @triton.jit
    def _tile(acc, m_i, l_i, q, K, V, k_base, v_base, stride_kn, stride_vn, start, kv_len,
              offs_d, d_ok, pm_ptr, row_in_blk, col0,
              BLOCK_N: tl.constexpr, BK: tl.constexpr, PARTIAL: tl.constexpr,
              UPCAST: tl.constexpr, PRECISION: tl.constexpr, scale_log2,
              SOFTCAP: tl.constexpr, softcap, KROWS, n_tok, GATHER: tl.constexpr):
        offs_n = start + tl.arange(0, BLOCK_N)
        k_ok = offs_n < kv_len
        src_n = offs_n
        if GATHER:  # the model's token of each key column; outside [0, N): no key there
            src_n = tl.load(KROWS + offs_n, mask=k_ok, other=-1)
            k_ok = k_ok & (src_n >= 0) & (src_n < n_tok)
        kt = tl.load(K + k_base + src_n[None, :] * stride_kn + offs_d[:, None],
                     mask=k_ok[None, :] & d_ok[:, None], other=0.0)  # [D, N]
        vt = tl.load(V + v_base + src_n[:, None] * stride_vn + offs_d[None, :],
                     mask=k_ok[:, None] & d_ok[None, :], other=0.0)  # [N, D]
        if UPCAST:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PRECISION) * scale_log2  # [M, N], base-2 logits
        keep = k_ok[None, :]
        if PARTIAL:
            em = tl.load(pm_ptr + row_in_blk[:, None] * BK + (col0 + tl.arange(0, BLOCK_N))[None, :])
            keep = keep & (em != 0)
        return _online_softmax(acc, m_i, l_i, s, keep, vt, True, PRECISION, SOFTCAP, softcap)

    @triton.jit
    def _online_softmax(acc, m_i, l_i, s, keep, vt, MASKED: tl.constexpr,
                        PRECISION: tl.constexpr, SOFTCAP: tl.constexpr, softcap):
        """One key tile's step of the online softmax: base-2 logits s [M, N] (soft-capped here
        when SOFTCAP), `keep` broadcastable to s (read only when MASKED), values vt [N, D]."""
        if SOFTCAP:  # cap the natural logits s * ln 2, then back to base 2
            s = _tanh(s * (0.6931471805599453 / softcap)) * (softcap * 1.4426950408889634)
        if MASKED:
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=PRECISION)
        return acc, m_new, l_i

    @triton.jit
    def _bsa_fwd(
        Q, K, V, O, LSE, ROWS, KROWS, n_tok, skrb,
        FULL_NUM, FULL_IDX, PART_NUM, PART_IDX, PART_MASK,
        scale_log2, softcap, q_len, kv_len, H, GROUP,
        sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, slb, slh,
        sfnb, sfnh, sfnm, sfib, sfih, sfim, spnb, spnh, spnm, spib, spih, spim,
        spmb, spmh, spmm, spms,
        BQ: tl.constexpr, BK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr,
        PRECISION: tl.constexpr, SOFTCAP: tl.constexpr, GATHER: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        hk = h // GROUP
        row0 = pid_m * BLOCK_M
        mblk = row0 // BQ  # mask query block; BLOCK_M divides BQ
        offs_m = row0 + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM
        q_ok = offs_m < q_len
        src_m = offs_m  # the model's token of each row: q's, O's and lse's row
        if GATHER:  # outside [0, N): a slot with no token, neither loaded nor stored
            src_m = tl.load(ROWS + offs_m, mask=q_ok, other=-1)
            q_ok = q_ok & (src_m >= 0) & (src_m < n_tok)
        q = tl.load(Q + b * sqb + h * sqh + src_m[:, None] * sqn + offs_d[None, :],
                    mask=q_ok[:, None] & d_ok[None, :], other=0.0)  # [M, D]
        if UPCAST:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        k_base = b * skb + hk * skh
        v_base = b * svb + hk * svh
        row_in_blk = offs_m - mblk * BQ
        KROWS += b * skrb  # the sample's key list (stride 0: one list for all)

        n_full = tl.load(FULL_NUM + b * sfnb + h * sfnh + mblk * sfnm)
        for i in range(0, n_full):
            kb = tl.load(FULL_IDX + b * sfib + h * sfih + mblk * sfim + i)
            for j in tl.static_range(BK // BLOCK_N):
                acc, m_i, l_i = _tile(acc, m_i, l_i, q, K, V, k_base, v_base, skn, svn,
                                      kb * BK + j * BLOCK_N, kv_len, offs_d, d_ok, PART_MASK,
                                      row_in_blk, j * BLOCK_N, BLOCK_N, BK, False, UPCAST,
                                      PRECISION, scale_log2, SOFTCAP, softcap, KROWS, n_tok,
                                      GATHER)
        n_part = tl.load(PART_NUM + b * spnb + h * spnh + mblk * spnm)
        for i in range(0, n_part):
            kb = tl.load(PART_IDX + b * spib + h * spih + mblk * spim + i)
            pm_ptr = PART_MASK + b * spmb + h * spmh + mblk * spmm + i * spms
            for j in tl.static_range(BK // BLOCK_N):
                acc, m_i, l_i = _tile(acc, m_i, l_i, q, K, V, k_base, v_base, skn, svn,
                                      kb * BK + j * BLOCK_N, kv_len, offs_d, d_ok, pm_ptr,
                                      row_in_blk, j * BLOCK_N, BLOCK_N, BK, True, UPCAST,
                                      PRECISION, scale_log2, SOFTCAP, softcap, KROWS, n_tok,
                                      GATHER)

        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.log2(l_i)) * 0.6931471805599453)
        tl.store(O + b * sob + h * soh + src_m[:, None] * son + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=q_ok[:, None] & d_ok[None, :])
        tl.store(LSE + b * slb + h * slh + src_m, lse, mask=q_ok)


def launch_configs(bq: int, bk: int, block_d: int) -> list[tuple[int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) to try for a mask block (bq, bk) and head dim
    block_d, fastest first; BLOCK_M divides bq and BLOCK_N divides bk, as the lookup tables need.

    Fixed rather than autotuned (see the module docstring). The first is the fastest of
    `benchmarks/kernel_configs.py` on an H100 (bf16, 128x128 blocks, 32k tokens, BENCHMARKS.md
    "Figures taken out of package comments"); it needs more shared memory than smaller GPUs have,
    where the launch raises OutOfResources and the next, smaller one is used. The last fits any
    case (fp32 at D=128 with 128-token blocks needs 320 KB of shared memory with the second, more
    than an H100's 227 KB).
    """
    bm, bn = min(bq, 128), min(bk, 128 if block_d <= 64 else 64)
    fast = (bm, bn, 8 if bm * max(bn, block_d) >= 128 * 128 else 4, 3 if block_d <= 64 else 2)
    safe = (min(bq, 128 if block_d <= 64 else 64), min(bk, 64), 4, 3)
    small = (min(bq, 32), min(bk, 32), 4, 1)
    return list(dict.fromkeys([fast, safe, small]))


_CHOSEN: dict = {}  # (kernel, device, bq, bk, block_d, dtype, softcap) -> the config that launched
# a launch config the compiler rejects for this GPU (shared memory, registers)
_OUT_OF_RESOURCES = triton.runtime.OutOfResources if triton is not None else RuntimeError


def triton_attention_gathered(q, k, v, mask: BlockSparseMask, scale: float, softcap: float,
                              rows: torch.Tensor, key_rows: torch.Tensor | None = None):
    """`triton_attention` with the mask's query row i on token `rows[i]` of q and its key column
    j on token `key_rows[., j]` of k and v (default `rows`), which are read and written in
    place: out and lse come back in q's own order (module docstring). `rows`: int32/int64 `[M]`
    (M = the mask's q_len = kv_len) holding each of the N tokens once, anything outside
    [0, N) for a slot with no token; `key_rows`: the same `[B|1, M]`, outside [0, N) for a key
    left out."""
    return triton_attention(q, k, v, mask, scale, softcap, (rows, key_rows))


@register_backend("triton", constraints=(_constraints_device, _constraints_shape),
                  gathered=triton_attention_gathered)
def triton_attention(q, k, v, mask: BlockSparseMask, scale: float, softcap: float = 0.0,
                     rows: tuple | None = None):
    """`rows`: (rows, key_rows) of `triton_attention_gathered`, or None for the mask's own
    order."""
    b, hq, nq, d = q.shape
    bq, bk = mask.block_size
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty_like(q)
    lse = torch.empty(b, hq, nq, device=q.device, dtype=torch.float32)
    tables = lookup_tables(mask, b, hq)
    if rows is not None:  # one key list per sample, or the query rows' for all
        key_rows = rows[0][None] if rows[1] is None else rows[1]
        rows = (rows[0], key_rows, key_rows.stride(0) if key_rows.shape[0] > 1 else 0)

    block_d = max(16, triton.next_power_of_2(d))
    key = ("triton", q.device, bq, bk, block_d, q.dtype, bool(softcap),  # softcap: more registers
           rows is not None)
    launch_first_fitting(key, launch_configs(bq, bk, block_d), lambda config: _launch(
        config, q, k, v, out, lse, rows, tables, scale, softcap,
        (bq, bk, block_d, mask.q_len, mask.kv_len)))
    return out, lse


def launch_first_fitting(key, candidates, launch) -> None:
    """`launch(config)` with the config that fitted last time for `key`, or else with each of
    `candidates` in order until one fits this GPU (no OutOfResources), remembered for `key`."""
    if key in _CHOSEN:
        candidates = [_CHOSEN[key]]
    for i, config in enumerate(candidates):
        try:
            launch(config)
        except _OUT_OF_RESOURCES:
            if i == len(candidates) - 1:
                raise
            continue
        _CHOSEN[key] = config
        return


def lookup_tables(mask: BlockSparseMask, b: int, hq: int):
    """The mask's counts, index lists and element masks as the kernels read them: B and H
    broadcast to [b, hq] (stride 0), index lists contiguous, never-empty lists."""
    mq = mask.num_q_blocks
    bq, bk = mask.block_size
    device = mask.device

    def rows(t):  # broadcast B/H to stride 0
        return t.expand(b, hq, *t.shape[2:])

    # the kernel takes the strides of B, H and the query block but steps through an index list
    # (and a [bq, bk] element mask) as contiguous: a mask built from views must be copied
    full_num, full_idx = rows(mask.full_kv_num_blocks), rows(mask.full_kv_indices.contiguous())
    part_num, part_idx = rows(mask.kv_num_blocks), rows(mask.kv_indices.contiguous())
    part_mask = mask.partial_masks.contiguous().view(torch.uint8)
    if part_idx.shape[-1] == 0:  # never read (counts are 0), but the kernel needs real pointers
        part_idx = torch.zeros(b, hq, mq, 1, dtype=torch.int32, device=device)
        part_mask = torch.zeros(1, 1, mq, 1, bq, bk, dtype=torch.uint8, device=device)
    part_mask = rows(part_mask)
    if full_idx.shape[-1] == 0:  # the same for a mask with no full-block slots
        full_idx = torch.zeros(b, hq, mq, 1, dtype=torch.int32, device=device)
    return full_num, full_idx, part_num, part_idx, part_mask


def _launch(config, q, k, v, out, lse, rows, tables, scale, softcap, blocks):
    """One launch of `_bsa_fwd`: `tables` from `lookup_tables`, `blocks` = (bq, bk, block_d,
    the mask's q_len and kv_len)."""
    full_num, full_idx, part_num, part_idx, part_mask = tables
    bq, bk, block_d, nq, nk = blocks  # nq, nk: the kernel's rows (N, or more with empty slots)
    block_m, block_n, num_warps, num_stages = config
    b, hq, _, d = q.shape
    gather = rows is not None
    rows, key_rows, skrb = rows if gather else (lse, lse, 0)  # never read without GATHER
    grid = (triton.cdiv(nq, block_m), b * hq)
    _bsa_fwd[grid](
        q, k, v, out, lse, rows, key_rows, q.shape[2], skrb,
        full_num, full_idx, part_num, part_idx, part_mask,
        scale * 1.4426950408889634, softcap or 1.0, nq, nk, hq, hq // k.shape[1],
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], *lse.stride()[:2],
        *full_num.stride(), *full_idx.stride()[:3], *part_num.stride(), *part_idx.stride()[:3],
        *part_mask.stride()[:4],
        BQ=bq, BK=bk, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, HEAD_DIM=d,
        UPCAST=_INTERPRET or q.dtype == torch.float32,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", SOFTCAP=bool(softcap),
        GATHER=gather, num_warps=num_warps, num_stages=num_stages,
    )
