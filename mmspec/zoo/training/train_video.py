"""Train the video zoo entry `video-dit`: a tiny Wan DiT on synthetic moving-shape clips.

    python -m mmspec.zoo.training.train_video       # under an hour on one CPU thread
    python -m mmspec.zoo.training.train_video --steps 2 --micro --out /tmp/x --assets /tmp/z

Rectified flow matching in pixel space (see `mmspec/zoo/video_model.py` for the choices), on
several grids: step s trains on grid s mod len(--grids), each with its own batch (`GRIDS`: about as
many tokens a step on each), so the model works at every size its card lists (RoPE alone does not
carry a DiT trained on one grid to another: 9 frames of 64x64 gave dark noise). Seeded and
resumable (`mmspec.train_scaffold`): transformer, optimizer, scheduler, step and losses go to the
folder `out/zoo/video-dit/ckpt/` every `--save-every-s` seconds and at the end; `--resume`
continues from there (the batch of step s is drawn from a generator seeded by s, so a resumed run
sees the same data). At the end the weights are written as one fp16 `model.safetensors` (keys
`transformer.*`, `text_encoder.*`) with the configs, the tokenizer and a card whose held-out loss
is measured on the shipped fp16 weights, staged beside the entry folder and swapped in whole
(`train_text.staged_export`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from mmspec.interrupt import run_command
from mmspec.train_scaffold import (RunExists, TrainLoop, command, cosine_schedule, read_meta,
                                   refuse_old_format, refuse_other_run, run_refusals_as_exit)
from mmspec.zoo.cards import write_card
from mmspec.zoo.clips import HELDOUT_SEED, clip_batch
from mmspec.zoo.paths import OUT_DIR, ZOO_DIR, positive_int
from mmspec.zoo.registry import video_parts
from mmspec.zoo.training.committed import committed_card, committed_state, load_committed
from mmspec.zoo.training.train_text import staged_export
from mmspec.zoo.video_model import (
    VideoModelSpec,
    build_text_encoder,
    build_tokenizer,
    build_transformer,
    encode_prompts,
)

MODULE = "mmspec.zoo.training.train_video"  # the `python -m` name a card records

NAME = "video-dit"
EVAL_CLIPS = 16  # held-out clips HELDOUT_SEED + i the card reports and tests/zoo re-measures
CAPTION_DROPOUT = 0.1
SHIFT = 3.0  # timestep shift of training and of the pipeline's FlowMatchEulerDiscreteScheduler
SPEC = VideoModelSpec()  # the shipped shape: 3 layers, 2 heads of 128 (see its docstring)
MICRO = VideoModelSpec(frames=2, height=16, width=16, num_layers=2, num_heads=2, head_dim=12,
                       ffn_dim=16, text_dim=16, freq_dim=16)
SEED_STRIDE = 16  # clip seeds per step, at least any grid's batch
# (frames, height, width, batch) trained in turn; the first is the pipeline's default size.
# The sizes video_dit.generate and demos/video_draft.py offer for the zoo entry.
GRIDS = ((4, 32, 32, 8), (8, 32, 32, 4), (4, 64, 64, 2))
MICRO_GRIDS = ((2, 16, 16, 2), (4, 8, 8, 2))


def parse_grid(text: str) -> tuple[int, int, int, int]:
    """argparse type of `--grids`: 'FxHxW:B' (frames, even height and width, batch)."""
    try:
        size, batch = text.split(":")
        frames, height, width = (int(v) for v in size.split("x"))
        grid = (frames, height, width, int(batch))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be FRAMESxHEIGHTxWIDTH:BATCH such as 4x32x32:8, "
                                         f"got {text!r}") from None
    if min(grid) < 1 or height % 2 or width % 2 or grid[3] > SEED_STRIDE:
        raise argparse.ArgumentTypeError(f"needs sizes >= 1, even height and width and a batch "
                                         f"of at most {SEED_STRIDE}, got {text!r}")
    return grid


def grid_name(grid) -> str:
    return "%dx%dx%d" % tuple(grid[:3])


def sizes(grids) -> tuple[tuple[int, int, int], ...]:
    """The distinct (frames, height, width) of `grids`, first listed first: a size listed twice
    in --grids trains twice as often but is one size of the card."""
    return tuple(dict.fromkeys(tuple(g[:3]) for g in grids))


def sample_t(b: int, generator) -> torch.Tensor:
    """t ~ logit-normal(0, 1) (SD3), shifted by `SHIFT` towards noise as the sampler's schedule.

    Unshifted, t > 0.9 has 1.4% of the mass and a 250-step run could denoise a clip noised to
    t = 0.6 into a clean moving shape but made only speckle from pure noise: the layout is decided
    at high t, which it had hardly seen. Shifted by 3, t > 0.9 gets 13.5%.
    """
    t = torch.sigmoid(torch.randn(b, generator=generator))
    return SHIFT * t / (1 + (SHIFT - 1) * t)


def flow_matching_loss(transformer, videos, text, generator) -> torch.Tensor:
    """Wan's rectified flow: x_t = (1-t) x0 + t n, target n - x0, timestep 1000 t (`sample_t`)."""
    b = videos.shape[0]
    t = sample_t(b, generator)
    noise = torch.randn(videos.shape, generator=generator)
    tt = t.view(b, 1, 1, 1, 1)
    noisy = (1 - tt) * videos + tt * noise
    pred = transformer(noisy, timestep=t * 1000, encoder_hidden_states=text, return_dict=False)[0]
    return torch.nn.functional.mse_loss(pred.float(), noise - videos)


