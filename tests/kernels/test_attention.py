"""Backends against an fp32 reference, with flash-attention's criterion: a backend's max error is at
most 2x that of a same-precision PyTorch implementation (SDPA in the input dtype)."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mmspec.kernels import BlockSparseMask, available_backends, block_sparse_attention, causal_block_mask

from mmspec.kernels.backends import torch_blocks
from mmspec.kernels.backends.registry import get_backend

# "torch" runs small cases as masked dense attention; "torch-fused" forces the fused CPU kernel
# and "torch-batched" the batched-matmul path; "flex" is FlexAttention (eager on the CPU)
BACKENDS = ["torch", "torch-fused", "torch-batched", "triton", "flex"]
# floor for fp32, where the same-precision error is itself ~1e-7
FLOOR = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def make_case(seed, b, hq, hkv, nq, nk, d, bs, dtype, mask_b=None, mask_h=None, kind="token"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, nk, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, nk, d, generator=g).to(dtype)
    mb, mh = mask_b or b, mask_h or hq
    if kind == "token":  # full, partial and empty blocks, and empty rows
        token = torch.rand(mb, mh, nq, nk, generator=g) < 0.5
        token[..., : bs[0], :] = True
        token[..., 3, :] = False
        mask = BlockSparseMask.from_token_mask(token, bs)
    else:
        blocks = torch.rand(mb, mh, math.ceil(nq / bs[0]), math.ceil(nk / bs[1]), generator=g) < 0.4
        blocks[..., -1, :] = False  # an all-empty query block
        mask = BlockSparseMask.from_dense(blocks, bs, nq, nk)
    return q, k, v, mask


@pytest.fixture
def run_backend(monkeypatch):
    """Calls a backend, or one path of the torch backend (see BACKENDS)."""

    def run(backend, q, k, v, mask, **kwargs):
        if backend in ("torch-fused", "torch-batched"):
            monkeypatch.setattr(torch_blocks, "_SMALL_PAIRS", 0)
            if backend == "torch-batched":
                monkeypatch.setattr(torch_blocks, "_cpu_kernel", lambda: None)
            backend = "torch"
        if backend in ("triton", "flex") and torch.cuda.is_available():  # compiled
            q, k, v, mask = q.cuda(), k.cuda(), v.cuda(), mask.to("cuda")
            problems = get_backend(backend).problems(q, k, v, mask)
            if problems:  # the GPU kernel refuses this case by its constraints (a head dim)
                pytest.skip(f"{backend} on the GPU: {'; '.join(problems)}")
            result = block_sparse_attention(q, k, v, mask, backend=backend, **kwargs)
            return tuple(t.cpu() for t in result) if isinstance(result, tuple) else result.cpu()
        return block_sparse_attention(q, k, v, mask, backend=backend, **kwargs)

    return run


def sdpa_same_precision(q, k, v, mask):
    group = q.shape[1] // k.shape[1]
    dense = mask.to_dense()
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1),
                                         v.repeat_interleave(group, 1), attn_mask=dense)
    return torch.where(dense.any(-1, keepdim=True), out, 0)


CASES = [
    # seed, B, Hq, Hkv, Nq, Nk, D, block, mask B, mask H, kind
    (0, 1, 2, 2, 64, 64, 64, (32, 32), None, None, "token"),
    (1, 2, 4, 2, 50, 90, 64, (16, 32), 1, None, "token"),  # GQA, ragged tails, batch broadcast
    (2, 1, 2, 1, 40, 70, 128, (16, 16), 1, 1, "blocks"),  # MQA, full broadcast, D=128
    (3, 2, 2, 2, 33, 33, 40, (16, 16), None, 1, "token"),  # odd head dim, head broadcast
    (5, 1, 2, 2, 200, 256, 128, (128, 128), None, None, "blocks"),  # video DiT blocks and D
    # DraftAttention's query tiles: query blocks of whole key blocks, ragged tails
    (6, 2, 2, 2, 112, 120, 64, (32, 16), None, None, "blocks"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"case{c[0]}")
def test_backend_error_budget(run_backend, backend, dtype, case):
    q, k, v, mask = make_case(*case[:8], dtype, *case[8:])
    out, lse = run_backend(backend, q, k, v, mask, return_lse=True)
    ref, ref_lse = block_sparse_attention(q.float(), k.float(), v.float(), mask,
                                          backend="reference", return_lse=True)
    assert out.dtype == dtype and out.shape == q.shape
    assert not out.isnan().any() and not lse.isnan().any()
    err = (out.float() - ref).abs().max().item()
    err_pt = (sdpa_same_precision(q, k, v, mask).float() - ref).abs().max().item()
    assert err <= max(2 * err_pt, FLOOR[dtype]), (err, err_pt)
    empty = ~mask.to_dense().expand(q.shape[0], q.shape[1], -1, -1).any(-1)
    assert torch.equal(lse.isinf(), empty) and torch.equal(ref_lse.isinf(), empty)
    assert (out[empty] == 0).all()
    assert (lse - ref_lse)[~empty].abs().max() < 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
def test_transposed_inputs(run_backend, backend):
    """HF attention passes q/k/v as transposed views of [B, N, H, D]."""
    q, k, v, mask = make_case(11, 2, 2, 2, 32, 32, 16, (16, 16), torch.float32)
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert not qt.is_contiguous()
    torch.testing.assert_close(run_backend(backend, qt, kt, vt, mask),
                               block_sparse_attention(q, k, v, mask, backend="reference"),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["stepped", "stored transposed", "expanded"])
@pytest.mark.parametrize("full", [False, True])
def test_head_dims_of_any_stride(layout, full):
    # PyTorch's raw CPU flash op (the torch backend's small and all-full paths) assumes a unit
    # stride along D: a stepped slice, a [.., D, N] store or an expanded D gave errors of ~1,
    # up to reads past the tensor (DraftAttention's mean-keys fallback passes an expanded v)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for n in (24, 40, 40))
    if layout == "stepped":
        q = torch.randn(1, 2, 24, 16, generator=g)[..., ::2]
    elif layout == "stored transposed":
        q = torch.randn(1, 2, 8, 24, generator=g).transpose(2, 3)
    else:
        v = torch.randn(1, 2, 40, 1, generator=g).expand(1, 2, 40, 8)
    assert q.stride(-1) != 1 or v.stride(-1) != 1
    tokens = torch.ones(1, 1, 24, 40, dtype=torch.bool)
    if not full:
        tokens = torch.rand(1, 1, 24, 40, generator=g) < 0.6
        tokens[..., 0] = True
    mask = BlockSparseMask.from_token_mask(tokens, 16)
    ref = block_sparse_attention(q.contiguous(), k, v.contiguous(), mask, backend="reference")
    torch.testing.assert_close(block_sparse_attention(q, k, v, mask, backend="torch"), ref,
                               atol=1e-5, rtol=1e-5)


def test_reference_matches_plain_softmax():
    q, k, v, mask = make_case(5, 1, 2, 2, 24, 40, 16, (16, 16), torch.float32)
    dense = mask.to_dense()
    scores = (q @ k.transpose(-1, -2)) / 4.0
    probs = torch.softmax(scores.masked_fill(~dense, float("-inf")), -1).nan_to_num(0.0)
    out = block_sparse_attention(q, k, v, mask, backend="reference")
    torch.testing.assert_close(out, probs @ v)


def test_dense_mask_fast_path_matches_reference():
    q, k, v, _ = make_case(6, 1, 4, 2, 70, 70, 32, (32, 32), torch.float32)
    mask = BlockSparseMask.from_dense(torch.ones(1, 1, 3, 3, dtype=torch.bool), 32, 70, 70)
    assert mask.is_dense
    out, lse = block_sparse_attention(q, k, v, mask, backend="torch", return_lse=True)
    ref, ref_lse = block_sparse_attention(q, k, v, mask, backend="reference", return_lse=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


def softcapped_attention(q, k, v, mask, softcap):
    """Gemma 2's eager attention: logits scaled, soft-capped, masked, softmaxed (fp32)."""
    dense = mask.to_dense()
    group = q.shape[1] // k.shape[1]
    keys = k.float().repeat_interleave(group, 1)
    scores = q.float() @ keys.transpose(-1, -2) * q.shape[-1] ** -0.5
    scores = torch.tanh(scores / softcap) * softcap
    probs = torch.softmax(scores.masked_fill(~dense, float("-inf")), -1).nan_to_num(0.0)
    return probs @ v.float().repeat_interleave(group, 1)


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
@pytest.mark.parametrize("case", [CASES[1], CASES[4]], ids=lambda c: f"case{c[0]}")
def test_softcap_matches_gemma2_attention(run_backend, backend, case):
    q, k, v, mask = make_case(*case[:8], torch.float32, *case[8:])
    q = q * 4  # logits of tens, where a cap of 5 changes the softmax a lot
    expect = softcapped_attention(q, k, v, mask, 5.0)
    out, lse = run_backend(backend, q, k, v, mask, softcap=5.0, return_lse=True)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expect, atol=2e-5, rtol=2e-5)
    plain = run_backend(backend, q, k, v, mask)
    assert (plain - expect).abs().max() > 0.1  # the cap is not ignored


