"""`block_sparse_attention(token_order=)`: the mask over `x[:, :, order]`, q, k, v and the result in
their own order; the Triton kernel reads through the index (under the interpreter here), the
other backends gather and scatter, and both equal the copy-in, copy-out call."""

import pytest
import torch

from mmspec.kernels import BlockSparseMask, block_sparse_attention
from mmspec.kernels.backends import registry


def _inputs(n=96, d=16, heads=2, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, heads, n, d, generator=g, dtype=dtype) for _ in range(3))
    order = torch.randperm(n, generator=g)
    m = -(-n // 16)
    blocks = torch.rand(2, heads, m, m, generator=g) < 0.5
    blocks |= torch.eye(blocks.shape[-1], dtype=torch.bool)  # no empty row
    return q, k, v, order, BlockSparseMask.from_dense(blocks, 16, n, n)


def _copied(q, k, v, mask, order, **kw):
    """Today's way: copy into the order, attend, copy the output back."""
    out, lse = block_sparse_attention(*(x[:, :, order] for x in (q, k, v)), mask,
                                      return_lse=True, **kw)
    back = torch.argsort(order)
    return out[:, :, back], lse[:, :, back]


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("n", [96, 88])  # 88: a partial last block
def test_the_result_is_the_copied_call_in_the_model_order(backend, n):
    q, k, v, order, mask = _inputs(n)
    out, lse = block_sparse_attention(q, k, v, mask, backend=backend, token_order=order,
                                      return_lse=True)
    ref, ref_lse = _copied(q, k, v, mask, order, backend=backend)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=1e-6)


def test_triton_reads_through_the_index_and_strided_inputs_work(monkeypatch):
    q, k, v, order, mask = _inputs(64, heads=2)
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))  # [B, L, H, D]
    calls = []
    backend = registry.get_backend("triton")
    gathered = backend.gathered
    monkeypatch.setitem(registry._BACKENDS, "triton", registry.Backend(
        backend.name, backend.fn, backend.constraints,
        lambda *a: calls.append(a[-1]) or gathered(*a)))
    out = block_sparse_attention(q, k, v, mask, backend="triton", token_order=order.int())
    assert len(calls) == 1  # the kernel's own gather, no copy here
    ref, _ = _copied(q, k, v, mask, order, backend="torch")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    with torch.enable_grad():  # a backward must raise as the op's does: the copying path
        out = block_sparse_attention(q.requires_grad_(), k, v, mask, backend="triton",
                                     token_order=order)
    assert len(calls) == 1
    with pytest.raises(NotImplementedError, match="forward-only"):
        out.sum().backward()


def test_a_bad_token_order_is_named():
    q, k, v, order, mask = _inputs(32)
    with pytest.raises(ValueError, match=r"token_order must be int32/int64 \[M >= N=32\] .* got "
                                         r"torch.float32 \[32\]"):
        block_sparse_attention(q, k, v, mask, token_order=order.float())
    with pytest.raises(ValueError, match=r"got torch.int64 \[31\]"):
        block_sparse_attention(q, k, v, mask, token_order=order[:31])
    with pytest.raises(ValueError, match=r"mask is for q_len=32, kv_len=32 but q has 32 tokens "
                                         r"and k has 32 \(token_order: 33 rows\)"):
        block_sparse_attention(q, k, v, mask, token_order=torch.cat([order, order[:1]]))
    with pytest.raises(ValueError, match=r"key_valid must be bool \[B\|1=2, N=32\] on cpu, got "
                                         r"torch.int64 \[2, 32\]"):
        block_sparse_attention(q, k, v, mask, token_order=order,
                               key_valid=torch.ones(2, 32, dtype=torch.long))
    with pytest.raises(ValueError, match="key_valid needs a token_order"):
        block_sparse_attention(q, k, v, mask, key_valid=torch.ones(2, 32, dtype=torch.bool))


def _slots_and_holes(n=40, m=48, seed=1):
    """q, k, v of n tokens, an order of m kernel rows whose m - n slots hold no token (-1, or
    an index past the end), key_valid with holes, and a mask over the m rows."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, n, 16, generator=g) for _ in range(3))
    order = torch.randperm(m, generator=g)
    order = torch.where(order < n, order, torch.where(order % 2 == 0, -1, order))
    key_valid = torch.rand(2, n, generator=g) < 0.7
    blocks = torch.rand(2, 2, m // 16, m // 16, generator=g) < 0.5
    blocks |= torch.eye(m // 16, dtype=torch.bool)
    return q, k, v, order, key_valid, BlockSparseMask.from_dense(blocks, 16, m, m)


def _by_hand(q, k, v, mask, order, key_valid):
    """Dense softmax in the kernel's order over the kept blocks' valid keys, scattered back."""
    n = q.shape[2]
    has = (order >= 0) & (order < n)
    slot = torch.where(has, order, n)
    qs, ks, vs = (torch.cat([x, torch.zeros_like(x[:, :, :1])], 2)[:, :, slot] for x in (q, k, v))
    keys = has & torch.cat([key_valid, key_valid[:, :1]], 1)[:, slot]  # [B, M]
    allowed = mask.to_dense() & keys[:, None, None, :]
    logits = (qs @ ks.transpose(-1, -2) * q.shape[-1] ** -0.5).masked_fill(~allowed, -torch.inf)
    lse = torch.logsumexp(logits, -1)
    weights = torch.exp(logits - torch.where(lse.isinf(), 0.0, lse)[..., None])
    out = torch.zeros_like(q)
    out[:, :, order[has]] = (weights @ vs)[:, :, has]
    ref_lse = torch.empty_like(lse[:, :, :n])
    ref_lse[:, :, order[has]] = lse[:, :, has]
    return out, ref_lse


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("with_key_valid", [False, True])
def test_slots_of_no_token_and_invalid_keys_are_left_out_exactly(backend, with_key_valid):
    q, k, v, order, key_valid, mask = _slots_and_holes()
    if with_key_valid:
        key_valid[1, :] = False  # sample 1: no key left anywhere, every row 0 with lse -inf
    else:
        key_valid = torch.ones_like(key_valid)
    out, lse = block_sparse_attention(q, k, v, mask, backend=backend, token_order=order,
                                      key_valid=key_valid if with_key_valid else None,
                                      return_lse=True)
    ref, ref_lse = _by_hand(q, k, v, mask, order, key_valid)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=1e-6)
