"""DraftAttention under diffusers' Ulysses context parallelism (`mmspec/video_dit/ulysses.py`):
two gloo processes on the CPU give the single process's output and densities."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmspec.video_dit import DraftAttentionConfig, apply_draft_attention
from mmspec.video_dit.ulysses import _from_model_order, _to_model_order

from .tiny import tiny_cogvideox, tiny_wan
from .ulysses_worker import CASES, run_case

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    out = tmp_path_factory.mktemp("ulysses")
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "tests.video_dit.ulysses_worker", str(out)],
        capture_output=True, text=True, timeout=400, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_give_the_single_process_output(two_processes, name):
    torch.set_num_threads(1)
    single = run_case(name, None)
    assert single["densities"][-1] < 1.0  # the second forward is sparse
    for rank in (0, 1):
        ranked = torch.load(two_processes / f"{name}-rank{rank}.pt")
        for got, want in zip(ranked["outputs"], single["outputs"], strict=True):
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
        # every rank reports the whole model's density (and calibrated sparsity)
        assert ranked["densities"] == pytest.approx(single["densities"], abs=1e-6)
        assert ranked["mean_density"] == pytest.approx(single["mean_density"], abs=1e-6)
        assert ranked["sparsity"] == pytest.approx(single["sparsity"], abs=1e-6)


@pytest.mark.parametrize("text_first", [False, True])
def test_model_order_round_trip(text_first):
    # 2 ranks, each [5 video, 2 text] (or [2 text, 5 video]): after the all-to-all the sequence
    # is the ranks' one after another; the model's order has all video, then all text
    video, text = torch.arange(10.0), 100 + torch.arange(4.0)
    local = [torch.cat([text[2 * r:2 * r + 2], video[5 * r:5 * r + 5]] if text_first else
                       [video[5 * r:5 * r + 5], text[2 * r:2 * r + 2]]) for r in (0, 1)]
    gathered = torch.cat(local)[None, None, :, None]  # [1, 1, 14, 1]
    ordered = _to_model_order(gathered, 2, 2, text_first)
    expected = torch.cat([text, video] if text_first else [video, text])
    assert ordered.flatten().tolist() == expected.tolist()
    assert torch.equal(_from_model_order(ordered, 2, 2, text_first), gathered)


def _context_parallel(ring=1, ulysses=1, anything=False):
    # what enable_parallelism records (building it for real needs torch.distributed)
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig

    return ParallelConfig(context_parallel_config=ContextParallelConfig(
        ring_degree=ring, ulysses_degree=ulysses, ulysses_anything=anything))


@torch.no_grad()
def test_ring_attention_is_refused_naming_ulysses():
    model = tiny_wan()
    model._parallel_config = _context_parallel(ring=2)
    message = (r"^DraftAttention on a WanTransformer3DModel with ring attention \(ring_degree=2\)"
               r".*use Ulysses instead, ContextParallelConfig\(ulysses_degree=2\)$")
    with pytest.raises(NotImplementedError, match=message):
        apply_draft_attention(model, DraftAttentionConfig(dense_steps=0))
    model._parallel_config = None
    apply_draft_attention(model, DraftAttentionConfig(dense_steps=0, tile=(2, 2)))
    model._parallel_config = _context_parallel(ring=2)  # enabled afterwards
    with pytest.raises(NotImplementedError, match=message):
        model(torch.randn(1, 4, 2, 8, 8), torch.tensor([900]), torch.randn(1, 3, 16))


def test_uneven_shards_and_cogvideox_are_refused():
    model = tiny_wan()
    model._parallel_config = _context_parallel(ulysses=2, anything=True)
    with pytest.raises(NotImplementedError, match=r"ulysses_anything=True: uneven shards"):
        apply_draft_attention(model, DraftAttentionConfig(dense_steps=0))
    # diffusers' CogVideoX attention calls SDPA itself: no Ulysses all-to-all to join
    cog = tiny_cogvideox()
    cog._parallel_config = _context_parallel(ulysses=2)
    with pytest.raises(NotImplementedError, match=r"CogVideoXTransformer3DModel with context "
                                                  r"parallelism: its attention processors take"):
        apply_draft_attention(cog, DraftAttentionConfig(dense_steps=0))