def test_softcap_on_a_dense_mask_leaves_the_flash_path():
    # PyTorch's CPU flash attention (the dense-mask fast path) cannot soft-cap
    q, k, v, _ = make_case(6, 1, 4, 2, 70, 70, 32, (32, 32), torch.float32)
    q = q * 4
    mask = BlockSparseMask.from_dense(torch.ones(1, 1, 3, 3, dtype=torch.bool), 32, 70, 70)
    out = block_sparse_attention(q, k, v, mask, backend="torch", softcap=5.0)
    torch.testing.assert_close(out, softcapped_attention(q, k, v, mask, 5.0), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("softcap", [0, -1.0, float("inf"), float("nan"), "50", True,
                                     np.float32(-1.0), torch.tensor(0.0), torch.ones(2),
                                     torch.tensor(True)])
def test_rejects_bad_softcap(softcap):
    q, k, v, mask = make_case(0, 1, 2, 2, 16, 16, 16, (16, 16), torch.float32)
    with pytest.raises(ValueError, match="softcap must be None or a positive finite number"):
        block_sparse_attention(q, k, v, mask, softcap=softcap)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "0.1", True, torch.ones(2),
                                   torch.tensor(True), np.float64("nan")])
def test_rejects_bad_scale(scale):  # a NaN scale gave an all-NaN output without a word
    q, k, v, mask = make_case(0, 1, 2, 2, 16, 16, 16, (16, 16), torch.float32)
    with pytest.raises(ValueError, match="scale must be None .* or a finite number"):
        block_sparse_attention(q, k, v, mask, scale=scale)


