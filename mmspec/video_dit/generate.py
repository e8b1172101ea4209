"""Batch text-to-video with or without DraftAttention (arXiv 2505.14708), resumable, multi-GPU.

    python -m mmspec.video_dit.generate --model PATH --prompts prompts.txt --out DIR
        [--sparsity 0.9 | --dense] [--steps 50] [--seed 42] [--compile [BACKEND]]

For prompt number i (one prompt per non-empty line; lines starting with '#' are skipped; a `.jsonl`
file gives `{"prompt": ..., "image": path}` per line for image-to-video pipelines) it writes
`DIR/{i:04d}.mp4`, `DIR/{i:04d}.png` (first frame) and `DIR/{i:04d}.json` (timings, density,
settings; `step_seconds` has one entry per denoising-loop iteration, which asynchronous
diffusion forcing runs more often than --steps). The JSON is written last, so a prompt with a
JSON is finished and is skipped on rerun.
Under `accelerate launch` (or `torchrun`) the prompts are split across processes
(`accelerate.PartialState`); with `--context-parallel N` each video is made by N processes
together (diffusers' Ulysses context parallelism, `enable_parallelism`: each holds a share of the
tokens, and of the heads in attention), and the prompts are split across the groups of N.
The same seed gives the same initial noise with and without DraftAttention, so a dense and a sparse
run can be compared frame by frame with `python -m mmspec.video_dit.compare`.

The official code has one run script per model with a single hard-coded prompt; this is ours.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch

from mmspec.atomic import write_text_atomic
from mmspec.hub import ModelNotFound, resolve_model
from mmspec.interrupt import Interrupted, run_command
from mmspec.zoo.paths import model_path, positive_int, zoo_kind

from .apply import apply_draft_attention
from .config import DraftAttentionConfig
from .tiles import TileTooLarge
from .ulysses import ulysses_config
from .video_io import to_uint8, write_mp4

PAPER_TILE = (8, 16)  # DraftAttention's tile for Wan (arXiv 2505.14708 §4): 128-token blocks
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# pipeline arguments this script sets from its own options, and the option to use instead
_OWN_CALL_ARGS = {"prompt": "--prompts", "num_inference_steps": "--steps", "height": "--height",
                  "width": "--width", "num_frames": "--frames", "guidance_scale": "--guidance",
                  "negative_prompt": "--negative-prompt", "true_cfg_scale": "--true-cfg-scale",
                  "generator": "--seed (prompt i runs with seed + i)"}
# ... and those it must set itself: one video per prompt, as frames, timed step by step
_FIXED_CALL_ARGS = ("output_type", "return_dict", "num_videos_per_prompt",
                    "callback_on_step_end")


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mmspec.video_dit.generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, type=model_path,
                   help="diffusers pipeline folder or Hugging Face hub id (found in the local "
                        "cache first), or a zoo video entry: its name (video-dit) or folder "
                        "(assets/zoo/video-dit)")
    p.add_argument("--prompts", required=True, type=Path,
                   help="text file, one prompt per line; or .jsonl, one {\"prompt\": ..., "
                        "\"image\": path} per line for image-to-video pipelines")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    sparse = p.add_mutually_exclusive_group()
    sparse.add_argument("--sparsity", type=float, default=0.9, help="share of blocks skipped")
    sparse.add_argument("--dense", action="store_true", help="run without DraftAttention")
    p.add_argument("--mode", choices=("global", "row"), default="global")
    p.add_argument("--tile", type=int, nargs=2, default=None, metavar=("TH", "TW"),
                   help="latent tokens (after the VAE and the patch embedding) per tile and "
                        "kernel block, at most a frame's (default 8 16, the paper's; 2 4 on the "
                        "zoo video-dit, mmspec.zoo.registry.ZOO_VIDEO_TILE)")
    p.add_argument("--query-tile", type=int, nargs=2, default=None, metavar=("QH", "QW"),
                   help="query tiles of whole tiles, e.g. --tile 4 8 --query-tile 8 8: 64-token "
                        "query blocks over 32-token key blocks, a finer selection with larger "
                        "kernel programs (default: the tile)")
    p.add_argument("--dense-steps", type=float, default=0.3,
                   help="leading dense steps: a fraction if < 1, else a count (default 0.3)")
    p.add_argument("--dense-layers", type=int, default=1)
    p.add_argument("--steps", type=positive_int, default=None,
                   help="denoising steps (pipeline default)")
    p.add_argument("--seed", type=int, default=42, help="seed of prompt i is seed + i")
    sizes = ("(default: the pipeline's; the zoo video-dit's is 4 frames of 32x32, and it was "
             "trained on the sizes its card's training.grids lists, warning at others)")
    p.add_argument("--height", type=positive_int, default=None, help=f"pixels {sizes}")
    p.add_argument("--width", type=positive_int, default=None, help="pixels (as --height)")
    p.add_argument("--frames", type=positive_int, default=None, help="(as --height)")
    p.add_argument("--guidance", type=float, default=None)
    p.add_argument("--negative-prompt", default=None)
    p.add_argument("--true-cfg-scale", type=float, default=None,
                   help="HunyuanVideo's classifier-free guidance with --negative-prompt (its "
                        "--guidance is the distilled embedded guidance)")
    p.add_argument("--pipeline-kwargs", type=_json_object, default={}, metavar="JSON",
                   help="more arguments of the pipeline call, a JSON object, e.g. "
                        "'{\"causal_block_size\": 5, \"ar_step\": 0}' for SkyReels-V2 diffusion "
                        "forcing; recorded with the settings")
    p.add_argument("--fps", type=positive_int, default=16)
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16")
    p.add_argument("--cpu-offload", action="store_true",
                   help="keep each model of the pipeline on the CPU until it runs (diffusers' "
                        "enable_model_cpu_offload): for a GPU that cannot hold the whole pipeline "
                        "(HunyuanVideo, Wan 14B); the videos do not change, the timings "
                        "include the transfers (compare gives a speedup only between runs alike)")
    p.add_argument("--vae-tiling", action="store_true",
                   help="decode the video in overlapping tiles (the VAE's enable_tiling): less "
                        "memory at high resolution, slightly different pixels where tiles blend")
    p.add_argument("--context-parallel", type=positive_int, default=1, metavar="N",
                   help="make each video across N processes with diffusers' Ulysses context "
                        "parallelism (torchrun --nproc-per-node N ...); the prompts are split "
                        "across the groups of N processes (default 1: a video per process)")
    p.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="torch.compile each transformer block with fullgraph=True, as diffusers' "
                        "compile_repeated_blocks (backend default inductor); the first prompt's "
                        "first steps then include the compilation")
    args = p.parse_args(argv)
    check_compile_backend(p, args.compile)
    if not args.dense and not 0 <= args.sparsity < 1:
        p.error(f"--sparsity must be in [0, 1), got {args.sparsity}")
    steps = args.dense_steps
    if steps < 0 or (steps >= 1 and steps != int(steps)):
        p.error(f"--dense-steps must be a fraction in [0, 1) or a whole number of steps, got "
                f"{args.dense_steps:g}")
    if args.tile is None:
        args.tile = PAPER_TILE
        if zoo_kind(args.model) == "video-dit":
            from mmspec.zoo.registry import ZOO_VIDEO_TILE

            args.tile = ZOO_VIDEO_TILE
    if args.dense_layers < 0 or min(args.tile) < 1:
        p.error(f"--dense-layers must be >= 0 and --tile two ints >= 1, got {args.dense_layers} "
                f"and {tuple(args.tile)}")
    query = args.query_tile
    tile = args.tile
    if query is not None and min(query) < 1:
        p.error(f"--query-tile must be two ints >= 1, got {query[0]} {query[1]}")
    if query is not None and (query[0] % tile[0] or query[1] % tile[1]):
        p.error(f"--query-tile must be whole tiles, a multiple of --tile {args.tile[0]} "
                f"{args.tile[1]} in each dimension, got {query[0]} {query[1]}")
    return args


def check_compile_backend(parser: argparse.ArgumentParser, backend: str | None) -> None:
    """`parser.error` unless `backend` (a --compile value) is None or a torch.compile backend:
    checked before a pipeline loads, not minutes later at its first compiled step."""
    if backend is None:
        return
    from torch._dynamo import list_backends  # (an `import torch...` here would shadow torch)

    backends = list_backends(exclude_tags=())
    if backend not in backends:
        parser.error(f"--compile takes a torch.compile backend ({', '.join(backends)}), got "
                     f"{backend!r}")


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


def read_jobs(path: Path) -> list[dict]:
    """`[{"prompt": str, "image": path or None}]` from `--prompts`.

    A `.jsonl` file holds one JSON object per line, `{"prompt": "...", "image": "cat.png"}`,
    the image (for image-to-video pipelines) relative to the file's folder; any other file holds
    one prompt per line. Blank lines and lines starting with '#' are skipped in both.
    """
    if path.is_dir():
        raise ValueError(f"--prompts: {path} is a folder; give a text or .jsonl file")
    if not path.is_file():
        raise FileNotFoundError(f"--prompts: no such file {path}")
    # utf-8-sig: a byte-order mark (Windows editors) would hide a first line's '#'
    text = path.read_text(encoding="utf-8-sig")
    lines = [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1)]
    lines = [(i, line) for i, line in lines if line and not line.startswith("#")]
    if not lines:
        raise ValueError(f"--prompts: {path} holds no prompt (blank lines and '#' lines are skipped)")
    if path.suffix.lower() != ".jsonl":
        if path.suffix.lower() == ".json" or all(_is_json_object(line) for _, line in lines):
            raise ValueError(f"--prompts: {path} looks like JSON; name it .jsonl (one "
                             f"{{\"prompt\": ..., \"image\": ...}} object a line) or give "
                             f"plain text, one prompt a line")
        return [{"prompt": line, "image": None} for _, line in lines]
    jobs = []
    for i, line in lines:
        where = f"--prompts: {path} line {i}"
        try:
            job = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where} is not JSON ({err})") from None
        prompt = job.get("prompt") if isinstance(job, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{where} must be an object with a non-empty \"prompt\" string, "
                             f"got {line[:80]!r}")
        unknown = sorted(set(job) - {"prompt", "image"})
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; a line takes \"prompt\" and "
                             f"\"image\"")
        image = job.get("image")
        if image is not None and not isinstance(image, str):
            raise ValueError(f"{where}: \"image\" must be a path string, got {image!r}")
        if image is not None:
            image = (path.parent / image) if not Path(image).is_absolute() else Path(image)
            if not image.is_file():
                raise ValueError(f"{where}: no such image {image}")
            image = str(image.resolve())
        jobs.append({"prompt": job["prompt"], "image": image})
    return jobs


def config_from_args(args) -> DraftAttentionConfig | None:
    if args.dense:
        return None
    dense_steps = args.dense_steps if args.dense_steps < 1 else int(args.dense_steps)
    query_tile = None if args.query_tile is None else tuple(args.query_tile)
    return DraftAttentionConfig(sparsity=args.sparsity, tile=tuple(args.tile), mode=args.mode,
                                dense_steps=dense_steps, dense_layers=args.dense_layers,
                                query_tile=query_tile)


def _config_settings(config) -> dict | None:
    """The config as a run's JSON records it; `query_tile` only where set, so that folders
    written before it existed still resume."""
    if config is None:
        return None
    fields = asdict(config)
    if fields["query_tile"] is None:
        del fields["query_tile"]
    return fields


def load_pipeline(model: str, dtype: torch.dtype):
    """A diffusers pipeline directory, or a zoo video entry (a folder with a `card.json`, e.g.
    `assets/zoo/video-dit`, loaded by `mmspec.zoo.load`; its pipeline class is not in diffusers)."""
    path = Path(model)
    kind = zoo_kind(path)
    if kind not in (None, "video-dit"):  # a text model or VLM ended in an AttributeError
        raise SystemExit(f"--model {model}: a zoo {kind!r} entry, not a video model; give a "
                         f"diffusers pipeline folder or a video zoo entry (video-dit)")
    if kind is not None:
        from mmspec.zoo.registry import load
        from mmspec.zoo.video_pipeline import cast_keeping_fp32

        pipe = load(path.name, path.parent).model
        cast_keeping_fp32(pipe.transformer, dtype)
        cast_keeping_fp32(pipe.text_encoder, dtype)
        return pipe
    from diffusers import DiffusionPipeline
    from diffusers.pipelines import pipeline_utils

    # newer diffusers (0.42 here) read `dtype` and warn on `torch_dtype`; older ones ignore `dtype`
    takes_dtype = hasattr(pipeline_utils, "_resolve_dtype")
    with _no_loading_bars_outside_a_terminal():
        return DiffusionPipeline.from_pretrained(
            model, **{"dtype" if takes_dtype else "torch_dtype": dtype})


@contextmanager
def _no_loading_bars_outside_a_terminal():
    """diffusers' "Loading pipeline components" bar and transformers' "Loading weights" bars
    nested under it, only on a terminal: in a log each is a line of escapes per update."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    libraries = [lib for lib in (diffusers_logging, transformers_logging)
                 if lib.is_progress_bar_enabled()] if not sys.stderr.isatty() else []
    for lib in libraries:
        lib.disable_progress_bar()
    try:
        yield
    finally:
        for lib in libraries:
            lib.enable_progress_bar()


