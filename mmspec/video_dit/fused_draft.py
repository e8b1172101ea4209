"""The draft side of DraftAttention in Triton: pooling, draft map, selection and the kernel's
block index, with no host sync (issue 32 item 4).

On a GPU the torch draft path (`draft_map.py` and `BlockSparseMask.from_dense`) is some twenty
small launches (pool, matmul, softmax, masked fills, top-k, scatter, argsort), each far shorter
than its launch, which cost 6.8% of a dense call at 32k tokens on an H100 (14% with the reorder).
Here:

1. `_pool_kernel`, one launch: the mean of each query tile and each key tile, fp32
   (`pool_query_tiles`, `pool_tiles`);
2. `_draft_row_kernel`, one launch, a program per 16 query tiles of a (sample, head), which read
   the pooled keys once: each row of the draft map `softmax(q_hat k_hat^T * scale)` over the
   allowed key tiles, then
   - `top_p`: the row's selection itself (own tiles first, then by probability, until `mass`,
     at most the cap) and its index list: nothing else runs;
   - `global` / `row`: each entry's priority (`select_blocks`'s), packed with its position into
     an int64 key that is unique within a head;
3. `global` / `row` only: the per-head `budget`-th largest key (`torch.topk`, static shapes), and
   `_index_kernel`, one launch: a row's kept blocks are its keys at or above it, written as the
   kept flags, their count and the ordered index list `BlockSparseMask.from_dense` builds (kept
   blocks first, ascending, then the rest), padded to the fixed width nT.

Identical to the torch path (`select_blocks` + `from_dense`) wherever no two priorities tie, or
come within a few last bits of each other, at the budget's edge, which random inputs do not
(tested, `tests/video_dit/test_fused_draft.py`). Deliberate differences: ties are broken by
position (the lower flat index wins), where `torch.topk` and `argsort` leave the order
unspecified; the pooled sums, the draft map and the row's running mass are fp32 as there, summed
in another order (last-bit differences).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from .draft_map import block_budget, check_mass, check_mass_needed, check_mode, check_sparsity
from .tiles import TileLayout

try:
    import triton
    import triton.language as tl
except ImportError:  # Linux-only; the torch path covers the rest
    triton = None

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# a program holds 16 draft rows as int64 sort keys, [16, nT padded to a power of 2]: 128 KB of
# registers and shared memory at 1,024 tiles (HunyuanVideo at 720p, 129 frames: 990); larger
# maps take the torch path
_MAX_TILES = 1024
_FLAT_BITS = 22  # the position inside a head's map, in the low bits of its key: nQ * nT < 4M


def unsupported(device: torch.device, layout: TileLayout) -> str | None:
    """Why the fused draft cannot run here (None: it can)."""
    if triton is None:
        return "triton is not installed"
    if device.type != "cuda" and not _INTERPRET:
        return f"needs a CUDA device (or TRITON_INTERPRET=1), got {device.type}"
    if layout.num_tiles > _MAX_TILES or layout.num_query_tiles * layout.num_tiles >= 1 << _FLAT_BITS:
        return (f"draft maps of at most {_MAX_TILES} tiles a row and {1 << _FLAT_BITS} blocks, "
                f"got {layout.num_query_tiles} x {layout.num_tiles}")
    return None


@dataclass(frozen=True)
class DraftBlocks:
    """The fused draft's result for a `[B, H, nQ, nT]` draft map.

    kept:     bool  `[B, H, nQ, nT]` the selected blocks (`select_blocks`'s result)
    counts:   int32 `[B, H, nQ]`     kept blocks per row
    indices:  int32 `[B, H, nQ, nT]` kept key tiles first, ascending, then the others
              (`BlockSparseMask.from_dense`'s full_kv_num_blocks and full_kv_indices)
    probs:    fp32  `[B, H, nQ, nT]` the draft map, when asked for (else None)
    """

    kept: torch.Tensor
    counts: torch.Tensor
    indices: torch.Tensor
    probs: torch.Tensor | None


if triton is not None:

    @triton.jit
    def _pool_one(X, OUT, COUNTS, ROWS, NTOK, tile, b, h, sxb, sxh, sxn, sob, soh, son, D,
                  TOKENS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                  GATHER: tl.constexpr):
        for d0 in range(0, D, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            d_ok = offs_d < D
            acc = tl.zeros([BLOCK_D], tl.float32)
            base = X + b * sxb + h * sxh
            for t0 in range(0, TOKENS, BLOCK_T):
                offs_t = t0 + tl.arange(0, BLOCK_T)
                t_ok = offs_t < TOKENS
                slot = tile * TOKENS + offs_t  # tile order
                if GATHER:  # x in the model's order: the slot's token (NTOK: padding)
                    slot = tl.load(ROWS + slot, mask=t_ok, other=0)
                    t_ok = t_ok & (slot < NTOK)
                x = tl.load(base + slot[:, None] * sxn + offs_d[None, :],
                            mask=t_ok[:, None] & d_ok[None, :], other=0.0)
                acc += tl.sum(x.to(tl.float32), 0)
            # padding slots are zeros, so only real tokens count; a tile of padding pools to 0
            count = tl.maximum(tl.load(COUNTS + tile), 1.0)
            tl.store(OUT + b * sob + h * soh + tile * son + offs_d, acc / count, mask=d_ok)

    @triton.jit
    def _pool_kernel(Q, K, QH, KH, QCOUNTS, KCOUNTS, ROWS, NTOK, H, NQ, NT, D,
                     sqb, sqh, sqn, skb, skh, skn, sob, soh, son, spb, sph, spn,
                     QTOKENS: tl.constexpr, KTOKENS: tl.constexpr, BLOCK_T: tl.constexpr,
                     BLOCK_D: tl.constexpr, GATHER: tl.constexpr):
        tile = tl.program_id(0)
        bh = tl.program_id(1)
        b, h = bh // H, bh % H
        if tl.program_id(2) == 0:
            if tile < NQ:
                _pool_one(Q, QH, QCOUNTS, ROWS, NTOK, tile, b, h, sqb, sqh, sqn, sob, soh, son, D,
                          QTOKENS, BLOCK_T, BLOCK_D, GATHER)
        else:
            if tile < NT:
                _pool_one(K, KH, KCOUNTS, ROWS, NTOK, tile, b, h, skb, skh, skn, spb, sph, spn, D,
                          KTOKENS, BLOCK_T, BLOCK_D, GATHER)

    @triton.jit
    def _head_key(prio, flat):
        """int64 keys ordered as the fp32 `prio` (the sign-flipped bit pattern), ties by the
        lower flat position `flat`: unique within a head, so its budget-th largest keeps exactly
        the budget."""
        bits = prio.to(tl.int32, bitcast=True)
        mono = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # monotone in prio
        return ((mono.to(tl.int64) + 2147483648) * 4194304
                + (4194303 - flat.to(tl.int64)))  # 2**22: _FLAT_BITS

    @triton.jit
    def _write_lists(kept, cols, ok2, KEPT_ROWS, COUNTS_ROWS, IDX_ROWS, row_ok, NT):
        """The kept flags of `[BLOCK_Q, NT_P2]` rows (column order), their counts and
        `from_dense`'s index lists: kept columns first, ascending, then the others, ascending.
        `*_ROWS`: pointers to each row's start, `[BLOCK_Q]`."""
        k = kept.to(tl.int32)
        n = tl.sum(k, 1)  # [BLOCK_Q]
        before = tl.cumsum(k, 1) - k  # kept columns left of each column
        pos = tl.where(kept, before, n[:, None] + cols[None, :] - before)
        tl.store(IDX_ROWS[:, None] + pos, tl.broadcast_to(cols[None, :], pos.shape), mask=ok2)
        tl.store(KEPT_ROWS[:, None] + cols[None, :], k.to(tl.uint8), mask=ok2)
        tl.store(COUNTS_ROWS, n, mask=row_ok)

    @triton.jit
    def _draft_row_kernel(QH, KH, ALLOWED, KCOUNTS, PROBS, KEYS, KEPT, COUNTS, IDX,
                          scale, mass, cap, NQ, NT, D, R, sab, sat,
                          MODE: tl.constexpr, HAS_ALLOWED: tl.constexpr, ASYM: tl.constexpr,
                          WRITE_PROBS: tl.constexpr, BLOCK_Q: tl.constexpr, NT_P2: tl.constexpr,
                          BLOCK_D: tl.constexpr):
        """BLOCK_Q rows of one head's draft map: the pooled keys are read once for all of
        them, each row's logits, softmax and selection are its own."""
        rows = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)  # query tiles
        bh = tl.program_id(1)
        cols = tl.arange(0, NT_P2)
        row_ok = rows < NQ
        col_ok = cols < NT
        ok2 = row_ok[:, None] & col_ok[None, :]  # [BLOCK_Q, NT_P2]
        logits = tl.zeros([BLOCK_Q, NT_P2], tl.float32)
        for d0 in range(0, D, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            d_ok = offs_d < D
            qv = tl.load(QH + (bh * NQ + rows[:, None]) * D + offs_d[None, :],
                         mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_Q, BLOCK_D]
            kv = tl.load(KH + (bh * NT + cols[None, :]) * D + offs_d[:, None],
                         mask=col_ok[None, :] & d_ok[:, None], other=0.0)  # [BLOCK_D, NT_P2]
            logits += tl.dot(qv, kv, input_precision="ieee")
        ok = ok2
        if HAS_ALLOWED:
            ok = ok & (tl.load(ALLOWED + rows[:, None] * sab + cols[None, :] * sat, mask=ok2,
                               other=0) != 0)
        logits = tl.where(ok, logits * scale, float("-inf"))
        top = tl.max(logits, 1)
        top = tl.where(top == float("-inf"), 0.0, top)  # padding rows: no -inf - -inf
        e = tl.where(ok, tl.exp(logits - top[:, None]), 0.0)
        # a real row's sum is >= 1 (its largest entry is exp(0)); padding rows' 0 stays 0
        p = e / tl.maximum(tl.sum(e, 1), 1.0)[:, None]  # 0 outside the allowed columns
        row_start = (bh * NQ + rows) * NT  # each row's offset in [B, H, nQ, nT]
        if WRITE_PROBS:
            tl.store(PROBS + row_start[:, None] + cols[None, :], p, mask=ok2)
        # the tiles inside each query tile (the diagonal when R = 1)
        own = (cols[None, :] // R) == rows[:, None]
        if ASYM:  # tiles of padding only are nobody's own
            own = own & (tl.load(KCOUNTS + cols, mask=col_ok, other=0.0) > 0)[None, :]
        flat = rows[:, None] * NT + cols[None, :]
        if MODE == 0:  # global: the probability, own blocks first
            prio = tl.where(ok, tl.where(own, 2.0, p), float("-inf"))
            tl.store(KEYS + row_start[:, None] + cols[None, :], _head_key(prio, flat), mask=ok2)
        else:
            # each row in select_blocks' order: own tiles, then by probability; a sort key that
            # carries (own, allowed, probability bits, column), so the sort moves all of them
            bits = p.to(tl.int32, bitcast=True).to(tl.int64)  # p >= 0: bits are monotone
            skey = (own.to(tl.int64) * 1125899906842624 + ok.to(tl.int64) * 562949953421312
                    + bits * 65536 + (65535 - cols[None, :]))  # own * 2**50 + ok * 2**49
            skey = tl.sort(tl.where(ok2, skey, -1), 1, descending=True)
            s_live = (skey >= 0) & row_ok[:, None]
            s_col = 65535 - (skey & 65535).to(tl.int32)
            s_p = ((skey >> 16) & 0x7FFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
            s_p = tl.where(s_live, s_p, 0.0)
            s_own = ((skey >> 50) & 1) == 1
            s_ok = ((skey >> 49) & 1) == 1
            before = tl.cumsum(s_p, 1) - s_p  # draft mass ahead of each entry in its row
            s_at = row_start[:, None] + s_col
            if MODE == 1:  # row: priority -(mass before), own blocks 1
                prio = tl.where(s_ok, tl.where(s_own, 1.0, -before), float("-inf"))
                tl.store(KEYS + s_at, _head_key(prio, rows[:, None] * NT + s_col), mask=s_live)
            else:  # top_p: the fewest entries reaching `mass`, at most the cap, own ones always
                row_cap = tl.maximum(tl.sum(own.to(tl.int32), 1), cap)[:, None]
                keep = (((before < mass) & (cols[None, :] < row_cap)) | s_own) & s_ok & s_live
                tl.store(KEPT + s_at, keep.to(tl.uint8), mask=s_live)
                tl.debug_barrier()  # the flags, written in sorted order, read back in order
                kept = tl.load(KEPT + row_start[:, None] + cols[None, :], mask=ok2, other=0) != 0
                _write_lists(kept, cols, ok2, KEPT + row_start, COUNTS + bh * NQ + rows,
                             IDX + row_start, row_ok, NT)

    @triton.jit
    def _index_kernel(KEYS, THRESH, KEPT, COUNTS, IDX, NQ, NT, BLOCK_Q: tl.constexpr,
                      NT_P2: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
        bh = tl.program_id(1)
        cols = tl.arange(0, NT_P2)
        row_ok = rows < NQ
        ok2 = row_ok[:, None] & (cols < NT)[None, :]
        row_start = (bh * NQ + rows) * NT
        key = tl.load(KEYS + row_start[:, None] + cols[None, :], mask=ok2, other=0)
        kept = (key >= tl.load(THRESH + bh)) & ok2
        _write_lists(kept, cols, ok2, KEPT + row_start, COUNTS + bh * NQ + rows,
                     IDX + row_start, row_ok, NT)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """`[B, H, Np, D]` with unit stride along D (the kernels step through D as contiguous)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def draft_blocks(q_tiled: torch.Tensor, k_tiled: torch.Tensor, layout: TileLayout,
                 sparsity: float, mode: str = "global", scale: float | None = None,
                 allowed: torch.Tensor | None = None, allowed_count: int | None = None,
                 mass: float | None = None, max_density: float = 1.0,
                 return_probs: bool = False, untiled: bool = False) -> DraftBlocks:
    """`pool_query_tiles` + `pool_tiles` + `draft_probs` + `select_blocks` +
    `BlockSparseMask.from_dense`'s index, fused (module docstring), with no host sync.

    q_tiled, k_tiled: `[B, H, Np, D]` in tile order, zeros in the padding slots (`to_tiles`);
    with `untiled`, `[B, H, N, D]` in the model's order instead, read through `layout.perm`
    (whose padding slots read nothing), with no copy into tile order.
    allowed: bool `[nQ, nT]` (may be a broadcast view) with its host-side count
    `allowed_count`, as `select_blocks` takes them; the other arguments as there.
    """
    sparsity, mode = check_sparsity(sparsity), check_mode(mode)
    why = unsupported(q_tiled.device, layout)
    if why is not None:
        raise ValueError(f"the fused draft cannot run: {why}")
    b, h, npad, d = q_tiled.shape
    nq, nt = layout.num_query_tiles, layout.num_tiles
    tokens = layout.num_tokens if untiled else layout.padded_tokens
    if k_tiled.shape != q_tiled.shape or npad != tokens:
        raise ValueError(f"q_tiled and k_tiled must be [B, H, {tokens}, D] in "
                         f"{'the model' if untiled else 'tile'} order, got "
                         f"{list(q_tiled.shape)} and {list(k_tiled.shape)}")
    check_mass_needed(mode, mass)
    if mode == "top_p":
        mass, max_density = check_mass(mass), check_mass(max_density, "max_density")
    if allowed is not None and allowed_count is None:
        raise ValueError("allowed needs allowed_count, its number of True entries (a host int: "
                         "counting it here would wait for the device)")
    scale = d**-0.5 if scale is None else scale
    dev = q_tiled.device
    q_tiled, k_tiled = _rows(q_tiled), _rows(k_tiled)

    q_hat = torch.empty(b, h, nq, d, device=dev, dtype=torch.float32)
    k_hat = torch.empty(b, h, nt, d, device=dev, dtype=torch.float32)
    block_d = min(triton.next_power_of_2(d), 128)
    _pool_kernel[(max(nq, nt), b * h, 2)](
        q_tiled, k_tiled, q_hat, k_hat, layout.query_counts, layout.counts, layout.perm,
        layout.num_tokens, h, nq, nt, d,
        *q_tiled.stride()[:3], *k_tiled.stride()[:3], *q_hat.stride()[:3], *k_hat.stride()[:3],
        QTOKENS=layout.query_tile_tokens, KTOKENS=layout.tile_tokens,
        BLOCK_T=min(triton.next_power_of_2(layout.tile_tokens), 32), BLOCK_D=block_d,
        GATHER=untiled)

    nt_p2 = max(16, triton.next_power_of_2(nt))
    keys = torch.empty(b, h, nq, nt, device=dev, dtype=torch.int64) if mode != "top_p" else None
    kept = torch.empty(b, h, nq, nt, device=dev, dtype=torch.uint8)  # every entry written
    counts = torch.empty(b, h, nq, device=dev, dtype=torch.int32)
    indices = torch.empty(b, h, nq, nt, device=dev, dtype=torch.int32)
    probs = torch.empty(b, h, nq, nt, device=dev, dtype=torch.float32) if return_probs else None
    if allowed is None:
        allowed_arg, strides = kept, (0, 0)  # never read
    else:
        if allowed.shape != (nq, nt) or allowed.dtype != torch.bool:
            raise ValueError(f"allowed must be bool [{nq}, {nt}], got {allowed.dtype} "
                             f"{list(allowed.shape)}")
        allowed_arg, strides = allowed.view(torch.uint8), allowed.stride()
    cap = math.ceil(max_density * nt - 1e-9) if mode == "top_p" else 0
    block_q = 16  # tl.dot's least; the rows of a program share one read of the pooled keys
    warps = 4 if block_q * nt_p2 <= 2048 else 8 if block_q * nt_p2 <= 8192 else 16
    grid = (triton.cdiv(nq, block_q), b * h)
    _draft_row_kernel[grid](
        q_hat, k_hat, allowed_arg, layout.counts, probs if return_probs else kept,
        keys if keys is not None else kept, kept, counts, indices,
        scale, mass or 0.0, cap, nq, nt, d, layout.tiles_per_query_tile, *strides,
        MODE=("global", "row", "top_p").index(mode), HAS_ALLOWED=allowed is not None,
        ASYM=layout.asymmetric, WRITE_PROBS=return_probs, BLOCK_Q=block_q, NT_P2=nt_p2,
        BLOCK_D=min(max(16, triton.next_power_of_2(d)), max(16, 8192 // nt_p2)),
        num_warps=warps)
    if keys is not None:
        total = nq * nt if allowed is None else allowed_count
        budget = (block_budget(nt, sparsity, nq) if allowed is None
                  else min(total, max(nt, round((1.0 - sparsity) * total))))
        # the budget-th largest key of each head: exactly `budget` keys reach it (unique keys)
        thresh = keys.view(b, h, nq * nt).topk(budget, dim=-1, sorted=False).values.amin(-1)
        _index_kernel[grid](keys, thresh.contiguous(), kept, counts, indices, nq, nt,
                            BLOCK_Q=block_q, NT_P2=nt_p2, num_warps=warps)
    return DraftBlocks(kept.view(torch.bool), counts, indices, probs)
