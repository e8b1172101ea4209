"""The FlashInfer and FlashAttention-4 backends' own code (layout conversion, per-head calls,
GQA, transposes, lse base, empty rows) on the CPU, against stand-ins for the two packages that
compute what their documentation says the real calls compute, densely. The real kernels are
checked on a GPU by test_gpu_backends.py."""

import math
from types import SimpleNamespace
from typing import NamedTuple

import pytest
import torch

from mmspec.kernels import BlockSparseMask, block_sparse_attention
from mmspec.kernels.backends import fa4, flashinfer


def dense_attention(q, k, v, allowed, scale, cap):
    """q `[H, M, D]`, k/v `[Hkv, N, D]`, allowed bool `[H|1, M, N]` -> out, natural-log lse."""
    group = q.shape[0] // k.shape[0]
    s = q.float() @ k.float().repeat_interleave(group, 0).transpose(-1, -2) * scale
    if cap:
        s = cap * torch.tanh(s / cap)
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.nan_to_num(neginf=0.0)[..., None])
    return (p @ v.float().repeat_interleave(group, 0)).to(q.dtype), lse


class FakeBSRWrapper:
    """flashinfer.BlockSparseAttentionWrapper as documented: BSR rows of R queries, blocks of C
    keys, element masks `[nnz, R, C]`, NHD tensors, lse in base 2."""

    def __init__(self, workspace):
        pass

    def plan(self, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask=None,
             logits_soft_cap=None, sm_scale=None, q_data_type=None, kv_data_type=None,
             o_data_type=None):
        allowed = torch.zeros(M, N, dtype=torch.bool)
        for row in range(len(indptr) - 1):
            for slot in range(int(indptr[row]), int(indptr[row + 1])):
                col = int(indices[slot])
                allowed[row * R:(row + 1) * R, col * C:(col + 1) * C] = (
                    True if mask is None else mask[slot])
        self.allowed, self.scale, self.cap = allowed, sm_scale, logits_soft_cap
        self.heads = (num_qo_heads, num_kv_heads, head_dim)

    def run(self, q, k, v, return_lse=False):
        assert (q.shape[1], k.shape[1], q.shape[2]) == self.heads  # what plan was told
        out, lse = dense_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                   self.allowed[None], self.scale, self.cap)
        return out.transpose(0, 1), (lse / math.log(2.0)).transpose(0, 1)


class FakeTensors(NamedTuple):
    mask_block_cnt: torch.Tensor
    mask_block_idx: torch.Tensor
    full_block_cnt: torch.Tensor = None
    full_block_idx: torch.Tensor = None
    block_size: tuple = None


def fake_fa4(q, k, v, softmax_scale=None, softcap=0.0, block_sparse_tensors=None,
             return_lse=False):
    """flash_attn.cute.flash_attn_func with full blocks only: `[B, N, H, D]`, lse `[B, H, N]`."""
    t = block_sparse_tensors
    assert not t.mask_block_cnt.any()
    bq, bk = t.block_size
    b, h, mq, nk = t.full_block_idx.shape
    live = torch.arange(nk) < t.full_block_cnt[..., None]
    blocks = torch.zeros(b, h, mq, nk + 1, dtype=torch.bool)
    blocks.scatter_(-1, torch.where(live, t.full_block_idx, nk).long(), True)
    allowed = blocks[..., :nk].repeat_interleave(bq, 2).repeat_interleave(bk, 3)
    outs, lses = zip(*(dense_attention(q[i].transpose(0, 1), k[i].transpose(0, 1),
                                       v[i].transpose(0, 1), allowed[i], softmax_scale, softcap)
                       for i in range(b)))
    return torch.stack(outs).transpose(1, 2), torch.stack(lses)


def case(hq, hkv, mask_b, mask_h, partial, b=2, n=64, d=16, block=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for h in (hq, hkv, hkv))
    if partial:
        token = torch.rand(mask_b, mask_h, n, n, generator=g) < 0.5
        token[..., 3, :] = False
        mask = BlockSparseMask.from_token_mask(token, block)
    else:
        blocks = torch.rand(mask_b, mask_h, n // block, n // block, generator=g) < 0.5
        blocks[..., 1, :] = False  # an empty query block
        mask = BlockSparseMask.from_dense(blocks, block, n, n)
    return q, k, v, mask


CASES = [(4, 2, 1, 1, False), (4, 2, 2, 4, False), (2, 2, 1, 2, True), (4, 1, 2, 1, True)]


@pytest.mark.parametrize("hq,hkv,mask_b,mask_h,partial", CASES)
@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_flashinfer_glue(monkeypatch, hq, hkv, mask_b, mask_h, partial, softcap):
    monkeypatch.setattr(flashinfer, "flashinfer",
                        SimpleNamespace(BlockSparseAttentionWrapper=FakeBSRWrapper))
    monkeypatch.setattr(flashinfer, "_workspace", lambda device: None)
    q, k, v, mask = case(hq, hkv, mask_b, mask_h, partial)
    out, lse = flashinfer.flashinfer_backend(q, k, v, mask, 0.3, softcap)
    ref, ref_lse = block_sparse_attention(q, k, v, mask, scale=0.3, softcap=softcap or None,
                                          backend="reference", return_lse=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hq,hkv,mask_b,mask_h", [c[:4] for c in CASES if not c[4]])
def test_fa4_glue(monkeypatch, hq, hkv, mask_b, mask_h):
    monkeypatch.setattr(fa4, "flash_attn_func", fake_fa4)
    monkeypatch.setattr(fa4, "BlockSparseTensorsTorch", FakeTensors, raising=False)
    monkeypatch.setattr(fa4, "_LSE_KWARG", {"return_lse": True})
    q, k, v, mask = case(hq, hkv, mask_b, mask_h, False)
    out, lse = fa4.fa4_backend(q, k, v, mask, 0.3, 0.0)
    ref, ref_lse = block_sparse_attention(q, k, v, mask, scale=0.3, backend="reference",
                                          return_lse=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


def test_fa4_refuses_partial_blocks_and_other_tiles():
    q, k, v, mask = case(2, 2, 1, 1, True, n=256, block=128)
    assert "partial" in fa4._blocks(q, k, v, mask)
    q, k, v, mask = case(2, 2, 1, 1, False)
    assert "128x128" in fa4._blocks(q, k, v, mask)
    q, k, v, mask = case(2, 2, 1, 1, False, n=256, block=128)
    assert fa4._blocks(q, k, v, mask) is None


def test_flashinfer_refuses_ragged_lengths():
    q = torch.randn(1, 2, 50, 64)
    mask = BlockSparseMask.from_dense(torch.ones(1, 1, 4, 4, dtype=torch.bool), 16, 50, 64)
    assert "whole blocks" in flashinfer._whole_blocks(q, q, q, mask)