def test_a_numpy_or_tensor_scale_is_a_number():
    q, k, v, mask = make_case(0, 1, 2, 2, 16, 16, 16, (16, 16), torch.float32)
    ref = block_sparse_attention(q, k, v, mask, scale=0.3)
    for scale in (np.float32(0.3), torch.tensor(0.3)):
        torch.testing.assert_close(block_sparse_attention(q, k, v, mask, scale=scale), ref)


def test_a_numpy_or_tensor_softcap_is_a_number():
    # softcap took only int and float: np.float32(5.0) (a config read with NumPy) was refused
    q, k, v, mask = make_case(0, 1, 2, 2, 16, 16, 16, (16, 16), torch.float32)
    q = q * 4
    ref = block_sparse_attention(q, k, v, mask, softcap=5.0)
    assert (ref - block_sparse_attention(q, k, v, mask)).abs().max() > 0.1  # the cap matters
    for softcap in (5, np.float32(5.0), np.int64(5), torch.tensor(5.0), torch.tensor([5.0])):
        out = block_sparse_attention(q, k, v, mask, softcap=softcap)
        torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_bottom_right_matches_sdpa(run_backend, backend):
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, n, 32, generator=g) for n in (20, 52, 52))
    mask = causal_block_mask(20, 52, 16)
    expect = F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.ones(20, 52, dtype=torch.bool).tril(32))
    torch.testing.assert_close(run_backend(backend, q, k, v, mask), expect,
                               atol=1e-5, rtol=1e-5)


def test_agrees_with_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v, mask = make_case(8, 1, 2, 2, 48, 80, 32, (16, 16), torch.float32)
    flex = flex_attention(q, k, v, block_mask=mask.to_flex())
    ours = block_sparse_attention(q, k, v, mask)
    rows = mask.to_dense().any(-1)  # flex leaves fully masked rows undefined
    torch.testing.assert_close(ours[rows], flex[rows], atol=1e-5, rtol=1e-5)


def test_custom_op_passes_through_torch_compile():
    q, k, v, mask = make_case(9, 1, 2, 2, 32, 32, 16, (16, 16), torch.float32)

    def fn(q, k, v):
        return block_sparse_attention(q * 2, k, v, mask) + 1

    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), fn(q, k, v))


