"""`--arch dflash` of `mmspec.vision.train`: a DFlash block-diffusion drafter
(`mmspec.diffusion.dflash_train`) trained for a causal LM target on the shared trainer.

    python -m mmspec.vision.train --arch dflash --target PATH --data samples.pt --out run \
        --block-size 16 --draft-layers 5 [--format speculators]

The data and the rest of the run (the target's answers or `--supervise all --answer-tokens 0`
windows, checkpoints, `--resume`, `--eval-every` held-out tau) are the trainer's. A step on a
sample draws up to `--anchors` blocks whose labels are all supervised (the answer's tokens; with
`--supervise all` the window's from its third on, as an anchor needs a token before it) and
scores them with the authors' anchor-block loss, the rows of a block weighted
exp(-(k - 1) / `--gamma`). The drafter is written in the
authors' layout (what `DFlashDrafter.from_pretrained` and their loader read), or with
`--format speculators` in vLLM's speculators layout; checkpoints are always in the authors'.

Defaults are the authors': blocks of 16 and 5 draft layers (their `*-DFlash-b16` drafters), the
decay 7 for blocks of 16, 512 anchors per sample and the learning rate 6e-4 (SpecForge's Qwen3-8B
DFlash recipe). Deliberate differences: the trainer's AdamW betas, linear schedule and gradient
value clipping (ViSpec's) instead of SpecForge's 4% warm-up and norm clipping at 1.0, and the
draft layers start from the target's top layer where the shapes agree (`new_drafter`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mmspec.diffusion.dflash import DFlashDrafter
from mmspec.diffusion.dflash_checkpoint import (build_target_layer_ids, load_weights,
                                                read_config, read_weights)
from mmspec.diffusion.dflash_speculators import check_exportable
from mmspec.diffusion.dflash_train import new_drafter

BLOCK_SIZE = 16  # z-lab's *-DFlash-b16 drafters
DRAFT_LAYERS = 5  # z-lab's Qwen3-8B-DFlash-b16 (paper: "a lightweight 5-layer drafter")
LR = 6e-4  # SpecForge's Qwen3-8B DFlash recipe (the trainer keeps its schedule and clipping)
# settings of ViSpec's and EAGLE-3's that the DFlash loss and drafter do not read
NOT_DFLASH = ("noise", "feature_weight", "tv_weight", "rank_weight", "ce_weight", "rank_top",
              "draft_vocab_size")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The DFlash drafter's own flags (its loss settings are `TrainConfig` fields)."""
    p.add_argument("--block-size", type=int, default=None,
                   help=f"dflash: rows of a draft block, the anchor and its masks (default: "
                        f"{BLOCK_SIZE}, the authors' b16)")
    p.add_argument("--draft-layers", type=int, default=None,
                   help=f"dflash: the drafter's layers (default: {DRAFT_LAYERS}, the authors')")
    p.add_argument("--target-layer-ids", type=int, nargs="+", default=None, metavar="ID",
                   help="dflash: the target layers whose outputs are the context (default: the "
                        "authors' build_target_layer_ids for --draft-layers)")
    p.add_argument("--mask-token-id", type=int, default=None,
                   help="dflash: the id of the block's mask rows (default: the tokenizer's mask "
                        "token; give one the target never emits when it has none)")
    p.add_argument("--format", default=None, choices=["dflash", "speculators"],
                   help="dflash: the drafter's layout in --out, the authors' (default) or vLLM's "
                        "speculators")


def given_flags(args) -> list[str]:
    """The DFlash-only flags given on the command line."""
    return [flag for flag, value in (("--block-size", args.block_size),
                                     ("--draft-layers", args.draft_layers),
                                     ("--target-layer-ids", args.target_layer_ids),
                                     ("--mask-token-id", args.mask_token_id),
                                     ("--format", args.format)) if value is not None]