def place_pipeline(pipe, device, cpu_offload: bool = False, vae_tiling: bool = False) -> None:
    """Put `pipe` on `device`, or with `cpu_offload` let diffusers move each model there only
    while it runs (DraftAttention's hooks run before the offload hook's, on inputs that are
    already on the device); `vae_tiling` turns on the VAE's tiled decoding."""
    if vae_tiling:
        vae = getattr(pipe, "vae", None)
        if not hasattr(vae, "enable_tiling"):
            raise SystemExit(f"--vae-tiling: {type(pipe).__name__}'s VAE "
                             f"({type(vae).__name__}) has no tiled decoding")
        vae.enable_tiling()
    if not cpu_offload:
        pipe.to(device)
        return
    if getattr(pipe, "model_cpu_offload_seq", None) is None:
        raise SystemExit(f"--cpu-offload: {type(pipe).__name__} names no model order for "
                         f"offloading (model_cpu_offload_seq)")
    pipe.enable_model_cpu_offload(device=device)


def _share(todo: list, parts: int, part: int) -> list:
    """Part `part` of `parts` contiguous shares of `todo`, the first ones one longer where it
    does not divide (as accelerate's `split_between_processes`)."""
    size, extra = divmod(len(todo), parts)
    start = part * size + min(part, extra)
    return todo[start:start + size + (part < extra)]


