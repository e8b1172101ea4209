"""Torch backend: the fast path on CPU, and a batched-matmul path for any device.

On x86 CPUs with AVX2 the call goes to a fused C++ kernel (`csrc/block_sparse_cpu.cpp`, built once
with `torch.utils.cpp_extension` and cached): per (batch, head, query block) it walks the kept key
blocks with BLAS gemms on cache-resident tiles and an online softmax using ATen's fast `exp_u20`.
When it cannot be built, or on other devices, the batched-matmul path below runs instead.

Batched-matmul path:

Rows (one per batch, head and query block) are sorted by how many key blocks they keep and cut into
chunks whose score tiles fit in cache. For a chunk of G rows keeping at most w blocks each:

    keys    = gather of the kept key blocks                  # [G, w*bk, D]
    scores  = q_blocks @ keys^T                              # [G, bq, w*bk]
    softmax in place (max, exp, sum), then probs @ values    # [G, bq, D]

so no score is computed for a skipped block and no online-softmax rescaling is needed. Element
masks are applied only in chunks that hold partial blocks, padding slots or the ragged key tail.

When the mask keeps every block in full on CPU, the call goes to PyTorch's fused CPU flash
attention instead, which also returns the lse.

On a 2-core CPU the fused kernel reaches about 8.5x over dense at density 0.1 (BENCHMARKS.md
`kernels`; 7.6-8.9x across runs). The batched-matmul path's `exp` (Sleef, ~1.3 G/s) and block
gathers capped it near 5-6x there (measured ad hoc when the fused kernel was written, not in
BENCHMARKS.md).
"""

import contextlib
import functools
import hashlib
import logging
import os
import platform
import sys
from pathlib import Path

import torch

from ..mask import BlockSparseMask
from .registry import register_backend

# below this many (query, key) pairs per head, masked dense attention beats walking blocks:
# decode and tree-verification shapes (a few queries against a KV cache)
_SMALL_PAIRS = 1 << 18

# floats per chunk of scores: about 4 MB, so a chunk's scores stay in L2/L3 between passes
_CHUNK_ELEMENTS = 1 << 20


_log = logging.getLogger(__name__)


@contextlib.contextmanager
def _build_lock(path: Path):
    """Hold an exclusive `flock` on `path` (a no-op where fcntl is missing). The OS drops it when
    the holder dies, so unlike torch's own build lock a killed build never leaves it behind."""
    try:
        import fcntl
    except ImportError:  # Windows: torch's lock alone
        yield
        return
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log.warning("mmspec: waiting for another process to build the CPU attention kernel")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _kernel_build_paths() -> tuple[str, Path, Path]:
    """(extension name, content-addressed source copy, torch's build directory for it)."""
    from torch.utils import cpp_extension

    code = (Path(__file__).parent / "csrc" / "block_sparse_cpu.cpp").read_bytes()
    # keyed by the environment too: torch's ninja file records its include paths, so two
    # virtual environments sharing one build folder rebuilt it for each other, silently
    env = f"{sys.prefix}\0{torch.__file__}\0{torch.__version__}".encode()
    name = (f"mmspec_block_sparse_cpu_{hashlib.sha1(code).hexdigest()[:12]}_"
            f"{hashlib.sha1(env).hexdigest()[:8]}")
    root = Path(cpp_extension.get_default_build_root())
    if hasattr(cpp_extension, "_get_build_directory"):  # where `load` builds (py311_cpu/NAME)
        build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
    else:
        build_dir = next(root.glob(f"*/{name}"), root / name)
    source = root / "mmspec_sources" / f"{name}.cpp"
    if not source.is_file():
        source.parent.mkdir(parents=True, exist_ok=True)
        partial = source.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(code)
        partial.replace(source)  # atomic: concurrent first builds never see half a file
    return name, source, build_dir


