"""The Hopper (TMA) variants of the Triton kernel against the fp32 reference: under
TRITON_INTERPRET=1 on a CPU (descriptor loads run as masked gathers, with TMA's alignment checks),
compiled on an sm90+ GPU (`benchmarks/gpu_session.sh`, step tests)."""

import pytest
import torch

from mmspec.kernels import BlockSparseMask, block_sparse_attention
from mmspec.kernels.backends import triton_tma
from mmspec.kernels.backends.registry import get_backend, resolve_backend

from .test_attention import make_case, sdpa_same_precision

VARIANTS = ["triton-tma", "triton-tma-persistent"]
pytestmark = pytest.mark.skipif(triton_tma.TensorDescriptor is None,
                                reason="this Triton has no tensor descriptors")


def run(backend, q, k, v, mask, **kwargs):
    if torch.cuda.is_available():  # compiled
        q, k, v, mask = q.cuda(), k.cuda(), v.cuda(), mask.to("cuda")
        problems = get_backend(backend).problems(q, k, v, mask)
        if problems:
            pytest.skip(f"{backend} on this GPU: {'; '.join(problems)}")
        result = block_sparse_attention(q, k, v, mask, backend=backend, **kwargs)
        return tuple(t.cpu() for t in result) if isinstance(result, tuple) else result.cpu()
    return block_sparse_attention(q, k, v, mask, backend=backend, **kwargs)


# GQA, ragged tails in both lengths, a head dim that is no power of two (64-wide tiles, TMA
# zero-fills the rest); "token": full, partial and empty blocks and empty rows, "blocks": full
# blocks only, the ragged last one too (its keys past kv_len masked without an element mask).
# 6 query tiles, so each of the persistent grid's 3 interpreted programs walks two
CASE = (4, 1, 2, 1, 40, 70, 40, (16, 32), 1, None)


@pytest.mark.parametrize("backend,kind", [("triton-tma", "token"),
                                          ("triton-tma-persistent", "token"),
                                          ("triton-tma-persistent", "blocks")])
def test_error_budget_against_the_reference(backend, kind):
    q, k, v, mask = make_case(*CASE[:8], torch.bfloat16, *CASE[8:], kind=kind)
    out, lse = run(backend, q, k, v, mask, return_lse=True)
    ref, ref_lse = block_sparse_attention(q.float(), k.float(), v.float(), mask,
                                          backend="reference", return_lse=True)
    err = (out.float() - ref).abs().max().item()
    err_pt = (sdpa_same_precision(q, k, v, mask).float() - ref).abs().max().item()
    assert err <= max(2 * err_pt, 1e-2), (err, err_pt)
    empty = ~mask.to_dense().expand(q.shape[0], q.shape[1], -1, -1).any(-1)
    assert empty.any() and torch.equal(lse.isinf(), empty) and (out[empty] == 0).all()
    assert (lse - ref_lse)[~empty].abs().max() < 1e-2


def test_partial_masks_past_kv_len_are_never_read():
    """A mask made from its tensors may keep elements past kv_len in a ragged last block's
    element mask; they name keys that do not exist (TMA reads them as zeros, not as -inf)."""
    q, k, v, mask = make_case(4, 1, 1, 1, 20, 70, 40, (16, 32), torch.bfloat16)
    bk, nk = mask.block_size[1], mask.num_kv_blocks
    last = (mask.kv_indices == nk - 1)[..., None, None]  # [B, H, Mq, P, 1, 1]
    past = torch.arange(bk) >= mask.kv_len - (nk - 1) * bk  # [bk]
    assert (last & past).any()
    mask.partial_masks.copy_(mask.partial_masks | (last & past))
    ref = block_sparse_attention(q.float(), k.float(), v.float(), mask, backend="reference")
    torch.testing.assert_close(run("triton-tma", q, k, v, mask).float(), ref, atol=2e-2, rtol=0)


@pytest.mark.parametrize("d", [32, 256])  # 256: the widest head dim, a 256-column TMA box
def test_whole_blocks_softcap_and_a_transposed_layout(d):
    """Lengths of whole blocks (no key masking in full blocks), soft-capping, and q/k/v as the
    transposed views of [B, N, H, D] that HF attention passes: the descriptors take the strides."""
    q, k, v, mask = make_case(5, 1, 2, 2, 32, 64, d, (16, 32), torch.float16, kind="blocks")
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    out = run("triton-tma-persistent", qt, kt, vt, mask, softcap=2.0)
    ref = block_sparse_attention(q.float(), k.float(), v.float(), mask, backend="reference",
                                 softcap=2.0)
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=0)


def test_constraints_name_what_tma_cannot_take():
    q, k, v, mask = make_case(0, 1, 2, 2, 32, 32, 40, (16, 16), torch.float32)
    backend = get_backend("triton-tma")
    assert any("float16 or bfloat16, got torch.float32" in p
               for p in backend.problems(q, k, v, mask))
    # a 36-wide bf16 row is 72 bytes: no 16-byte aligned stride for the copy engine
    q, k, v = (torch.randn(1, 2, 32, 36).bfloat16() for _ in range(3))
    problems = backend.problems(q, k, v, BlockSparseMask.from_dense(
        torch.ones(1, 1, 2, 2, dtype=torch.bool), 16, 32, 32))
    assert ["TMA needs q's base and B/H/N strides 16-byte aligned and nonzero, got "
                        "strides (2304, 1152, 36, 1) of 2-byte elements"] == problems[-1:]


def test_auto_takes_tma_only_from_a_measured_table(monkeypatch):
    """Never in auto's fixed order; where a table ranks it first but it refuses the call (here
    fp32), auto goes on to the next measured backend."""
    from mmspec.kernels.backends import timings

    q, k, v, mask = make_case(0, 1, 2, 2, 32, 32, 64, (16, 16), torch.bfloat16)
    if torch.cuda.is_available():
        q, k, v, mask = q.cuda(), k.cuda(), v.cuda(), mask.to("cuda")
    assert resolve_backend("auto", q, k, v, mask).name in ("torch", "triton")
    monkeypatch.setattr(timings, "ranking", lambda q, mask: ("triton-tma", "triton"))
    assert resolve_backend("auto", q, k, v, mask).name == "triton-tma"
    assert resolve_backend("auto", q.float(), k.float(), v.float(), mask).name == "triton"


def test_host_descriptors_and_grids():
    q = torch.zeros(2, 12, 40, 64, dtype=torch.bfloat16).transpose(1, 2)  # [B, H=40, N=12, D]
    k = v = torch.zeros(2, 4, 70, 64, dtype=torch.bfloat16)
    dq, dk, dv, do = triton_tma.descriptors(q, k, v, q, 64, 32, 64)
    assert dq.shape == [2, 40, 12, 64] and dq.strides == list(q.stride())
    assert dq.block_shape == do.block_shape == [1, 1, 64, 64]
    assert dk.block_shape == dv.block_shape == [1, 1, 32, 64] and dk.shape == [2, 4, 70, 64]
    config = (64, 32, 4, 2, False)
    assert triton_tma.grid(config, q, persistent=False) == (1, 80)
    assert triton_tma.grid(config, q, persistent=True) == (triton_tma.INTERPRET_PROGRAMS,)
    assert triton_tma.grid(config, q[:1, :1], persistent=True) == (1,)  # one tile, one program