def training_batch(step: int, grids, seed: int, generator):
    """The clips of step `step`: grid `step % len(grids)`, its batch of seeded clips."""
    frames, height, width, batch = grids[step % len(grids)]
    seeds = [(seed * 1_000_003 + step * SEED_STRIDE + i) % HELDOUT_SEED for i in range(batch)]
    videos, captions = clip_batch(seeds, frames, height, width)
    drop = torch.rand(batch, generator=generator) < CAPTION_DROPOUT
    return videos, ["" if d else c for c, d in zip(captions, drop.tolist())]


@torch.no_grad()
def heldout_loss(transformer, tokenizer, text_encoder, grid, clips: int = EVAL_CLIPS) -> float:
    """Flow-matching loss on held-out clips of `grid` (frames, height, width), with fixed noise
    and t (generator seed 1234)."""
    was_training = transformer.training
    transformer.eval()
    frames, height, width = grid[:3]
    videos, captions = clip_batch(range(HELDOUT_SEED, HELDOUT_SEED + clips), frames, height,
                                  width)
    text = encode_prompts(tokenizer, text_encoder, captions)
    gen = torch.Generator().manual_seed(1234)
    losses = [flow_matching_loss(transformer, v, e, gen).item() * len(v)
              for v, e in zip(videos.split(8), text.split(8))]
    transformer.train(was_training)
    return sum(losses) / clips



