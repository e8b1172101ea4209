"""DraftAttention under diffusers' Ulysses context parallelism (`mmspec/video_dit/ulysses.py`):
two gloo processes on the CPU give the single process's output and densities."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mmspec.video_dit import DraftAttentionConfig, apply_draft_attention, generate
from mmspec.video_dit.ulysses import _from_model_order, _to_model_order

from .tiny import tiny_cogvideox, tiny_wan, tiny_wan_pipeline
from .ulysses_worker import CASES, GENERATE_ARGS, run_case

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_wan")
    tiny_wan_pipeline().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, pipeline):
    out = tmp_path_factory.mktemp("ulysses")
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "tests.video_dit.ulysses_worker", str(out), str(pipeline)],
        capture_output=True, text=True, timeout=400, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    # the transformers went parallel (diffusers warns; one process alone would wait forever in
    # the other's all-to-all)
    assert "`enable_parallelism` is an experimental feature" in run.stderr
    return out, run.stdout


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_give_the_single_process_output(two_processes, name):
    two_processes, _ = two_processes
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


def test_generate_context_parallel_makes_the_single_process_video(two_processes, pipeline,
                                                                  tmp_path):
    """`generate --context-parallel 2`: the two processes make the video together (Ulysses), the
    first writes it, and it is the single process's video."""
    from PIL import Image

    two_processes, printed = two_processes
    together, alone = two_processes / "video", tmp_path / "alone"
    assert printed.count("1 of 1 videos in") == 1
    prompts = two_processes / "prompts.txt"
    assert generate.main(["--model", str(pipeline), "--prompts", str(prompts), "--out",
                          str(alone), *GENERATE_ARGS]) == 0
    assert sorted(p.name for p in together.iterdir()) == ["0000.json", "0000.mp4", "0000.png"]
    meta, single = (json.loads((d / "0000.json").read_text()) for d in (together, alone))
    assert (meta["process"], meta["processes"], meta["context_parallel"]) == (0, 2, 2)
    assert meta["density"]["by_step"] == pytest.approx(single["density"]["by_step"], abs=1e-6)
    assert meta["density"]["by_step"]["2"] < 1.0
    first = [np.asarray(Image.open(d / "0000.png"), dtype=int) for d in (together, alone)]
    assert np.abs(first[0] - first[1]).max() <= 1  # fp32 sums in another order, then uint8


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