def context_parallel_mesh(dist, degree: int):
    """The ("ring", "ulysses") mesh of this process's group of `degree` processes (consecutive
    ranks), for diffusers' `ContextParallelConfig(mesh=...)`."""
    from torch.distributed.device_mesh import init_device_mesh

    if dist.num_processes % degree:
        raise SystemExit(f"--context-parallel {degree} must divide the number of processes, got "
                         f"{dist.num_processes} (torchrun --nproc-per-node {degree} ...)")
    mesh = init_device_mesh(torch.device(dist.device).type,
                            (dist.num_processes // degree, 1, degree),
                            mesh_dim_names=("prompts", "ring", "ulysses"))
    return mesh["ring", "ulysses"]


def enable_context_parallel(pipe, mesh) -> None:
    """diffusers' Ulysses context parallelism on every transformer of `pipe`, over `mesh`."""
    from diffusers import ContextParallelConfig

    degree = mesh.size()
    for name in ("transformer", "transformer_2"):
        model = getattr(pipe, name, None)
        if model is None:
            continue
        if getattr(model, "_cp_plan", None) is None:
            raise SystemExit(f"--context-parallel {degree}: diffusers has no context-parallel "
                             f"plan for {type(model).__name__} (its _cp_plan); split the prompts "
                             f"across processes instead (no --context-parallel)")
        with _one_device_per_cpu_process(mesh):
            model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=degree,
                                                                  mesh=mesh))


