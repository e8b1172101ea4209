"""Train a DFlash drafter (`mmspec.diffusion.dflash_train`) for a causal LM target on the
Python standard library's source, on the shared scaffold (`mmspec.train_scaffold`), and write it
in the authors' layout (config.json + model.safetensors, which `DFlashDrafter.from_pretrained`,
`--drafter dflash:PATH` and their own loader read).

    python -m mmspec.zoo.training.train_dflash --target text-target --out out/zoo/text-dflash
    python -m mmspec.zoo.training.train_dflash --target PATH/TO/HF_MODEL --mask-token-id 151669 ...

`--target`: a zoo entry's name or any Hugging Face causal LM folder with a fast tokenizer. The
windows are drawn from the corpus's training split tokenized with the target's tokenizer; the
held-out split stays for evaluation. Seeded and resumable like the zoo's trainers: the checkpoint
folder `<out>/ckpt` every `--save-every-s` seconds; a rerun of the command continues it. At the
end `<out>/final` holds the drafter (fp32) and `--zoo-name NAME` also writes the zoo entry
`assets/zoo/NAME` (fp16, with a card whose tau is measured on the shipped weights).

`--distill N` trains on the target's own greedy continuations instead of corpus windows (the
authors' data: what the drafter must predict is what the target says): N windows of
`--distill-prefix` train-split tokens, each followed by `--distill-new` greedy target tokens
(`mmspec.zoo.training.distill`, cached under `<out>/distill`); the windows are then
prefix + new tokens long and `--seq-len` does not apply. `--init-from REV:DIR` starts from a
committed DFlash entry's weights (`mmspec.zoo.training.committed`), so a run may overwrite the
entry it continues; with `--layers` above the entry's, the new top layers start as identities.
`--soft-labels` scores each block row against the target's next-token distribution instead of
the token (`dflash_train.anchored_loss`).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

from mmspec.diffusion.dflash import DFlashDrafter
from mmspec.diffusion.dflash_train import new_drafter, training_loss
from mmspec.train_scaffold import (TrainLoop, command, cosine_schedule, read_meta,
                                   refuse_other_run, refuse_past_steps, run_refusals_as_exit)
from mmspec.zoo.training.committed import committed_card, committed_state, load_committed
from mmspec.zoo.paths import ZOO_DIR, model_path, positive_int

MODULE = "mmspec.zoo.training.train_dflash"
HELD_OUT = 8  # prompts for the card's tau (benchmarks/text.py's count)
NEW_TOKENS = 64


def load_target(name: str):
    """The frozen target and its tokenizer: a zoo entry or a Hugging Face folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_path(name)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer_dir = Path(path)
    if not (tokenizer_dir / "tokenizer.json").is_file():  # the zoo's text entries share one
        tokenizer_dir = ZOO_DIR / "text-tokenizer"
    return target.requires_grad_(False), AutoTokenizer.from_pretrained(tokenizer_dir)


def mask_token(tokenizer, given: int | None) -> int:
    if given is not None:
        return given
    if tokenizer.mask_token_id is None:
        raise SystemExit("--mask-token-id: the target's tokenizer has no mask token; name an id "
                         "the target never emits (DFlash embeds it with the target's embedding)")
    return int(tokenizer.mask_token_id)


def held_out_tau(drafter, target, stream: torch.Tensor) -> float:
    """Tokens per target forward (bonus included), greedy, on `HELD_OUT` 128-token windows of
    the held-out stream."""
    from mmspec.decoding import generate
    from mmspec.zoo.training.data import eval_windows

    committed = forwards = 0
    for window in eval_windows(stream, 128, HELD_OUT):
        out = generate(target, drafter, window[None], attention_mask=torch.ones_like(window[None]),
                       max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=[])
        committed, forwards = committed + out.stats.committed, forwards + out.stats.rounds
    return committed / max(forwards, 1)


def distill_data(args, target, stream: torch.Tensor) -> torch.Tensor:
    """long `[N, P + new]`: `--distill N` train windows of `--distill-prefix` tokens and the
    target's `--distill-new` greedy tokens after each (cached under `<out>/distill`)."""
    from mmspec.zoo.training.distill import target_continuations

    return target_continuations(target, stream, args.distill, args.distill_prefix,
                                args.distill_new, args.out / "distill", seed=args.seed,
                                save_every_s=args.save_every_s)


