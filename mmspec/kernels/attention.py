"""`block_sparse_attention`: the one attention entry point of mmspec.

The public function validates its inputs once and calls the op `mmspec::block_sparse_attention`
(registered with `torch.library`, with a fake implementation so `torch.compile` graphs pass through
it). The op dispatches to a backend from the registry: `"triton"` (GPU kernel) and its Hopper
variants `"triton-tma"` / `"triton-tma-persistent"`, `"torch"` (fast path on any device),
`"flex"` (FlexAttention), `"reference"` (dense masked attention, for tests), and `"flashinfer"` /
`"fa4"` where those packages import.
"""

from __future__ import annotations

import math
import numbers

import torch

from . import backends  # noqa: F401  (registers the backends)
from .backends.registry import get_backend, resolve_backend
from .mask import BlockSparseMask

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_inputs(q, k, v, mask, lengths=None) -> None:
    """`lengths`: the mask's (q_len, kv_len) where they are not q's and k's (`token_order`)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 4:
            raise ValueError(f"{name} must be 4-D [B, H, N, D], got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")
    if not isinstance(mask, BlockSparseMask):
        raise TypeError(f"mask must be a BlockSparseMask, got {type(mask).__name__}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device == mask.device):
        raise ValueError(
            f"q, k, v and mask must be on one device, got {q.device}, {k.device}, {v.device}, "
            f"{mask.device}"
        )
    b, hq, nq, d = q.shape
    if hq == 0 or d == 0:
        raise ValueError(
            f"q must have at least one head and a head dim D > 0, got shape {tuple(q.shape)}")
    if k.shape[:3] != v.shape[:3] or v.shape[3] == 0:
        raise ValueError(f"k and v must have the same [B, H, N] (v's head dim may differ, as in "
                         f"MLA models), got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(
            f"k/v must be [B={b}, Hkv, Nk, D={d}] to match q {tuple(q.shape)}, got {tuple(k.shape)}"
        )
    if k.shape[1] == 0:
        raise ValueError(f"k/v must have at least one head, got shape {tuple(k.shape)}")
    if hq % k.shape[1] != 0:
        raise ValueError(f"q heads ({hq}) must be a multiple of k/v heads ({k.shape[1]}) for GQA")
    mb, mh, mq_len, mkv_len = mask.shape
    if (mq_len, mkv_len) != (lengths or (nq, k.shape[2])):
        raise ValueError(
            f"mask is for q_len={mq_len}, kv_len={mkv_len} but q has {nq} tokens and k has "
            f"{k.shape[2]}" + (f" (token_order: {lengths[0]} rows)" if lengths else "")
        )
    if mb not in (1, b) or mh not in (1, hq):
        raise ValueError(
            f"mask batch/head dims ({mb}, {mh}) must be 1 or match q's ({b}, {hq})"
        )


# Registered with torch.library's low-level API rather than `custom_op`, whose wrapper imports
# torch._dynamo on the first call (seconds of start-up) even in eager mode.
_LIB = torch.library.Library("mmspec", "DEF")
_LIB.define(
    "block_sparse_attention(Tensor q, Tensor k, Tensor v, Tensor kv_num_blocks, "
    "Tensor kv_indices, Tensor full_kv_num_blocks, Tensor full_kv_indices, Tensor partial_masks, "
    "int block_q, int block_k, float scale, float softcap, str backend) -> (Tensor, Tensor)"
)


def _block_sparse_attention_impl(q, k, v, *mask_and_call):
    """The op: after q, k, v its schema's kv_num_blocks, kv_indices, full_kv_num_blocks,
    full_kv_indices, partial_masks (the mask's tensors), block_q, block_k, scale, softcap, backend."""
    *tensors, block_q, block_k, scale, softcap, backend = mask_and_call
    mask = BlockSparseMask._unchecked(*tensors, (block_q, block_k), q.shape[2], k.shape[2])
    out, lse = get_backend(backend).fn(q, k, v, mask, scale, softcap)
    return out.contiguous(), lse.contiguous()


_LIB.impl("block_sparse_attention", _block_sparse_attention_impl, "CompositeExplicitAutograd")


_NO_BACKWARD = ("block_sparse_attention is forward-only (inference: speculative verification, "
                "DraftAttention sampling) and has no backward; run it under torch.no_grad(), or "
                "train with dense attention")
# the backward is an op that raises when it runs, not when it is traced: torch.compile traces
# the backward of a call whose inputs require grad (model parameters outside no_grad), and a
# backward that raised at once failed the compilation of a forward that eager mode runs
_LIB.define("no_backward(Tensor grad, Tensor like) -> Tensor")


def _no_backward(grad, like):
    raise NotImplementedError(_NO_BACKWARD)


_LIB.impl("no_backward", _no_backward, "CompositeExplicitAutograd")
torch.library.register_fake("mmspec::no_backward",
                            lambda grad, like: torch.empty_like(like), lib=_LIB)


def _setup_context(ctx, inputs, output):
    ctx.shapes = inputs[:3]  # q, k, v: each gets a gradient node that raises


def _backward(ctx, grad_out, grad_lse):
    # without this every backend path did something else: gradients, None, or an in-place error;
    # a node per input, so that compiling keeps one whichever of q, k and v needs a gradient
    # (with q's alone, a k- or v-only backward was dropped as unused and ran without gradients)
    grads = tuple(torch.ops.mmspec.no_backward(grad_out, x) for x in ctx.shapes)
    return grads + (None,) * 10


torch.library.register_autograd("mmspec::block_sparse_attention", _backward,
                                setup_context=_setup_context, lib=_LIB)


@torch.library.register_fake("mmspec::block_sparse_attention", lib=_LIB)
def _(q, k, v, *mask_and_call):  # the schema's other arguments, as `_block_sparse_attention_impl`
    # contiguous, as the real op returns (empty_like would copy a transposed q's strides, and
    # inductor asserts the strides it was promised)
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


def _real(value) -> float | None:
    """A real number (Python, NumPy) or a one-element real tensor as a float; None otherwise."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype == torch.bool or value.is_complex():
            return None
        return float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: BlockSparseMask,
    *,
    scale: float | None = None,
    softcap: float | None = None,
    return_lse: bool = False,
    backend: str = "auto",
    token_order: torch.Tensor | None = None,
    key_valid: torch.Tensor | None = None,
):
    """Attention restricted to the blocks kept by `mask`.

    Args:
        q: `[B, Hq, Nq, D]`.
        k, v: `[B, Hkv, Nk, D]`; grouped-query attention when `Hq % Hkv == 0`. v may have
            another head dim `Dv` than q and k (MLA models): the output is then `[..., Dv]`.
        mask: a `BlockSparseMask` for `q_len=Nq`, `kv_len=Nk`; its B and H may be 1 (broadcast).
            Lengths need not be multiples of the block size.
        scale: softmax scale, default `D ** -0.5`.
        softcap: soft-cap the scaled logits, `s -> softcap * tanh(s / softcap)` before the softmax
            (Gemma 2's `attn_logit_softcapping`); None for none. Both are real numbers (Python's,
            NumPy's) or one-element tensors.
        return_lse: also return the natural-log log-sum-exp of each row, fp32 `[B, Hq, Nq]`.
        backend: `"auto"` (this machine's timing table where it has an entry near the call,
            else triton on CUDA and torch elsewhere; `backends/timings.py`), `"triton"`,
            `"triton-tma"` and `"triton-tma-persistent"` (SM90+), `"torch"`, `"flex"`
            (FlexAttention), `"reference"`, and where their packages import `"flashinfer"` and
            `"fa4"` (FlashAttention-4).
        token_order: optional int32/int64 `[M]` (M >= N = Nq = Nk, the mask's q_len and
            kv_len): the mask's row and column i are token `token_order[i]` of q, k and v, i.e.
            the mask is over `x[:, :, token_order]`, while q, k, v and the result stay in their
            own order. An entry outside [0, N) is a slot with no token (a frame padded to whole
            tiles): no query row there, and its key is left out of every softmax. The Triton
            backend reads the rows through this index in eager mode (no copy in or out;
            DraftAttention's tile order, `reads_through_order`); the others gather the inputs
            and scatter the output around the call, and where keys are left out build the
            call's token mask (M x M per sample and head: for tests and short sequences). Not
            checked to hold each token once (that would wait for the device).
        key_valid: optional bool `[B|1, N]` in k's order, with `token_order` only: False for the
            keys to leave out of every softmax, exactly (text padding). A query row with no key
            left gets 0 and lse = -inf.

    Returns:
        `out` `[B, Hq, Nq, D]` in q's dtype, and `lse` when `return_lse` (both in q's order).

    Note:
        A query row that attends nothing returns 0 with lse = -inf, never NaN.
        Causal masks built by `mmspec.kernels.causal_block_mask` for `Nq != Nk` are aligned
        bottom-right: query i sees keys `j <= i + Nk - Nq` (flash-attention's convention), which is
        what decoding with a KV cache needs.

    Example: the engine's verification forward of a root x and its two children y and z (a
    tree of three nodes) after 61 cached keys, blocks of 64: Nq = 3, Nk = 64 (the cache, then
    x, y, z at keys 61, 62, 63), one query block and one key block. x attends keys 0..61, y
    keys 0..62, z keys 0..61 and 63 (not its sibling y). The one key block is neither empty
    nor full, so it is partial:

        mask = BlockSparseMask.from_token_mask(attends, 64)  # attends: bool [1, 1, 3, 64]
        mask.kv_num_blocks       [[[1]]]          one partial block for the query block
        mask.kv_indices          [[[[0]]]]        it is key block 0
        mask.full_kv_num_blocks  [[[0]]]          no full block
        mask.partial_masks       [1, 1, 1, 1, 64, 64], rows 0..2 `attends`, the rest unread
        out = block_sparse_attention(q, k, v, mask)  # q [B, Hq, 3, D], k, v [B, Hkv, 64, D]

    With a longer cache the blocks before the nodes' block are full (no element mask read)
    and the nodes' block stays partial (`mmspec/decoding/tree.py`, `verify_mask`).
    """
    lengths = _token_order_lengths(q, k, token_order, key_valid)
    _check_inputs(q, k, v, mask, lengths)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    else:
        real = _real(scale)
        if real is None or not math.isfinite(real):
            raise ValueError(f"scale must be None (D ** -0.5) or a finite number, got {scale!r}")
        scale = real
    if softcap is not None:
        real = _real(softcap)
        if real is None or not 0 < real < math.inf:
            raise ValueError(f"softcap must be None or a positive finite number, got {softcap!r}")
        softcap = real
    dv = v.shape[-1]
    if dv != q.shape[-1]:  # MLA (DeepSeek-V2/V3): values of another width than queries and keys
        q, k, v = _common_width(q, k, v)
    backend = resolve_backend(backend, q, k, v, mask).name
    if token_order is not None:
        out, lse = _in_token_order(q, k, v, mask, (scale, softcap or 0.0), backend, token_order,
                                   key_valid)
        return (out[..., :dv], lse) if return_lse else out[..., :dv]
    out, lse = torch.ops.mmspec.block_sparse_attention(
        q, k, v,
        mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks, mask.full_kv_indices,
        mask.partial_masks, mask.block_size[0], mask.block_size[1], scale, softcap or 0.0,
        backend,
    )
    out = out[..., :dv]
    return (out, lse) if return_lse else out


def _token_order_lengths(q, k, order, key_valid):
    """(M, M) for a `token_order` of M rows, after checking it and `key_valid`; None without."""
    if order is None:
        if key_valid is not None:
            raise ValueError("key_valid needs a token_order (the kernel's order of the tokens); "
                             "got token_order=None")
        return None
    n = q.shape[2]
    if (not isinstance(order, torch.Tensor) or order.dtype not in (torch.int32, torch.int64)
            or order.ndim != 1 or order.shape[0] < n or order.device != q.device
            or k.shape[2] != n):
        raise ValueError(f"token_order must be int32/int64 [M >= N={n}] on {q.device} for q and "
                         f"k of N tokens each, got "
                         f"{getattr(order, 'dtype', type(order).__name__)} "
                         f"{list(getattr(order, 'shape', []))} on "
                         f"{getattr(order, 'device', None)} for N = {n} and {k.shape[2]}")
    shapes = ((1, n), (q.shape[0], n))
    if key_valid is not None and (not isinstance(key_valid, torch.Tensor)
                                  or key_valid.dtype != torch.bool
                                  or tuple(key_valid.shape) not in shapes
                                  or key_valid.device != q.device):
        raise ValueError(f"key_valid must be bool [B|1={q.shape[0]}, N={n}] on {q.device}, got "
                         f"{getattr(key_valid, 'dtype', type(key_valid).__name__)} "
                         f"{list(getattr(key_valid, 'shape', []))}")
    return order.shape[0], order.shape[0]


def reads_through_order(q, k, v, mask, backend: str = "auto") -> bool:
    """Whether `block_sparse_attention(q, k, v, mask, backend=backend, token_order=...)` reads q,
    k and v through the index inside the kernel (no copy; eager, no gradient, a backend with a
    gathered form: Triton), rather than gathering them around the call. `mask` is the kernel's
    (M rows)."""
    if torch.compiler.is_compiling() or (
            torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))):
        return False
    return resolve_backend(backend, q, k, v, mask).gathered is not None


def _in_token_order(q, k, v, mask, scale_softcap, backend, order, key_valid):
    """`block_sparse_attention` over `x[:, :, order]` with the result in q's order: through the
    backend's gathered kernel where it has one (eager), else gathered and scattered here."""
    n, m = q.shape[2], order.shape[0]
    scale, softcap = scale_softcap
    has = (order >= 0) & (order < n)  # [M]: the slots with a token
    key_rows = None if key_valid is None else torch.where(
        has & key_valid[:, order.clamp(0, n - 1)], order, -1)  # [B|1, M]
    if reads_through_order(q, k, v, mask, backend):
        return get_backend(backend).gathered(q, k, v, mask, scale, softcap, order, key_rows)
    slot = torch.where(has, order, n)  # slots of no token read a row of zeros
    q, k, v = (torch.cat([x, x.new_zeros(*x.shape[:2], 1, x.shape[3])], 2).index_select(2, slot)
               for x in (q, k, v))
    if m != n or key_valid is not None:  # keys left out: the call's token mask
        keys = has[None] if key_rows is None else key_rows >= 0  # [B|1, M]
        mask = BlockSparseMask.from_token_mask(mask.to_dense() & keys[:, None, None],
                                               mask.block_size)
    out, lse = torch.ops.mmspec.block_sparse_attention(
        q, k, v, mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks,
        mask.full_kv_indices, mask.partial_masks, mask.block_size[0], mask.block_size[1], scale,
        softcap, backend)
    # slots of no token all land on row N, dropped
    return (out.new_empty(*out.shape[:2], n + 1, out.shape[3]).index_copy_(2, slot, out)[:, :, :n],
            lse.new_empty(*lse.shape[:2], n + 1).index_copy_(2, slot, lse)[:, :, :n])


def _common_width(q, k, v):
    """Zero-pad the narrower side to one head dim: zero columns of q and k add nothing to the
    scores (the scale is taken from the true D before), and zero columns of v give zero output
    columns, cut off after the call. Exact, at the cost of a padded copy."""
    d, dv = q.shape[-1], v.shape[-1]
    if dv < d:
        return q, k, torch.nn.functional.pad(v, (0, d - dv))
    pad = (0, dv - d)
    return torch.nn.functional.pad(q, pad), torch.nn.functional.pad(k, pad), v