def ulysses_degree(pipe) -> int:
    """The Ulysses degree `pipe`'s transformer runs with, read from the model (1: none)."""
    config = getattr(getattr(pipe, "transformer", None), "_parallel_config", None)
    context = ulysses_config(config)
    return 1 if context is None else context.ulysses_degree


@contextmanager
def _one_device_per_cpu_process(mesh):
    """diffusers places rank r on accelerator `r % torch.accelerator.device_count()`, which is
    0 on a machine without one (gloo on the CPU): count 1 there while it sets up."""
    real = torch.accelerator.device_count
    if mesh.device_type == "cpu" and real() == 0:
        torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = real


def compile_blocks(pipe, backend: str = "inductor") -> None:
    """Regional compilation of every transformer of `pipe`: each repeated block compiled with
    fullgraph=True, as diffusers' `compile_repeated_blocks` does (its block classes, or the
    `transformer_blocks` of a model that names none, e.g. CogVideoX)."""
    count = 0
    for name in ("transformer", "transformer_2"):
        model = getattr(pipe, name, None)
        if model is None:
            continue
        kinds = set(getattr(model, "_repeated_blocks", None) or ())
        blocks = ([m for m in model.modules() if type(m).__name__ in kinds] if kinds
                  else list(getattr(model, "transformer_blocks", ())))
        for block in blocks:
            block.compile(fullgraph=True, backend=backend)
        count += len(blocks)
    if not count:
        raise SystemExit(f"--compile: {type(pipe).__name__} has no transformer blocks to compile")


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _image_problem(pipe, image, index: int, prompt: str | None = None) -> str | None:
    """Why prompt `index` cannot run on `pipe`: no image for an image-to-video pipeline, or an
    image for one that takes none; None if it can. `prompt` is quoted when given."""
    takes = inspect.signature(type(pipe).__call__).parameters
    name = type(pipe).__name__
    if image is None and "image" in takes and takes["image"].default is inspect.Parameter.empty:
        which = "" if prompt is None else f", and prompt {index} ({prompt[:40]!r}) has none"
        return (f"--prompts: {name} needs an image per prompt{which}: give a .jsonl file, one "
                f"{{\"prompt\": ..., \"image\": path}} a line")
    if image is not None and "image" not in takes:
        return (f"--prompts: prompt {index} has an image but {name} takes none (an "
                f"image-to-video pipeline does)")
    return None