@functools.cache
def _cpu_kernel():
    """The fused CPU kernel op, or None where it cannot be built (no AVX2, no compiler, ...)."""
    if os.environ.get("MMSPEC_CPU_KERNEL", "1") == "0":
        return None
    if platform.machine() not in ("x86_64", "AMD64") or torch.backends.cpu.get_cpu_capability() not in (
        "AVX2", "AVX512"
    ):
        return None
    from torch.utils.cpp_extension import load

    # Content-addressed build: torch's ninja file records the source *path*, so building every
    # checkout (CI clone, worktree, site-packages) from its own path made them rebuild each other's
    # kernel (~30 s each time). A copy named after its hash gives one build per kernel version.
    name, source, build_dir = _kernel_build_paths()
    with _build_lock(build_dir.parent / f"{name}.flock"):
        # torch's own lock (`lock` in the build directory) is a plain file that every later load
        # waits on forever when a build is killed (a crashed test, a timeout). Every mmspec build
        # holds the flock above, so a torch lock found here was left by a dead build.
        stale = build_dir / "lock"
        if stale.exists():
            _log.warning("mmspec: removing a kernel build lock left by a killed build: %s", stale)
            stale.unlink(missing_ok=True)
        if next(build_dir.glob("*.so"), None) is None:
            _log.warning("mmspec: building the fused CPU attention kernel for the environment "
                         "%s in %s (once per environment and kernel version, ~30 s)",
                         sys.prefix, build_dir)
        try:
            load(name=name, sources=[str(source)], is_python_module=False,
                 extra_cflags=["-O3", "-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2",
                               "-DCPU_CAPABILITY_AVX2", "-fopenmp"],
                 extra_ldflags=["-fopenmp"])
        except (OSError, RuntimeError, ImportError) as err:  # no compiler/ninja, or a failed build
            _log.warning("mmspec: fused CPU kernel unavailable (%s); "
                         "using the batched-matmul path", err)
            return None
    return torch.ops.mmspec_cpu.block_sparse_forward


def _fused_cpu(kernel, q, k, v, mask: BlockSparseMask, scale: float, softcap: float):
    bq, bk = mask.block_size
    nq, nkv = q.shape[2], k.shape[2]
    pad_q, pad_k = mask.num_q_blocks * bq - nq, mask.num_kv_blocks * bk - nkv
    qf = torch.nn.functional.pad(q.float(), (0, 0, 0, pad_q)).contiguous()
    kf = torch.nn.functional.pad(k.float(), (0, 0, 0, pad_k)).contiguous()
    vf = torch.nn.functional.pad(v.float(), (0, 0, 0, pad_k)).contiguous()
    out, lse = kernel(qf, kf, vf,
                      mask.full_kv_num_blocks.contiguous(), mask.full_kv_indices.contiguous(),
                      mask.kv_num_blocks.contiguous(), mask.kv_indices.contiguous(),
                      mask.partial_masks.contiguous().view(torch.uint8), bq, bk, nkv, scale,
                      softcap)
    return out[:, :, :nq].to(q.dtype), lse[:, :, :nq]


def _expand_kv(k, v, heads):
    """Repeat k/v heads for GQA (expand + reshape: one copy, far cheaper than repeat_interleave)."""
    b, hkv, n, d = k.shape
    if heads == hkv:
        return k, v
    return (t[:, :, None].expand(b, hkv, heads // hkv, n, d).reshape(b, heads, n, d) for t in (k, v))


def _unit_stride(*tensors):
    """The raw aten flash op assumes a contiguous head dim (`F.scaled_dot_product_attention`
    makes it so first): a stepped slice, a transposed [.., D, N] store or an expanded D (stride
    0) gave wrong outputs, up to reads past the tensor."""
    return [t if t.stride(-1) == 1 else t.contiguous() for t in tensors]


def _dense_cpu(q, k, v, scale):
    """PyTorch's fused CPU flash attention, which also returns the lse."""
    k, v = _expand_kv(k, v, q.shape[1])
    q, k, v = _unit_stride(q, k, v)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, scale=scale)
    return out, lse.float()


def _softcap_(scores, softcap: float):
    """`softcap * tanh(scores / softcap)` in place (Gemma 2's logit soft-capping); 0 = none."""
    if softcap:
        scores.div_(softcap).tanh_().mul_(softcap)
    return scores


def _small_dense_flash(q, k, v, scale, token_mask):
    """Small problems without soft-capping: PyTorch's fused CPU flash attention, the token mask as
    an additive bias (a third of `_small_dense`'s time at tree-verification shapes)."""
    k, v = _expand_kv(k, v, q.shape[1])
    q, k, v = _unit_stride(q, k, v)
    bias = torch.zeros(token_mask.shape, dtype=q.dtype).masked_fill_(~token_mask, float("-inf"))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, attn_mask=bias, scale=scale)
    empty = ~token_mask.any(-1)  # [B or 1, H or 1, Nq]: rows that attend nothing
    if bool(empty.any()):  # the kernel gives them lse 0; the contract is 0 out, lse -inf
        out = out.masked_fill(empty[..., None], 0.0)
        lse = lse.masked_fill(empty, float("-inf"))
    return out, lse.float()