def train(args) -> None:
    spec = MICRO if args.micro else SPEC
    grids = tuple(args.grids or (MICRO_GRIDS if args.micro else GRIDS))
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = build_tokenizer()
    text_encoder = build_text_encoder(spec, seed=args.seed)
    transformer = build_transformer(spec)
    if args.init_from:
        for module, part in video_parts(committed_state(args.init_from), transformer,
                                        text_encoder):
            load_committed(module, part, args.init_from, ("embed_tokens.weight",))  # UMT5 ties
    opt = torch.optim.AdamW(transformer.parameters(), lr=args.lr, betas=(0.9, 0.99),
                            weight_decay=0.01)
    ckpt_path = Path(args.out) / NAME / "ckpt"
    # what a checkpoint must share with this run to be resumed by it (--steps may grow): the
    # frozen text encoder is rebuilt from --seed, the data follow --seed and --grids
    run = {key: getattr(args, key) for key in ("seed", "lr", "warmup", "micro", "init_from")}
    run["grids"] = [list(g) for g in grids]
    old_format = ckpt_path.with_name("ckpt.pt")
    meta = read_meta(ckpt_path)
    if not args.resume and (meta is not None or old_format.exists()):
        raise RunExists(f"{ckpt_path if meta else old_format} exists: pass --resume to "
                        f"continue it, or delete it")
    refuse_old_format(old_format, ckpt_path)
    loop = TrainLoop(transformer, opt, cosine_schedule(opt, args.warmup, args.steps), ckpt_path,
                     run, args.save_every_s)
    if meta is not None:
        refuse_other_run(meta, run, ckpt_path, "resume with its settings, ")
        loop.resume(meta)
        print(f"resumed {NAME} at step {loop.done} ({loop.elapsed:.0f}s trained)")
    n_params = sum(p.numel() for p in transformer.parameters())
    print(f"{NAME}: {n_params / 1e6:.2f}M transformer params, grids (frames x height x width: "
          f"batch) " + ", ".join(f"{grid_name(g)}:{g[3]}" for g in grids))

    transformer.train()
    bar = loop.steps(args.steps, NAME)
    try:
        for step in bar:
            gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
            videos, captions = training_batch(step, grids, args.seed, gen)
            text = encode_prompts(tokenizer, text_encoder, captions)
            loss = flow_matching_loss(transformer, videos, text, gen)
            loop.update(loss, step, bar, digits=4)
    except KeyboardInterrupt:
        raise loop.interrupted(NAME, args.steps,
                               f"resume: {command(MODULE, args.argv, resume=True)}") from None
    loop.finish()
    losses, elapsed, done = loop.losses, loop.elapsed, loop.done
    export(spec, grids, transformer, text_encoder, tokenizer, losses, elapsed, done, n_params,
           args)


def export(spec, grids, transformer, text_encoder, tokenizer, losses, elapsed, steps, n_params,
           args):
    from mmspec.zoo.registry import load_video_components

    out_dir = Path(args.assets) / NAME
    with staged_export(out_dir) as stage:
        state = {f"transformer.{k}": v.detach().to(torch.float16).contiguous()
                 for k, v in transformer.state_dict().items()}
        state.update({f"text_encoder.{k}": v.detach().to(torch.float16).contiguous()
                      for k, v in text_encoder.state_dict().items()})
        save_file(state, str(stage / "model.safetensors"))
        (stage / "transformer_config.json").write_text(
            json.dumps({k: list(v) if isinstance(v, tuple) else v
                        for k, v in spec.transformer_config().items()}, indent=2) + "\n")
        text_encoder.config.to_json_file(str(stage / "text_encoder_config.json"))
        tokenizer.save_pretrained(str(stage))
        shipped_transformer, shipped_text, shipped_tok = load_video_components(stage)
        held = {grid_name(g): heldout_loss(shipped_transformer, shipped_tok, shipped_text, g)
                for g in sizes(grids)}
        size_mb = (stage / "model.safetensors").stat().st_size / 1e6
        write_card(stage, _card(spec, grids, text_encoder, losses, elapsed, steps, n_params, args,
                                held, size_mb))
    print(f"exported {out_dir}: {size_mb:.2f} MB, held-out loss " +
          ", ".join(f"{k} {v:.4f}" for k, v in held.items()))