def check_images(pipe, jobs: list[dict], indices) -> None:
    """Every prompt of `indices` has an image if the pipeline needs one, and none if it takes
    none: named before the first video, not after hours of others."""
    for i in indices:
        problem = _image_problem(pipe, jobs[i]["image"], i, jobs[i]["prompt"])
        if problem:
            raise SystemExit(problem)


def _pipeline_call(pipe, prompt: str, index: int, args, image=None) -> dict:
    """The pipeline's keyword arguments for prompt `index`: the seed, this script's options where
    the pipeline takes them, `--pipeline-kwargs`; SystemExit naming an option it cannot take."""
    call = {"prompt": prompt, "output_type": "np",
            "generator": torch.Generator(device="cpu").manual_seed(args.seed + index)}
    takes = inspect.signature(type(pipe).__call__).parameters
    open_kwargs = any(p.kind == p.VAR_KEYWORD for p in takes.values())
    for option, key, value in (("--steps", "num_inference_steps", args.steps),
                               ("--height", "height", args.height),
                               ("--width", "width", args.width),
                               ("--frames", "num_frames", args.frames),
                               ("--guidance", "guidance_scale", args.guidance),
                               ("--negative-prompt", "negative_prompt", args.negative_prompt),
                               ("--true-cfg-scale", "true_cfg_scale", args.true_cfg_scale)):
        if value is None:
            continue
        if key in takes or open_kwargs:
            call[key] = value
        elif key == "guidance_scale" and hasattr(getattr(pipe, "guider", None), "new"):
            # HunyuanVideo 1.5: classifier-free guidance is the pipeline's guider component
            pipe.guider = pipe.guider.new(guidance_scale=value)
        elif key != "true_cfg_scale":  # named below, with what to use instead
            raise SystemExit(f"{option}: {type(pipe).__name__} takes no {key}")
    problem = _image_problem(pipe, image, index)
    if problem:
        raise SystemExit(problem)
    if image is not None:
        from PIL import Image

        with Image.open(image) as opened:
            call["image"] = opened.convert("RGB")
    for key, value in args.pipeline_kwargs.items():
        if key in _OWN_CALL_ARGS:
            raise SystemExit(f"--pipeline-kwargs: {key!r} is set by this script; use "
                             f"{_OWN_CALL_ARGS[key]}")
        if key in _FIXED_CALL_ARGS:
            raise SystemExit(f"--pipeline-kwargs: {key!r} is fixed by this script, which "
                             f"writes one video per prompt (repeat a prompt for more seeds)")
        if key not in takes:
            raise SystemExit(f"--pipeline-kwargs: {type(pipe).__name__} takes no {key!r}")
        call[key] = value
    _check_true_cfg(pipe, args, call, takes)
    return call