def _small_dense(q, k, v, scale, token_mask, softcap=0.0):
    """Masked dense attention in fp32 for small problems (decode, tree verification)."""
    k, v = _expand_kv(k.float(), v.float(), q.shape[1])
    scores = torch.matmul(q.float() * scale, k.transpose(-1, -2))  # [B, H, Nq, Nk]
    _softcap_(scores, softcap)
    scores.masked_fill_(~token_mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, H, Nq], -inf on empty rows
    probs = scores.sub_(torch.where(lse == float("-inf"), 0.0, lse)[..., None]).exp_()
    return torch.matmul(probs, v).to(q.dtype), lse


def _row_slots(mask: BlockSparseMask, b: int, hq: int):
    """Per row (b, h, query block): kept key-block ids with full blocks first, compacted.

    Returns ids, partial-slot numbers (-1 for full blocks) and counts, each flattened over rows.
    """
    mq = mask.num_q_blocks
    rows = b * hq * mq
    full_num = mask.full_kv_num_blocks.expand(b, hq, mq).reshape(rows)
    part_num = mask.kv_num_blocks.expand(b, hq, mq).reshape(rows)
    wf, wp = mask.full_kv_indices.shape[-1], mask.kv_indices.shape[-1]
    full_idx = mask.full_kv_indices.expand(b, hq, mq, wf).reshape(rows, wf)
    part_idx = mask.kv_indices.expand(b, hq, mq, wp).reshape(rows, wp)
    dev = full_num.device
    ids = torch.cat([full_idx, part_idx], dim=1).long()  # [R, wf+wp]
    valid = torch.cat(
        [torch.arange(wf, device=dev) < full_num[:, None],
         torch.arange(wp, device=dev) < part_num[:, None]], dim=1,
    )
    pslot = torch.cat(
        [torch.full((rows, wf), -1, device=dev, dtype=torch.long),
         torch.arange(wp, device=dev).expand(rows, wp)], dim=1,
    )
    order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)
    ids = torch.where(torch.gather(valid, 1, order), torch.gather(ids, 1, order), 0)
    return ids, torch.gather(pslot, 1, order), full_num + part_num


@register_backend("torch")
def torch_block_attention(q, k, v, mask: BlockSparseMask, scale: float, softcap: float = 0.0):
    if q.device.type == "cpu":
        if mask.is_dense and not softcap:  # PyTorch's flash attention has no soft-capping
            return _dense_cpu(q, k, v, scale)
        if mask.q_len * mask.kv_len <= _SMALL_PAIRS:
            token_mask = mask.to_dense()
            if softcap:  # the flash kernel has no soft-capping
                return _small_dense(q, k, v, scale, token_mask, softcap)
            return _small_dense_flash(q, k, v, scale, token_mask)
        kernel = _cpu_kernel()
        if kernel is not None:
            return _fused_cpu(kernel, q, k, v, mask, scale, softcap)
    return _batched(q, k, v, mask, scale, softcap)