def narrow_mlps(state: dict, width: int) -> dict:
    """`state` with every layer's MLP cut to its `width` most important neurons, in their order:
    neuron j's importance is |gate_j| |up_j| |down_:,j| (the norms of its three weight slices),
    so neurons that barely move the output go first and a drafter grown deeper can stay within a
    size budget. Other tensors pass through."""
    out = dict(state)
    for key in state:
        if not key.endswith(".mlp.up_proj.weight"):
            continue
        pre = key[: -len("up_proj.weight")]
        gate, up, down = (state[pre + n + "_proj.weight"] for n in ("gate", "up", "down"))
        score = gate.norm(dim=1) * up.norm(dim=1) * down.norm(dim=0)
        keep = score.topk(width).indices.sort().values
        out[pre + "gate_proj.weight"], out[pre + "up_proj.weight"] = gate[keep], up[keep]
        out[pre + "down_proj.weight"] = down[:, keep]
    return out


def init_from_committed(model, ref: str) -> None:
    """Start from the committed entry `ref`'s weights. When it has fewer layers than `model`,
    the layers above its own start as identities (their output projections zero), so the grown
    drafter drafts exactly as the entry did until training moves them. When its MLPs are wider
    than `model`'s (`--intermediate-size`), each keeps its most important neurons
    (`narrow_mlps`): the start is then close to the entry, not equal to it."""
    state = committed_state(ref)
    had = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("layers."))
    if had > len(model.layers):
        raise ValueError(f"--init-from {ref}: it has {had} layers, more than --layers "
                         f"{len(model.layers)}")
    width, was = model.layers[0].mlp.up_proj.weight.shape[0], \
        state["layers.0.mlp.up_proj.weight"].shape[0]
    if width > was:
        raise ValueError(f"--init-from {ref}: its MLPs are {was} wide, narrower than "
                         f"--intermediate-size {width}; give at most {was}")
    if width < was:
        state = narrow_mlps(state, width)
    new = tuple(k for k in model.state_dict()
                if k.startswith("layers.") and int(k.split(".")[1]) >= had)
    load_committed(model, state, ref,
                   ("rotary_emb.inv_freq", "rotary_emb.original_inv_freq") + new)
    with torch.no_grad():
        for layer in model.layers[had:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()


def train(args) -> DFlashDrafter:
    from mmspec.zoo.training.data import random_windows, token_stream

    torch.manual_seed(args.seed)
    target, tokenizer = load_target(args.target)
    drafter = new_drafter(target, mask_token_id=mask_token(tokenizer, args.mask_token_id),
                          layers=args.layers, block_size=args.block_size,
                          target_layer_ids=args.layer_ids,
                          intermediate_size=args.intermediate_size).float().train()
    if args.init_from:
        init_from_committed(drafter.model, args.init_from)
    stream = token_stream(tokenizer, "train")
    data = distill_data(args, target, stream) if args.distill else None
    optimizer = torch.optim.AdamW(drafter.model.parameters(), lr=args.lr, weight_decay=0.0)
    run = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
           if k not in ("resume", "threads", "zoo_name", "budget", "argv")}  # torch.load-safe
    loop = TrainLoop(drafter.model, optimizer, cosine_schedule(optimizer, args.warmup, args.steps),
                     args.out / "ckpt", run, args.save_every_s)
    meta = read_meta(args.out / "ckpt") if args.resume else None
    if meta is not None:
        refuse_other_run(meta, run, args.out / "ckpt")
        refuse_past_steps(meta["step"], args.steps, args.out / "ckpt")
        loop.resume(meta)
    bar = loop.steps(args.steps, "dflash")
    for step in bar:
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        ids = (random_windows(stream, args.batch_size, args.seq_len, g) if data is None
               else data[torch.randint(0, len(data), (args.batch_size,), generator=g)])
        loop.update(training_loss(drafter, ids, args.anchors, g, args.gamma, args.soft_labels),
                    step, bar)
    loop.finish()
    drafter.eval().save_pretrained(args.out / "final")
    return drafter


def data_note(args) -> str:
    labels = "; labels: the target's next-token distribution" if args.soft_labels else ""
    return _windows_note(args) + labels


def _windows_note(args) -> str:
    if args.distill:
        return (f"{args.distill} windows of {args.distill_prefix} tokens of the stdlib corpus's "
                f"training split, each followed by {args.distill_new} greedy tokens of the "
                f"target; {args.anchors} anchor blocks each")
    return (f"random {args.seq_len}-token windows of the stdlib corpus's training split, "
            f"{args.anchors} anchor blocks each")