def _check_true_cfg(pipe, args, call: dict, takes) -> None:
    """--true-cfg-scale and --negative-prompt only where the pipeline uses them (HunyuanVideo
    would ignore a negative prompt without true CFG, and true CFG without a negative prompt)."""
    if args.true_cfg_scale is not None and "true_cfg_scale" not in takes:
        raise SystemExit(f"--true-cfg-scale: {type(pipe).__name__} has no true CFG; use "
                         f"--guidance")
    if args.negative_prompt is not None and "true_cfg_scale" in takes and \
            (args.true_cfg_scale or 1.0) <= 1.0:  # HunyuanVideo would ignore it
        raise SystemExit(f"--negative-prompt: {type(pipe).__name__} uses it only with "
                         f"--true-cfg-scale > 1")
    negative = args.negative_prompt is not None or "negative_prompt_embeds" in call
    if (args.true_cfg_scale or 1.0) > 1.0 and "true_cfg_scale" in takes and not negative:
        raise SystemExit(f"--true-cfg-scale: {type(pipe).__name__} uses it only with "
                         f"--negative-prompt (true CFG against the negative prompt)")


@contextmanager
def _step_marks(pipe, call: dict, device):
    """Within: the time of the transformer's first forward (the denoising loop's start) and of
    each step's end, appended to the two lists it yields. A step ends at the pipeline's step
    callback, set in `call`, or where it takes none at `scheduler.step`."""
    takes = inspect.signature(type(pipe).__call__).parameters
    step_ends, first_call = [], []

    def on_step_end(pipeline, step, timestep, kwargs):
        _sync(device)
        step_ends.append(time.perf_counter())
        return {}

    def on_first_forward(module, args):
        if not first_call:
            _sync(device)
            first_call.append(time.perf_counter())

    transformer = getattr(pipe, "transformer", None)
    hook = transformer.register_forward_pre_hook(on_first_forward) if transformer else None
    scheduler = getattr(pipe, "scheduler", None)
    wrapped = False
    if "callback_on_step_end" in takes:
        call["callback_on_step_end"] = on_step_end
    elif scheduler is not None:
        # HunyuanVideo 1.5's pipelines take no step callback: a step ends with scheduler.step
        # (an instance attribute over the class's method, deleted again below)
        def step(*a, _step=scheduler.step, **k):
            out = _step(*a, **k)
            on_step_end(pipe, len(step_ends), None, {})
            return out

        scheduler.step = step
        wrapped = True
    try:
        yield first_call, step_ends
    finally:
        if hook is not None:
            hook.remove()
        if wrapped:
            del scheduler.step


def generate_one(pipe, prompt: str, index: int, args, state, device, image=None) -> dict:
    """Prompt `index` through `pipe`: its frames `[F, H, W, 3]` in [0, 1], the call's seconds
    (setup: prompt encoding and latents; each step's; decode: the VAE) and DraftAttention's
    density (None for dense attention)."""
    call = _pipeline_call(pipe, prompt, index, args, image)
    with _step_marks(pipe, call, device) as (first_call, step_ends):
        if state is not None:
            state.reset()
        _sync(device)
        start = time.perf_counter()
        frames = pipe(**call).frames[0]  # [F, H, W, 3] in [0, 1]
    _sync(device)
    seconds = time.perf_counter() - start
    # step 0 from the first forward: prompt encoding and latent set-up are not a step's time
    loop_start = first_call[0] if first_call else start
    steps = [b - a for a, b in zip([loop_start, *step_ends[:-1]], step_ends)]
    density = None
    if state is not None:
        # "mean": the whole run, dense warm-up steps and layers included; "sparse": the
        # sparse calls only, what --sparsity sets
        density = {"mean": state.mean_density(), "sparse": state.sparse_density(),
                   "by_step": {str(k): v for k, v in state.density_by_step().items()}}
    return {"frames": frames, "seconds": seconds, "step_seconds": steps, "density": density,
            "setup_seconds": loop_start - start,
            "decode_seconds": (start + seconds - step_ends[-1]) if step_ends else None}


def model_name(model) -> str:
    """`--model` as recorded: an existing folder resolved (`wan/`, `./wan` and `/abs/wan` are one
    model), anything else as given."""
    path = Path(model)
    return str(path.resolve()) if path.exists() else str(model)


def settings_differ(ours: dict, theirs: dict, skip=()) -> list[str]:
    """Human-readable differences of two runs' settings (`run_settings`, plus the prompt); a key
    one side lacks (JSONs of older versions) does not count. The model compares as a folder."""
    out = []
    for key, value in ours.items():
        other = theirs.get(key, value)
        if key in skip or other == value:
            continue
        if key == "model" and model_name(other) == model_name(value):
            continue
        out.append(f"{key} {other!r} there, {value!r} now")
    return out


