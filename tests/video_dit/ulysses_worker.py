"""One process of `test_ulysses.py`'s two-process run (launched by torchrun): DraftAttention
under diffusers' Ulysses context parallelism (`enable_parallelism`), gloo on the CPU.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        -m tests.video_dit.ulysses_worker OUT PIPELINE

Each case runs two transformer forwards (a dense warm-up step, then a sparse one) and every
rank saves its outputs and densities to OUT/{case}-rank{r}.pt. The test runs the same cases in
one process (`run_case(name, None)`) and compares. Then the batch script makes one video of the
Wan `PIPELINE` folder across the two processes (`--context-parallel 2`, `GENERATE_ARGS`) into
OUT/video, as `torchrun -m mmspec.video_dit.generate` would (one launch for both: each costs
seconds of imports).
"""

import sys
from pathlib import Path

import torch

from mmspec.video_dit import DraftAttentionConfig, apply_draft_attention

from .tiny import tiny_hunyuan, tiny_wan


def hunyuan_cp_plan():
    """A context-parallel plan for HunyuanVideo (diffusers 0.42 ships none): the video and text
    tokens split after their embedders, the RoPE tables alike, the video gathered after
    `proj_out`. Exact for prompts without padding (the model builds its text mask from the
    local token counts)."""
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    split = ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)
    table = ContextParallelInput(split_dim=0, expected_dims=2, split_output=True)
    return {"x_embedder": {0: split}, "context_embedder": {0: split},
            "rope": {0: table, 1: table},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}


def _wan_inputs(batch):
    g = torch.Generator().manual_seed(11)
    # 2 frames of 4 x 4 tokens (8 tiles of 2 x 2); 16 tokens a rank
    return (torch.randn(batch, 4, 2, 8, 8, generator=g), torch.randn(batch, 3, 16, generator=g))


def _hunyuan_inputs(batch):
    g = torch.Generator().manual_seed(12)
    # 2 frames of 4 x 6 tokens (tiles of 2 x 2) and 6 text tokens, none padding: a rank holds
    # 24 video tokens and 3 text tokens, so the all-to-all interleaves video and text
    return (torch.randn(batch, 4, 2, 4, 6, generator=g), torch.randn(batch, 6, 16, generator=g),
            torch.ones(batch, 6, dtype=torch.bool), torch.randn(batch, 8, generator=g),
            torch.full((batch,), 3000.0))


CONFIG = dict(sparsity=0.5, tile=(2, 2), dense_steps=1, dense_layers=1)
# name: (family, CFG batch, DraftAttention applied before enable_parallelism, config)
CASES = {
    "wan_cfg": ("wan", 2, False, CONFIG),
    # calibration: each rank probes its heads, the layer's sparsity is the mean over all heads
    "wan_calibrated": ("wan", 1, True, {**CONFIG, "calibrate": True, "mass": 0.5,
                                         "max_density": 0.9}),
    "hunyuan_cfg": ("hunyuan", 2, True, {**CONFIG, "mode": "row"}),
    # top_p: each head keeps its own number of blocks, so the ranks' densities differ
    "hunyuan": ("hunyuan", 1, False, {**CONFIG, "mode": "top_p", "mass": 0.6,
                                      "max_density": 0.9}),
}


def run_case(name: str, mesh) -> dict:
    """Two forwards of case `name`; with `mesh` (dims ("ring", "ulysses")) under Ulysses."""
    from diffusers import ContextParallelConfig

    family, batch, before, config = CASES[name]
    if family == "wan":
        model, plan = tiny_wan(seed=3), None
        latents, text = _wan_inputs(batch)
        forward = lambda t: model(latents, torch.full((batch,), t), text, return_dict=False)[0]
    else:
        model, plan = tiny_hunyuan(seed=4, num_layers=2, num_single_layers=1), hunyuan_cp_plan()
        latents, text, mask, pooled, guidance = _hunyuan_inputs(batch)
        forward = lambda t: model(latents, torch.full((batch,), t), text, mask, pooled, guidance,
                                  return_dict=False)[0]
    apply = lambda: apply_draft_attention(model, DraftAttentionConfig(**config))
    state = apply() if before or mesh is None else None
    if mesh is not None:
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2, mesh=mesh),
                                 cp_plan=plan)
        state = state or apply()
    with torch.no_grad():
        outputs = [forward(t) for t in (900, 800)]
    # clone: under Ulysses the gathered output is an AsyncCollectiveTensor, which torch.load
    # refuses; a clone is a plain tensor
    return {"outputs": [out.clone() for out in outputs], "mean_density": state.mean_density(),
            "densities": [r.density for r in state.records],
            "sparsity": state.layer_sparsity()}


GENERATE_ARGS = ["--steps", "3", "--height", "64", "--width", "64", "--frames", "5", "--dtype",
                 "float32", "--tile", "2", "2", "--guidance", "2.0", "--sparsity", "0.5",
                 "--dense-steps", "1"]


def main(out: Path, pipeline: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    # diffusers places rank r on accelerator r % device_count(), 0 on a CPU machine
    device_count, torch.accelerator.device_count = torch.accelerator.device_count, lambda: 1
    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("ring", "ulysses"))
    for name in CASES:
        torch.save(run_case(name, mesh), out / f"{name}-rank{dist.get_rank()}.pt")
    from mmspec.video_dit import generate

    torch.accelerator.device_count = device_count  # the script deals with it itself

    (out / "prompts.txt").write_text("a red cat\n")
    generate.main(["--model", str(pipeline), "--prompts", str(out / "prompts.txt"), "--out",
                   str(out / "video"), *GENERATE_ARGS, "--context-parallel", "2"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