def _batched(q, k, v, mask: BlockSparseMask, scale: float, softcap: float = 0.0):
    b, hq, nq, d = q.shape
    hkv, nkv = k.shape[1], k.shape[2]
    group = hq // hkv
    bq, bk = mask.block_size
    mq, nk = mask.num_q_blocks, mask.num_kv_blocks
    rows = b * hq * mq

    # pad to whole blocks; padded queries are dropped, padded keys masked below
    # elementwise ops keep a transposed input's strides (HF passes [B, N, H, D] views), and the
    # block views below need contiguous memory
    qf = torch.nn.functional.pad(q.float() * scale, (0, 0, 0, mq * bq - nq)).contiguous()
    kf = torch.nn.functional.pad(k.float(), (0, 0, 0, nk * bk - nkv)).contiguous()
    vf = torch.nn.functional.pad(v.float(), (0, 0, 0, nk * bk - nkv)).contiguous()
    q_rows = qf.view(rows, bq, d)  # [R, bq, D]
    k_blocks = kf.view(b * hkv * nk, bk, d)  # [B*Hkv*Nk, bk, D]
    v_blocks = vf.view(b * hkv * nk, bk, d)

    ids, pslot, counts = _row_slots(mask, b, hq)
    row = torch.arange(rows, device=q.device)
    kv_head = (row // (hq * mq)) * hkv + (row // mq) % hq // group  # [R]
    gids = ids + (kv_head * nk)[:, None]  # global key-block ids, [R, W]

    bm, hm = mask.kv_num_blocks.shape[:2]
    mask_row = (row // (hq * mq) % bm, row // mq % hq % hm, row % mq)  # broadcast B/H of the mask
    tail = nkv - (nk - 1) * bk  # keys in the last block
    tail_drop = torch.arange(bk, device=q.device) >= tail  # [bk]

    out = torch.zeros(rows, bq, d, device=q.device, dtype=torch.float32)
    lse = torch.full((rows, bq), float("-inf"), device=q.device, dtype=torch.float32)
    order = torch.argsort(counts, descending=True, stable=True)
    counts_sorted = counts[order].tolist()
    start = 0
    while start < rows and counts_sorted[start] > 0:
        w = counts_sorted[start]
        g = max(1, min(_CHUNK_ELEMENTS // (bq * w * bk), rows - start))
        chunk = order[start : start + g]
        n_live = sum(1 for c in counts_sorted[start : start + g] if c > 0)
        chunk, chunk_counts = chunk[:n_live], counts[chunk[:n_live]]
        start += g
        g = chunk.numel()
        slot_ids = gids[chunk, :w]  # [G, w]
        keys = k_blocks.index_select(0, slot_ids.reshape(-1)).view(g, w * bk, d)
        values = v_blocks.index_select(0, slot_ids.reshape(-1)).view(g, w * bk, d)
        scores = torch.bmm(q_rows.index_select(0, chunk), keys.transpose(1, 2))  # [G, bq, w*bk]
        _softcap_(scores, softcap)

        drop = _chunk_drop(mask, mask_row, chunk, chunk_counts, ids, pslot, w, nk, tail_drop)
        if drop is not None:  # [G, bq|1, w, bk]
            scores.view(g, bq, w, bk).masked_fill_(drop, float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True)  # [G, bq, 1]
        row_max = torch.where(row_max == float("-inf"), 0.0, row_max)
        probs = scores.sub_(row_max).exp_()
        denom = probs.sum(dim=-1, keepdim=True)
        chunk_out = torch.bmm(probs, values).div_(denom.clamp_min(torch.finfo(torch.float32).tiny))
        out.index_copy_(0, chunk, chunk_out)
        lse.index_copy_(0, chunk, (row_max + denom.log()).squeeze(-1))
    out = out.view(b, hq, mq * bq, d)[:, :, :nq].to(q.dtype)
    return out, lse.view(b, hq, mq * bq)[:, :, :nq]


def _chunk_drop(mask, mask_row, chunk, chunk_counts, ids, pslot, w, nk, tail_drop):
    """bool `[G, bq|1, w, bk]` of scores to drop in this chunk, or None when nothing is dropped."""
    bq, bk = mask.block_size
    slot_ids, slot_part = ids[chunk, :w], pslot[chunk, :w]  # [G, w]
    padding = torch.arange(w, device=chunk.device) >= chunk_counts[:, None]  # [G, w]
    has_tail = bool(tail_drop.any()) and bool((slot_ids == nk - 1).any())
    has_partial = bool((slot_part >= 0).any())
    if not (bool(padding.any()) or has_tail or has_partial):
        return None
    drop = padding[:, None, :, None]  # [G, 1, w, 1]
    if has_tail:
        drop = drop | ((slot_ids == nk - 1)[:, None, :, None] & tail_drop)
    if has_partial:
        bi, hi, mi = (t[chunk] for t in mask_row)
        element = mask.partial_masks[bi[:, None], hi[:, None], mi[:, None], slot_part.clamp_min(0)]
        keep = element | (slot_part < 0)[..., None, None]  # [G, w, bq, bk]
        drop = drop | ~keep.permute(0, 2, 1, 3)
    return drop