def test_the_fake_op_promises_the_real_ops_strides():
    """inductor checks the real output against the fake's strides: with a transposed q (as the
    DraftAttention processors pass it) `empty_like(q)` promised q's strides and a compiled Wan
    crashed at its first sparse step."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v, mask = make_case(9, 1, 2, 2, 32, 32, 16, (16, 16), torch.float32)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, H, N, D] view of [B, N, H, D]
    real = torch.ops.mmspec.block_sparse_attention(
        q, k, v, mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks,
        mask.full_kv_indices, mask.partial_masks, 16, 16, 0.25, 0.0, "reference")
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = torch.ops.mmspec.block_sparse_attention(
            mode.from_tensor(q), mode.from_tensor(k), mode.from_tensor(v), mask.kv_num_blocks,
            mask.kv_indices, mask.full_kv_num_blocks, mask.full_kv_indices, mask.partial_masks,
            16, 16, 0.25, 0.0, "reference")
    assert [t.stride() for t in fake] == [t.stride() for t in real]


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                    reason="the fused CPU kernel needs AVX2")
def test_fused_cpu_kernel_builds_here():
    # a silent fallback to the slower batched path would go unnoticed otherwise
    assert torch_blocks._cpu_kernel() is not None


def test_each_environment_builds_the_cpu_kernel_in_its_own_folder(monkeypatch):
    # two virtual environments shared one folder (keyed by the kernel source only) and rebuilt
    # it for each other in turn, silently: torch's ninja file records its include paths
    name, _, build_dir = torch_blocks._kernel_build_paths()
    monkeypatch.setattr(sys, "prefix", "/elsewhere/.venv")
    other_name, _, other_dir = torch_blocks._kernel_build_paths()
    assert other_name != name and other_dir != build_dir
    assert other_name.split("_")[:-1] == name.split("_")[:-1]  # the same kernel source


_LOAD = ("from mmspec.kernels.backends.torch_blocks import _cpu_kernel; "
         "assert _cpu_kernel() is not None; print('loaded')")


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512")
                    or not hasattr(__import__("os"), "fork"), reason="the fused CPU kernel, POSIX")
def test_fused_cpu_kernel_loads_after_a_killed_build():
    # a build killed mid-way leaves torch's `lock` file behind, which torch waits on forever (a
    # crashed browser test hung every later process this way); the next load must not hang
    assert torch_blocks._cpu_kernel() is not None
    _, _, build_dir = torch_blocks._kernel_build_paths()
    lock = build_dir / "lock"
    lock.touch()  # fresh, as a build killed a second ago leaves it
    run = subprocess.run([sys.executable, "-c", _LOAD], capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0 and "loaded" in run.stdout, run.stderr
    assert not lock.exists()


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512")
                    or not hasattr(__import__("os"), "fork"), reason="the fused CPU kernel, POSIX")
def test_fused_cpu_kernel_load_waits_for_a_live_build():
    # the other side: while another process builds (it holds the flock), a load waits for it
    # instead of taking its lock for a stale one
    assert torch_blocks._cpu_kernel() is not None
    name, _, build_dir = torch_blocks._kernel_build_paths()
    with torch_blocks._build_lock(build_dir.parent / f"{name}.flock"):
        proc = subprocess.Popen([sys.executable, "-c", _LOAD], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            line = ""
            while "waiting for another process" not in line:
                line = proc.stderr.readline()
                assert line, "the load finished without waiting for the live build"
            assert proc.poll() is None
        except BaseException:
            proc.kill()
            raise
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0 and "loaded" in out, err


def test_auto_never_picks_the_triton_interpreter_on_cpu(monkeypatch):
    q, k, v, mask = make_case(12, 1, 2, 2, 32, 32, 16, (16, 16), torch.float32)
    from mmspec.kernels.backends import registry

    assert registry.resolve_backend("auto", q, k, v, mask).name == "torch"


def test_registry_lists_backends():
    assert {"reference", "torch", "triton", "flex"} <= set(available_backends())


# ------------------------------------------------------------------------------------ bad input


@pytest.fixture
def case():
    return make_case(10, 1, 2, 2, 32, 32, 16, (16, 16), torch.float32)


def test_rejects_shape_mismatch(case):
    q, k, v, mask = case
    with pytest.raises(ValueError, match="must have the same \\[B, H, N\\]"):
        block_sparse_attention(q, k, v[:, :, :-1], mask)
    with pytest.raises(ValueError, match="4-D"):
        block_sparse_attention(q[0], k, v, mask)
    with pytest.raises(ValueError, match="multiple of k/v heads"):
        block_sparse_attention(torch.randn(1, 3, 32, 16), k, v, mask)


def test_rejects_no_heads_or_head_dim(case):
    # these divided by zero (`integer modulo by zero`, `0.0 cannot be raised to a negative power`)
    _, _, _, mask = case
    for shape in ((1, 0, 32, 16), (1, 2, 32, 0)):
        q = torch.randn(shape)
        with pytest.raises(ValueError, match=r"q must have at least one head and a head dim "
                                             r"D > 0, got shape \(1, \d, 32, \d+\)"):
            block_sparse_attention(q, q, q, mask)
    kv = torch.randn(1, 0, 32, 16)
    with pytest.raises(ValueError, match=r"k/v must have at least one head, got shape "
                                         r"\(1, 0, 32, 16\)"):
        block_sparse_attention(torch.randn(1, 2, 32, 16), kv, kv, mask)


def test_rejects_mask_for_other_lengths(case):
    q, k, v, mask = case
    with pytest.raises(ValueError, match="mask is for q_len=32, kv_len=32"):
        block_sparse_attention(q[:, :, :20], k, v, mask)


def test_rejects_dtypes(case):
    q, k, v, mask = case
    with pytest.raises(TypeError, match="share a dtype"):
        block_sparse_attention(q.half(), k, v, mask)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        block_sparse_attention(q.double(), k.double(), v.double(), mask)
    with pytest.raises(TypeError, match="BlockSparseMask"):
        block_sparse_attention(q, k, v, mask.to_dense())


def test_rejects_mixed_devices(case):
    q, k, v, mask = case
    with pytest.raises(ValueError, match="one device"):
        block_sparse_attention(q.to("meta"), k.to("meta"), v.to("meta"), mask)


def test_rejects_mask_heads(case):
    q, k, v, _ = case
    mask = BlockSparseMask.from_dense(torch.ones(1, 3, 2, 2, dtype=torch.bool), 16, 32, 32)
    with pytest.raises(ValueError, match="batch/head"):
        block_sparse_attention(q, k, v, mask)


def test_rejects_unknown_or_unfit_backend(case):
    q, k, v, mask = case
    with pytest.raises(ValueError, match="backend must be"):
        block_sparse_attention(q, k, v, mask, backend="cuda")
    odd = BlockSparseMask.from_dense(torch.ones(1, 1, 4, 4, dtype=torch.bool), 8, 32, 32)
    with pytest.raises(ValueError, match="powers of two"):
        block_sparse_attention(q, k, v, odd, backend="triton")


@pytest.mark.parametrize("bq,bk", [(16, 16), (32, 128), (128, 128), (256, 64)])
@pytest.mark.parametrize("block_d", [16, 64, 128, 256])
def test_triton_launch_configs_tile_the_blocks(bq, bk, block_d):
    from mmspec.kernels.backends import triton_kernel

    for block_m, block_n, warps, stages in triton_kernel.launch_configs(bq, bk, block_d):
        assert bq % block_m == 0 and bk % block_n == 0 and block_m >= 16 and block_n >= 16
        assert warps in (4, 8) and stages in (1, 2, 3)


def test_triton_falls_back_when_a_config_is_out_of_resources(run_backend, monkeypatch):
    """A GPU with less shared memory than the fast config needs gets the smaller one, remembered
    for later calls; when every config fails the error reaches the caller."""
    from mmspec.kernels.backends import triton_kernel

    q, k, v, mask = make_case(4, 1, 2, 2, 128, 128, 128, (128, 128), torch.bfloat16, kind="blocks")
    fast, safe = triton_kernel.launch_configs(128, 128, 128)[:2]
    real, tried = triton_kernel._launch, []

    def launch(config, *args):
        tried.append(config)
        if config == fast:
            raise triton_kernel._OUT_OF_RESOURCES(262144, 232448, "shared memory")
        return real(config, *args)

    monkeypatch.setattr(triton_kernel, "_launch", launch)
    monkeypatch.setattr(triton_kernel, "_CHOSEN", {})
    out = run_backend("triton", q, k, v, mask)
    assert tried == [fast, safe]
    torch.testing.assert_close(out, run_backend("torch", q, k, v, mask), atol=2e-2, rtol=2e-2)
    run_backend("triton", q, k, v, mask)
    assert tried == [fast, safe, safe]  # the working config is remembered

    monkeypatch.setattr(triton_kernel, "_CHOSEN", {})
    monkeypatch.setattr(triton_kernel, "launch_configs", lambda *_: [fast])
    with pytest.raises(triton_kernel._OUT_OF_RESOURCES):
        run_backend("triton", q, k, v, mask)


@pytest.mark.parametrize("backend", ["torch", "torch-fused", "torch-batched", "reference"])
def test_backward_is_refused_on_every_path(backend, run_backend):
    # the op is forward-only: backward used to give gradients on one path, None on another and
    # an in-place error on a third
    q, k, v, mask = make_case(3, 1, 2, 2, 64, 64, 16, (16, 16), torch.float32)
    q.requires_grad_(True)
    out = run_backend(backend, q, k, v, mask)
    with pytest.raises(NotImplementedError, match="block_sparse_attention is forward-only"):
        out.sum().backward()


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_compiled_forward_with_inputs_that_require_grad(which):
    # torch.compile traces the backward of such a call: one that raised at once failed the
    # compilation of a forward that eager mode runs (a compiled model outside no_grad); and a
    # raising node for q alone was dropped when only k or v needed a gradient (it ran, silently)
    torch._dynamo.reset()
    lin = torch.nn.Linear(16, 16)
    q, k, v, mask = make_case(4, 1, 2, 2, 40, 40, 16, (16, 16), torch.float32)

    def f(x):
        args = [q, k, v]
        args["qkv".index(which)] = lin(x)
        return block_sparse_attention(*args, mask)

    try:
        out = torch.compile(f, backend="aot_eager")(q)
        torch.testing.assert_close(out, f(q))
        with pytest.raises(NotImplementedError, match="block_sparse_attention is forward-only"):
            out.sum().backward()
        assert lin.weight.grad is None
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_mask_tensors(run_backend, backend):
    """The Triton kernel steps through index lists and element masks assuming contiguous rows:
    a mask built from transposed views read other blocks' ids and elements."""
    q, k, v, mask = make_case(13, 1, 2, 2, 64, 64, 16, (16, 16), torch.float32)
    assert mask.kv_indices.shape[-1] > 1 and mask.full_kv_indices.shape[-1] > 1

    def strided(t, dims):  # the same values, laid out with `dims` swapped
        return t.transpose(*dims).contiguous().transpose(*dims)

    odd = BlockSparseMask(
        strided(mask.kv_num_blocks, (1, 2)), strided(mask.kv_indices, (-1, -2)),
        strided(mask.full_kv_num_blocks, (1, 2)), strided(mask.full_kv_indices, (-1, -2)),
        strided(mask.partial_masks, (-1, -2)), mask.block_size, mask.q_len, mask.kv_len)
    assert not (odd.kv_indices.is_contiguous() or odd.partial_masks.is_contiguous())
    torch.testing.assert_close(run_backend(backend, q, k, v, odd),
                               block_sparse_attention(q, k, v, mask, backend="reference"),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dv", [24, 48])
@pytest.mark.parametrize("backend", ["torch", "reference", "flex"])
def test_value_head_dim_differs(backend, dv):
    """MLA models (DeepSeek-V2/V3) attend with values of another width than the keys: every
    backend gives masked attention with the keys' scale, `[..., Dv]` out."""
    q, k, _, mask = make_case(7, 1, 2, 2, 40, 56, 32, (16, 16), torch.float32)
    v = torch.randn(1, 2, 56, dv, generator=torch.Generator().manual_seed(8))
    out, lse = block_sparse_attention(q, k, v, mask, backend=backend, return_lse=True)
    dense = mask.to_dense()
    scores = (q @ k.transpose(-1, -2) * 32 ** -0.5).masked_fill(~dense, float("-inf"))
    expect = torch.nan_to_num(scores.softmax(-1)) @ v
    assert out.shape == (1, 2, 40, dv)
    torch.testing.assert_close(out, expect, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, scores.logsumexp(-1))


@pytest.mark.parametrize("n", [40, 700])  # masked dense, and the fused CPU kernel's blocks
def test_head_dim_512_on_the_cpu(n):
    """Gemma 4's global layers use head dim 512 (issue 29): the torch backend refused D > 256."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 512) for _ in range(3))
    out = block_sparse_attention(q, k, v, causal_block_mask(n, n, 64), backend="torch")
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