def refuse_other_flags(p: argparse.ArgumentParser, args) -> None:
    """`p.error` for a flag of ViSpec's or EAGLE-3's that `--arch dflash` does not read (given,
    or off its default)."""
    others = [("--drafter", args.drafter), ("--text-only", args.text_only),
              ("--multi-layer", args.multi_layer), ("--feature-layers", args.feature_layers),
              ("--training-time-test", args.training_time_test),
              ("--rollout-steps", args.rollout_steps), ("--heads", args.heads)]
    others += [("--" + name.replace("_", "-"), getattr(args, name) != p.get_default(name))
               for name in NOT_DFLASH]
    given = [flag for flag, value in others if value not in (None, False)]
    if given:
        p.error(f"{', '.join(given)}: not for --arch dflash (its loss is the anchor-block cross "
                f"entropy; its shape flags are --draft-layers, --target-layer-ids, --block-size, "
                f"--intermediate-size and --kv-heads)")


def _mask_token_id(p: argparse.ArgumentParser, args, vocab: int) -> int:
    """--mask-token-id, else the target's tokenizer's mask token; `p.error` when there is none
    or it lies outside the target's embedding."""
    given = args.mask_token_id
    if given is None:
        from transformers import AutoTokenizer

        try:
            given = AutoTokenizer.from_pretrained(args.target).mask_token_id
        except (OSError, ValueError):  # no tokenizer in the folder
            given = None
        if given is None:
            p.error(f"--mask-token-id: the target {args.target} has no tokenizer with a mask "
                    f"token; give an id the target never emits (DFlash embeds it with the "
                    f"target's embedding)")
    if not 0 <= given < vocab:
        p.error(f"--mask-token-id must be an id of the target's embedding [0, {vocab}), got "
                f"{given}")
    return int(given)


def start_drafter(p: argparse.ArgumentParser, args, target) -> DFlashDrafter:
    """The new DFlash drafter of the command line, fp32; each bad flag is one `p.error`."""
    text = target.config.get_text_config(decoder=True)
    layers, heads = int(text.num_hidden_layers), int(text.num_attention_heads)
    draft_layers = args.draft_layers or DRAFT_LAYERS
    block = args.block_size or BLOCK_SIZE
    ids = args.target_layer_ids or build_target_layer_ids(layers, draft_layers)
    for flag, value, low in (("--draft-layers", draft_layers, 1), ("--block-size", block, 2),
                             ("--intermediate-size", args.intermediate_size or 1, 1),
                             ("--kv-heads", args.kv_heads or 1, 1)):
        if value < low:
            p.error(f"{flag} must be >= {low}, got {value}")
    if not all(0 <= i < layers for i in ids):
        p.error(f"--target-layer-ids must lie in [0, {layers}) (the target's {layers} layers), "
                f"got {list(ids)}")
    if args.kv_heads and heads % args.kv_heads:
        p.error(f"--kv-heads must divide the target's {heads} attention heads, got "
                f"{args.kv_heads}")
    vocab = target.get_input_embeddings().weight.shape[0]
    drafter = new_drafter(target, mask_token_id=_mask_token_id(p, args, vocab),
                          layers=draft_layers, block_size=block, target_layer_ids=ids,
                          intermediate_size=args.intermediate_size, num_kv_heads=args.kv_heads)
    if args.format == "speculators":
        try:
            check_exportable(drafter)
        except ValueError as err:  # "format: 'speculators' reads the target's last layer ..."
            p.error(f"--format speculators: {str(err).removeprefix('format: ')}")
    return drafter.float()


def load_checkpoint(drafter: DFlashDrafter, ckpt: Path) -> None:
    """The drafter saved in checkpoint folder `ckpt` into `drafter`, fp32 as written;
    ValueError when it is not this run's drafter (another shape or DFlash config)."""
    raw = read_config(ckpt)
    own = {k: v for k, v in drafter.raw_config.items() if k != "dtype"}
    saved = {k: v for k, v in raw.items() if k != "dtype"}
    differ = sorted(k for k in own.keys() | saved.keys() if own.get(k) != saved.get(k))
    if differ:
        shown = "; ".join(f"{k} {saved.get(k)!r} there, {own.get(k)!r} here" for k in differ)
        raise ValueError(f"the checkpoint in {ckpt} holds another DFlash drafter ({shown}): "
                         f"resume it with the settings it was started with")
    load_weights(drafter.model, read_weights(ckpt), ckpt)