def run_settings(args, config) -> dict:
    """What a finished prompt's JSON must share with a run that resumes it."""
    return {"model": model_name(args.model), "seed": args.seed, "steps": args.steps,
            "height": args.height, "width": args.width, "frames": args.frames, "fps": args.fps,
            "guidance": args.guidance, "negative_prompt": args.negative_prompt,
            "true_cfg_scale": args.true_cfg_scale, "pipeline_kwargs": args.pipeline_kwargs,
            "dtype": args.dtype, "vae_tiling": args.vae_tiling,
            "config": _config_settings(config)}


def plan_jobs(args, jobs: list[dict], settings: dict) -> list[int]:
    """The indices of the prompts left to make: a prompt whose JSON is in `--out` is done, if the
    same prompt and settings made it (SystemExit otherwise: a resume never mixes runs)."""
    todo = []
    for i, job in enumerate(jobs):
        done = args.out / f"{i:04d}.json"
        if not done.exists():
            todo.append(i)
            continue
        try:
            old = json.loads(done.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise SystemExit(f"--out {args.out}: {done.name} is not a JSON this script wrote "
                             f"({err}); delete it to redo that prompt") from None
        # JSONs of older versions lack some settings (all of them, or fps): those pass
        differ = ", ".join(settings_differ(
            {"prompt": job["prompt"], "image": job["image"], **settings},
            {"prompt": old.get("prompt"), "image": old.get("image"), **old.get("settings", {})}))
        if differ:  # resuming must never mix runs or label one as the other
            raise SystemExit(f"--out {args.out}: {done.name} was made by another prompt or "
                             f"settings ({differ}); use a new --out, or delete it to redo it")
    return todo


def prepare_pipeline(args, config, device, mesh):
    """(the pipeline of `--model` placed on `device`, split over `mesh` when given, with
    DraftAttention applied for `config` and compiled as asked; DraftAttention's state or None)."""
    try:  # a hub id from the local cache first, as in from_pretrained
        folder = str(resolve_model(args.model))
    except ModelNotFound as err:
        raise SystemExit(f"--model: {err}") from None
    try:
        pipe = load_pipeline(folder, _DTYPES[args.dtype])
    except (OSError, ValueError) as err:  # not a pipeline
        raise SystemExit(f"--model {args.model}: cannot load a diffusers pipeline: "
                         f"{str(err).strip().splitlines()[0]}") from None
    place_pipeline(pipe, device, args.cpu_offload, args.vae_tiling)
    if mesh is not None:
        enable_context_parallel(pipe, mesh)
    # one bar per job, the prompts': the pipeline's own bar of steps nested under it wrote a line
    # of escapes per step into logs
    pipe.set_progress_bar_config(disable=True)
    try:
        state = apply_draft_attention(pipe, config) if config is not None else None
    except (TypeError, ValueError, NotImplementedError) as err:  # an unsupported model, ...
        message = str(err).replace("config.dense_layers", "--dense-layers")
        raise SystemExit(f"--model {args.model}: {message}") from None
    if args.compile is not None:
        compile_blocks(pipe, args.compile)
    return pipe, state


def _generate_or_exit(pipe, index: int, job: dict, args, state, device) -> dict:
    """`generate_one`, with a tile too large for the grid or the pipeline's refusal as one line."""
    try:
        return generate_one(pipe, job["prompt"], index, args, state, device, job["image"])
    except TileTooLarge as err:  # the grid is checked at the first forward
        flag, size = ("--query-tile", args.query_tile) if str(err).startswith(
            "query_tile") else ("--tile", args.tile)
        raise SystemExit(f"{flag} {size[0]} {size[1]}: {err} (the grid is the latent "
                         f"tokens of --height, --width and --frames)") from None
    except ValueError as err:  # the pipeline's own checks (e.g. a size it cannot take)
        raise SystemExit(f"prompt {index}: the {type(pipe).__name__} call failed: "
                         f"{str(err).strip().splitlines()[0]}") from None


def write_video(pipe, index: int, job: dict, result: dict, run: dict, dist) -> None:
    """`NNNN.mp4`, its first frame `NNNN.png`, then atomically `NNNN.json` (settings, timings,
    density), which marks the prompt finished. `run`: args, settings and config."""
    from PIL import Image

    args, settings, config = run["args"], run["settings"], run["config"]
    stem = args.out / f"{index:04d}"
    frames = to_uint8(result["frames"])
    write_mp4(stem.with_suffix(".mp4"), frames, fps=args.fps)
    Image.fromarray(frames[0]).save(stem.with_suffix(".png"))
    record = {
        "index": index, "prompt": job["prompt"], "image": job["image"],
        "settings": settings,
        "seed": args.seed + index,
        "model": settings["model"], "attention": "dense" if config is None else "draft",
        "config": _config_settings(config),
        # seconds: the whole call; setup (prompt encoding, latents) + steps + decode (VAE)
        "seconds": result["seconds"], "setup_seconds": result["setup_seconds"],
        "step_seconds": result["step_seconds"], "decode_seconds": result["decode_seconds"],
        "density": result["density"], "frames": int(frames.shape[0]),
        "height": int(frames.shape[1]), "width": int(frames.shape[2]),
        "device": str(dist.device), "process": dist.process_index,
        "processes": dist.num_processes, "context_parallel": ulysses_degree(pipe),
        "dtype": args.dtype, "torch": torch.__version__,
        "compile": args.compile,  # the first prompt compiled in its first steps
        "cpu_offload": args.cpu_offload,
    }
    # last, and atomically: a JSON marks the prompt finished
    write_text_atomic(stem.with_suffix(".json"), json.dumps(record, indent=2))


def _finished(out: Path, count: int) -> int:
    return sum((out / f"{i:04d}.json").exists() for i in range(count))


def main(argv=None) -> int:
    from accelerate import PartialState
    from tqdm.auto import tqdm

    args = parse_args(argv)
    try:
        jobs = read_jobs(args.prompts)
    except (FileNotFoundError, ValueError) as err:  # each names --prompts
        raise SystemExit(str(err)) from None
    config = config_from_args(args)
    # cpu=True on a machine without CUDA: accelerate then sees torchrun's processes (else one)
    dist = PartialState(cpu=not torch.cuda.is_available())
    if args.out.exists() and not args.out.is_dir():
        raise SystemExit(f"--out {args.out} is a file; give a folder")
    args.out.mkdir(parents=True, exist_ok=True)
    settings = json.loads(json.dumps(run_settings(args, config)))  # as the JSONs hold them
    todo = plan_jobs(args, jobs, settings)
    degree = args.context_parallel
    mesh = context_parallel_mesh(dist, degree) if degree > 1 else None
    # a group of `degree` processes makes each of its videos together; its first one writes
    group, writer = dist.process_index // degree, dist.process_index % degree == 0
    mine = _share(todo, dist.num_processes // degree, group)
    skipped = len(jobs) - len(todo)
    if dist.is_main_process and skipped:
        print(f"resuming: {skipped} of {len(jobs)} prompts already done in {args.out}")
    if not mine:
        return 0

    pipe, state = prepare_pipeline(args, config, dist.device, mesh)
    check_images(pipe, jobs, mine)  # every prompt of this run, before the first one runs
    run = {"args": args, "settings": settings, "config": config}
    try:
        # disable=None: no bar where stderr is not a terminal (a log, a pipe)
        for index in tqdm(mine, desc=f"prompts (rank {dist.process_index})",
                          disable=None if writer else True):
            result = _generate_or_exit(pipe, index, jobs[index], args, state, dist.device)
            if not writer:  # the same video as its group's first process
                continue
            if args.frames is not None and len(result["frames"]) != args.frames:
                tqdm.write(f"prompt {index}: {type(pipe).__name__} made {len(result['frames'])} "
                           f"frames for --frames {args.frames} (its own frame count rule; the "
                           f"JSON records the frames written)")
            write_video(pipe, index, jobs[index], result, run, dist)
            if not sys.stderr.isatty():  # no bar there (tqdm's disable=None): a line a video
                print(f"video {index:04d}.mp4 done ({mine.index(index) + 1} of {len(mine)}, "
                      f"{result['seconds']:.1f} s)", flush=True)
    except KeyboardInterrupt:  # a prompt's JSON is written last: the finished ones are whole
        raise Interrupted(f"{_finished(args.out, len(jobs))} of {len(jobs)} videos in "
                          f"{args.out}; rerun the same command to resume") from None
    if dist.is_main_process:  # the last line says where the videos went
        print(f"{_finished(args.out, len(jobs))} of {len(jobs)} videos in {args.out} (NNNN.mp4, "
              f"first frame NNNN.png, settings and timings NNNN.json)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