def export_zoo(args, drafter: DFlashDrafter, losses: list, elapsed: float) -> Path:
    """`assets/zoo/<zoo_name>`: fp16 weights in their layout and a card measured on them."""
    from mmspec.zoo.cards import write_card
    from mmspec.zoo.training.data import token_stream
    from mmspec.zoo.training.train_text import staged_export

    target, tokenizer = drafter.target, load_target(args.target)[1]
    out_dir = ZOO_DIR / args.zoo_name
    with staged_export(out_dir) as stage:
        drafter.save_pretrained(stage, dtype=torch.float16)
        shipped = DFlashDrafter.from_pretrained(stage, target).eval()
        tau = held_out_tau(shipped, target, token_stream(tokenizer, "heldout"))
        size = (stage / "model.safetensors").stat().st_size
        cfg, tail = shipped.config, losses[-100:]
        write_card(stage, {
            "name": args.zoo_name,
            "summary": f"DFlash block-diffusion drafter ({args.layers} Qwen3 layer(s) over "
                       f"{len(cfg.target_layer_ids)} of the target's layers, blocks of "
                       f"{cfg.block_size}) for {Path(args.target).name}.",
            "kind": "dflash", "target": Path(args.target).name,
            "architecture": "mmspec.DFlashDrafter (z-lab DFlashDraftModel layout, no embedding "
                            "and no LM head: the target's)",
            "params": sum(p.numel() for p in shipped.model.parameters()),
            "size_bytes": size, "dtype": "float16",
            "config": {"target_layer_ids": list(cfg.target_layer_ids),
                       "block_size": cfg.block_size, "mask_token_id": cfg.mask_token_id},
            "data": data_note(args),
            "results": {"steps": args.steps,
                        "final_train_loss": round(sum(tail) / len(tail), 4),
                        "final_train_loss_note": "mean of the last 100 steps (the anchor-block "
                                                 f"loss, decay gamma {args.gamma})",
                        "heldout_tau": round(tau, 3),
                        "heldout_tau_note": f"tokens per target forward, bonus included, greedy, "
                                            f"{NEW_TOKENS} new tokens after {HELD_OUT} held-out "
                                            f"128-token windows, fp16 weights as shipped",
                        "train_wall_time_s": round(elapsed, 1),
                        "threads": torch.get_num_threads(),
                        "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs "
                                   f"(shared)"},
            "command": command(MODULE, [a for a in args.argv if a != "--resume"]),
            **({"init_from": {"ref": args.init_from, "card": committed_card(args.init_from)}}
               if args.init_from else {}),
            **({"budget": args.budget} if args.budget else {}),
        })
    print(f"exported {out_dir}: {size} bytes, held-out tau {tau:.3f}")
    return out_dir


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="a zoo entry's name or a HF causal LM folder")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--mask-token-id", type=int, help="default: the tokenizer's mask token")
    p.add_argument("--layers", type=positive_int, default=1)
    p.add_argument("--layer-ids", type=int, nargs="+", help="default: theirs for --layers")
    p.add_argument("--intermediate-size", type=positive_int, help="default: the target's")
    p.add_argument("--block-size", type=positive_int, default=8)
    p.add_argument("--anchors", type=positive_int, default=16, help="blocks per window")
    p.add_argument("--gamma", type=float, default=4.0, help="loss decay over the block")
    p.add_argument("--soft-labels", action="store_true",
                   help="score each row against the target's next-token distribution (EAGLE's "
                        "soft labels) instead of the token (the authors')")
    p.add_argument("--steps", type=positive_int, default=1000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--seq-len", type=positive_int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--init-from", metavar="REV:DIR",
                   help="start from a committed DFlash entry, e.g. HEAD:assets/zoo/text-dflash")
    p.add_argument("--distill", type=int, default=0, metavar="N",
                   help="train on N windows of the target's greedy continuations")
    p.add_argument("--distill-prefix", type=positive_int, default=128)
    p.add_argument("--distill-new", type=positive_int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every-s", type=float, default=120.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--zoo-name", help="also write assets/zoo/NAME with a card")
    p.add_argument("--budget", help="why the zoo entry fits the zoo's size budget (card)")
    return p


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.argv = argv
    torch.set_num_threads(args.threads)
    t0 = time.time()

    def run(args):
        drafter = train(args)
        print(f"trained {args.steps} steps in {time.time() - t0:.0f} s -> {args.out / 'final'}")
        if args.zoo_name:
            meta = read_meta(args.out / "ckpt")
            export_zoo(args, drafter, meta["losses"], meta["elapsed"])

    run_refusals_as_exit(run, args)


if __name__ == "__main__":
    sys.exit(main())