def _card(spec, grids, text_encoder, losses, elapsed, steps, n_params, args, held,
          size_mb) -> dict:
    tail = losses[-50:]
    # the last 20 steps of each size (a size no step has reached yet has none)
    by_grid = {grid_name(g): [x for s, x in enumerate(losses)
                              if grids[s % len(grids)][:3] == g][-20:] for g in sizes(grids)}
    return {
        "name": NAME,
        "summary": "Tiny WanTransformer3DModel (diffusers) trained with rectified flow matching "
                   "in pixel space on seeded synthetic moving-shape clips, caption-conditioned "
                   "through a frozen random-init UMT5 encoder.",
        "kind": "video-dit",
        "architecture": "WanTransformer3DModel + UMT5EncoderModel (frozen, random init)",
        "params": n_params,
        "text_encoder_params": sum(p.numel() for p in text_encoder.parameters()),
        "size_mb": round(size_mb, 2),
        "dtype": "float16",
        "spec": spec.to_dict(),
        "conventions": {
            "space": "pixels in [-1, 1], video layout [B, 3, F, H, W]; patch (1, 2, 2)",
            "token_grid": "(frames, height/2, width/2); training grids " + ", ".join(
                str((f, h // 2, w // 2)) for f, h, w in sizes(grids)),
            "scheduler": f"FlowMatchEulerDiscreteScheduler(shift={SHIFT})",
            "caption": "'a <colour> <shape> moving <direction>' (mmspec.zoo.clips); '' = "
                       "unconditional (caption dropout %.0f%%)" % (100 * CAPTION_DROPOUT),
        },
        "objective": "rectified flow matching (Wan): x_t=(1-t)x0+t*n, MSE to v=n-x0, timestep "
                     "1000t, t = s*u/(1+(s-1)*u), u~sigmoid(N(0,1)), s=%s" % SHIFT,
        "data": {
            "clips": "mmspec.zoo.clips.make_clip(seed): one shape (circle/square/triangle, 5 "
                     "colours) moving and bouncing in one of 4 directions over a background "
                     "texture (a grey level plus 4 plane waves) that pans with a random camera "
                     "motion",
            "train_seeds": f"(seed*1000003 + step*{SEED_STRIDE} + i) % {HELDOUT_SEED}, i < "
                           f"the batch of the step's grid",
            "heldout_seeds": f"{HELDOUT_SEED}..{HELDOUT_SEED + EVAL_CLIPS - 1}",
        },
        "training": {"steps": steps, "shift": SHIFT,
                     "grids": [list(g) for g in sizes(grids)],
                     "grids_note": "(frames, height, width) in pixels; step s trains entry s mod "
                                   "%d of --grids %s (FxHxW:batch)" % (
                                       len(grids), " ".join(f"{grid_name(g)}:{g[3]}"
                                                            for g in grids)),
                     "lr": args.lr, "warmup": args.warmup,
                     "optimizer": "AdamW(0.9, 0.99), wd 0.01, grad clip 1.0, cosine to 10%"},
        "results": {
            "final_train_loss": round(sum(tail) / len(tail), 4),
            "final_train_loss_note": "mean of the last 50 steps, all grids",
            "final_train_loss_by_grid": {k: round(sum(v) / len(v), 4)
                                         for k, v in by_grid.items() if v},
            "heldout_loss": round(held[grid_name(grids[0])], 4),
            "heldout_loss_by_grid": {k: round(v, 4) for k, v in held.items()},
            "heldout_note": f"flow-matching loss on {EVAL_CLIPS} held-out clips, noise and t from "
                            f"Generator(1234), fp16 weights as shipped "
                            f"(mmspec.zoo.training.train_video.heldout_loss); heldout_loss is "
                            f"the first grid's",
            "wall_time_s": round(elapsed, 3),
            "threads": args.threads,
            "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs (shared)",
            "seed": args.seed,
        },
        "command": command(MODULE, args.argv),
        **({"init_from": {"ref": args.init_from, "card": committed_card(args.init_from)}}
           if args.init_from else {}),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=positive_int, default=600)
    parser.add_argument("--grids", type=parse_grid, nargs="+", default=None,
                        metavar="FxHxW:B",
                        help="grids trained in turn, frames x height x width in pixels and the "
                             "batch of each; a size listed twice trains twice as often (default "
                             + " ".join(
                                 f"{grid_name(g)}:{g[3]}" for g in GRIDS) + "; --micro: " +
                             " ".join(f"{grid_name(g)}:{g[3]}" for g in MICRO_GRIDS) + ")")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--micro", action="store_true", help="tiny model and clips (tests)")
    parser.add_argument("--resume", action="store_true", help="continue out/.../ckpt.pt")
    parser.add_argument("--out", default=str(OUT_DIR), help="checkpoint folder (git-ignored)")
    parser.add_argument("--assets", default=str(ZOO_DIR), help="where the shipped entry goes")
    parser.add_argument("--save-every-s", type=float, default=120.0)
    parser.add_argument("--init-from", default=None, metavar="REV:DIR",
                        help="fine-tune from a committed entry, e.g. HEAD:assets/zoo/video-dit")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    if not args.lr > 0 or args.warmup < 0:
        parser.error(f"--lr must be > 0 and --warmup >= 0, got {args.lr} and {args.warmup}")
    run_refusals_as_exit(train, args)


if __name__ == "__main__":
    sys.exit(run_command(main))
