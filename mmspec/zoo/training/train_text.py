"""Train the text zoo: the shared tokenizer, the AR target, the AR drafter and the Dream-style
diffusion drafter, on the Python standard library's source.

    python -m mmspec.zoo.training.train_text tokenizer
    python -m mmspec.zoo.training.train_text text-target  # then text-drafter, then text-dlm

Seeded and resumable (`mmspec.train_scaffold`): model, optimizer, scheduler and step go to the
folder `out/zoo/<name>/ckpt/` every `--save-every-s` seconds, and a rerun of the same command
continues from there (batches are drawn from a generator seeded by the step, so a resumed run
sees the same data). At the end the weights
are written as fp16 safetensors to `assets/zoo/<name>/` (`--assets DIR`: `DIR/<name>/`, e.g. a
candidate for `benchmarks/dlm_compare.py --candidate DIR`) with config.json, the tokenizer and a
card whose held-out figures are measured on the shipped fp16 weights. The entry is staged beside
its folder and swapped in whole once the card is written (`staged_export`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import Qwen2ForCausalLM

from mmspec.interrupt import run_command
from mmspec.train_scaffold import (TrainLoop, command, cosine_schedule, read_meta,
                                   refuse_old_format, refuse_other_run, refuse_past_steps,
                                   run_refusals_as_exit)
from mmspec.diffusion.bidirectional import make_bidirectional
from mmspec.zoo.cards import write_card
from mmspec.zoo.corpus import read_texts, source_files
from mmspec.zoo.paths import OUT_DIR, ZOO_DIR, positive_int
from mmspec.zoo.tokenizer import MASK_TOKEN, load_tokenizer
from mmspec.zoo.training.committed import committed_card, committed_state, load_committed
from mmspec.zoo.training.data import eval_windows, random_windows, token_stream
from mmspec.zoo.training.distill import continuation_loss
from mmspec.zoo.training.objectives import (causal_lm_loss, masked_diffusion_loss,
                                            masked_prediction_loss)
from mmspec.zoo.training.specs import SPECS, TextModelSpec
from mmspec.zoo.training.tokenizer import train_tokenizer

MODULE = "mmspec.zoo.training.train_text"  # the `python -m` name a card records

TOKENIZER_DIR = ZOO_DIR / "text-tokenizer"
EVAL_WINDOWS = 16  # the fixed held-out slice the card reports and tests/zoo re-measures
DRAFT_BLOCK = 16  # masks appended for the DLM's drafting-use eval
DISTILL_HELDOUT = 64  # held-out target continuations the card of a distilled drafter reports
DISTILL_TARGET = "text-target"  # whose greedy continuations `--distill` trains on


def build_model(spec: TextModelSpec, tokenizer, assets: Path = ZOO_DIR) -> Qwen2ForCausalLM:
    model = Qwen2ForCausalLM(spec.qwen2_config(tokenizer))
    if spec.init_from is not None:
        path = assets / spec.init_from / "model.safetensors"
        if not path.is_file():
            raise FileNotFoundError(f"init_from={spec.init_from!r}: {path} not found; "
                                    f"train {spec.init_from} first (into the same --assets)")
        state = load_file(str(path))
        missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()},
                                                    strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise ValueError(f"init_from={spec.init_from!r} does not match {spec.name!r}: "
                             f"missing {missing}, unexpected {unexpected}")
        model.tie_weights()
    if spec.objective == "diffusion":
        make_bidirectional(model)
    return model


@contextlib.contextmanager
def staged_export(out_dir: Path):
    """Yield an empty folder to write an entry into; when the block ends without an exception,
    swap it in as `out_dir` by two renames (the previous export moved aside, then deleted).

    `out_dir` is so always one complete export (but for the instant between the renames, after
    which a rerun puts the previous one back): a run killed while writing or evaluating leaves
    the previous weights with their own card. The staging folder is `.<name>.export/new` beside
    `out_dir` (same filesystem; no card.json at the zoo level, so `mmspec.zoo.available()` skips
    it). The previous card is copied in first, so `write_card` keeps its `attempts`."""
    work = out_dir.parent / f".{out_dir.name}.export"
    stage, aside = work / "new", work / "old"
    if aside.is_dir() and not out_dir.exists():  # killed between the two renames
        aside.rename(out_dir)
    shutil.rmtree(work, ignore_errors=True)
    stage.mkdir(parents=True)
    if (out_dir / "card.json").is_file():
        shutil.copy2(out_dir / "card.json", stage / "card.json")
    try:
        yield stage
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if out_dir.exists():
        out_dir.rename(aside)
    stage.rename(out_dir)
    shutil.rmtree(work)


def training_loss(spec: TextModelSpec, model, tokens, mask_token_id: int, generator):
    if spec.objective == "causal":
        return causal_lm_loss(model, tokens)
    return masked_diffusion_loss(model, tokens, mask_token_id, generator)


def make_optimizer(model, spec: TextModelSpec) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=spec.lr, betas=(0.9, 0.95))


@torch.no_grad()
def evaluate(spec: TextModelSpec, model, windows: torch.Tensor, mask_token_id: int,
             continuations: torch.Tensor | None = None, prefix_len: int = 0) -> dict:
    """Held-out figures (nats/token) on `windows` `[N, L]`, in batches of 8; with
    `continuations` `[M, P + n]` (`mmspec.zoo.training.distill`), also how well the model predicts
    the target's greedy tokens after the first P: next-token CE (causal), or the CE of the first
    DRAFT_BLOCK (at most n) of them masked at once after the clean prefix (diffusion, the
    drafting use)."""
    model.eval()
    out = {}
    if continuations is not None:
        parts = continuations.split(8)
        if spec.objective == "causal":
            out["heldout_target_continuation_loss"] = sum(
                continuation_loss("causal", model, b, prefix_len, mask_token_id, None).item()
                * len(b) for b in parts) / len(continuations)
        else:  # the block must not reach into the prefix
            block = min(DRAFT_BLOCK, continuations.shape[1] - prefix_len)
            out[f"heldout_target_block{block}_loss"] = sum(
                masked_prediction_loss(model, b[:, :prefix_len + block], mask_token_id,
                                       block).item() * len(b)
                for b in parts) / len(continuations)
    batches = windows.split(8)
    if spec.objective == "causal":
        out["heldout_loss"] = sum(causal_lm_loss(model, b).item() * len(b)
                                  for b in batches) / len(windows)
    else:
        gen = torch.Generator().manual_seed(1234)
        out["heldout_diffusion_loss"] = sum(
            masked_diffusion_loss(model, b, mask_token_id, gen).item() * len(b)
            for b in batches) / len(windows)
        out[f"heldout_masked_block{DRAFT_BLOCK}_loss"] = sum(
            masked_prediction_loss(model, b, mask_token_id, DRAFT_BLOCK).item() * len(b)
            for b in batches) / len(windows)
    model.train()
    return out


def distill_data(args, tok, stream: torch.Tensor, split: str) -> torch.Tensor:
    """`--distill N`: N train windows (held out: DISTILL_HELDOUT) of `--distill-prefix` corpus
    tokens, each followed by `--distill-new` greedy tokens of the shipped DISTILL_TARGET."""
    from mmspec.zoo.training.distill import target_continuations

    target = Qwen2ForCausalLM.from_pretrained(str(ZOO_DIR / DISTILL_TARGET), dtype=torch.float32)
    n = args.distill if split == "train" else DISTILL_HELDOUT
    return target_continuations(target, stream, n, args.distill_prefix, args.distill_new,
                                Path(args.out) / "distill", seed=args.seed,
                                save_every_s=args.save_every_s)


def tokenizer_dir(assets: Path) -> Path:
    """The shared tokenizer of an assets folder: its own `text-tokenizer` if it has one (written by
    `train_text tokenizer --assets DIR`), else the shipped one."""
    own = Path(assets) / "text-tokenizer"
    return own if (own / "tokenizer.json").is_file() else TOKENIZER_DIR


def cmd_tokenizer(args) -> None:
    t0 = time.time()
    tok = train_tokenizer(read_texts("train"))
    out_dir = Path(args.assets) / "text-tokenizer"
    if (out_dir / "tokenizer.json").is_file():
        old = load_tokenizer(out_dir)
        if old.get_vocab() != tok.get_vocab():  # another corpus (e.g. another Python's stdlib)
            raise SystemExit(
                f"{out_dir} holds another tokenizer ({len(old)} tokens; this corpus gives "
                f"{len(tok)}, other merges): the text models trained on it would no longer match "
                f"it. Write this one elsewhere with --assets DIR, or delete {out_dir} first")
    with staged_export(out_dir) as stage:  # a kill mid-write leaves the previous tokenizer
        tok.save_pretrained(str(stage))
        _tokenizer_card(stage, tok, t0, args)
    print(f"tokenizer: {len(tok)} tokens, saved to {out_dir}")


def _tokenizer_card(out_dir: Path, tok, t0: float, args) -> None:
    held = token_stream(tok, "heldout", Path(args.out) / "data")
    held_bytes = sum(len(t.encode()) for t in read_texts("heldout"))
    write_card(out_dir, {
        "name": "text-tokenizer",
        "summary": "Byte-level BPE shared by the text target and both drafters.",
        "kind": "tokenizer",
        "vocab_size": len(tok),
        "special_tokens": {"eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id,
                           "pad_token_id": tok.pad_token_id, "mask_token": MASK_TOKEN,
                           "mask_token_id": tok.convert_tokens_to_ids(MASK_TOKEN)},
        "data": _data_card(),
        "heldout_bytes_per_token": round(held_bytes / held.numel(), 3),
        "wall_time_s": round(time.time() - t0, 3),
        "command": command(MODULE, args.argv),
    })
    print(f"tokenizer: {held_bytes / held.numel():.2f} bytes/token held out")


def _data_card() -> dict:
    return {
        "corpus": "Python standard library source (*.py under sysconfig stdlib, no site-packages)",
        "python": platform.python_version(),
        "train_files": len(source_files("train")),
        "heldout_files": len(source_files("heldout")),
        "split": "sha1(relative path) % 50 == 0 is held out (mmspec/zoo/corpus.py)",
    }



def cmd_train(args) -> None:
    changes = {k: v for k, v in (("steps", args.steps), ("lr", args.lr)) if v is not None}
    if args.init_from:  # the committed weights replace the spec's own initialisation
        changes["init_from"] = None
    spec = dataclasses.replace(SPECS[args.model], **changes)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok = load_tokenizer(tokenizer_dir(Path(args.assets)))
    mask_id = tok.convert_tokens_to_ids(MASK_TOKEN)
    streams = Path(args.out) / "data"  # the token streams' cache, beside the checkpoints
    train = token_stream(tok, "train", streams)
    held = eval_windows(token_stream(tok, "heldout", streams), spec.seq_len, EVAL_WINDOWS)
    distill = held_continuations = None
    if args.distill:
        distill = distill_data(args, tok, train, "train")
        held_continuations = distill_data(args, tok, token_stream(tok, "heldout", streams),
                                          "heldout")

    model = build_model(spec, tok, Path(args.assets))
    if args.init_from:
        load_committed(model, committed_state(args.init_from), args.init_from, ("lm_head.weight",))
        model.tie_weights()
    opt = make_optimizer(model, spec)
    ckpt_path = Path(args.out) / spec.name / "ckpt"
    # what a checkpoint must share with this run to be resumed by it (--steps may grow)
    run = {key: getattr(args, key) for key in ("seed", "lr", "init_from", "distill",
                                               "distill_prefix", "distill_new",
                                               "distill_block_share")}
    refuse_old_format(ckpt_path.with_name("ckpt.pt"), ckpt_path)
    loop = TrainLoop(model, opt, cosine_schedule(opt, spec.warmup, spec.steps), ckpt_path, run,
                     args.save_every_s)
    meta = read_meta(ckpt_path)
    if meta is not None:
        refuse_other_run(meta, run, ckpt_path)
        refuse_past_steps(meta["step"], spec.steps, ckpt_path)
        loop.resume(meta)
        print(f"resumed {spec.name} at step {loop.done} ({loop.elapsed:.0f}s trained)")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{spec.name}: {n_params / 1e6:.2f}M params, {train.numel()} train tokens")

    model.train()
    bar = loop.steps(spec.steps, spec.name, mininterval=5)
    try:
        for step in bar:
            gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
            if distill is None:
                tokens = random_windows(train, spec.batch_size, spec.seq_len, gen)
                loss = training_loss(spec, model, tokens, mask_id, gen)
            else:
                rows = torch.randint(0, len(distill), (spec.batch_size,), generator=gen)
                loss = continuation_loss(spec.objective, model, distill[rows],
                                         args.distill_prefix, mask_id, gen,
                                         args.distill_block_share)
            loop.update(loss, step, bar)
    except KeyboardInterrupt:
        raise loop.interrupted(spec.name, spec.steps,
                               "rerun the same command to resume") from None
    loop.finish()
    losses, elapsed = loop.losses, loop.elapsed
    export(spec, model, tok, losses, elapsed, args, n_params, held, mask_id, held_continuations)


def export(spec, model, tok, losses, elapsed, args, n_params, held, mask_id,
           held_continuations=None) -> None:
    out_dir = Path(args.assets) / spec.name
    with staged_export(out_dir) as stage:
        model.to(torch.float16).save_pretrained(str(stage))
        tok.save_pretrained(str(stage))
        shipped = Qwen2ForCausalLM.from_pretrained(str(stage), dtype=torch.float32)
        if spec.objective == "diffusion":
            make_bidirectional(shipped)
        results = evaluate(spec, shipped, held, mask_id, held_continuations,
                           args.distill_prefix)
        size_mb = (stage / "model.safetensors").stat().st_size / 1e6
        write_card(stage, _card(spec, tok, losses, elapsed, args, n_params, mask_id, results,
                                size_mb))
    print(f"exported {out_dir}: {size_mb:.2f} MB, {results}")


def _objective(spec: TextModelSpec, args) -> str:
    """The card's account of the loss this run trained on, from its own arguments."""
    if not args.distill:
        return {
            "causal": "next-token cross-entropy",
            "diffusion": "masked diffusion: t~U(0,1] per row, mask each token w.p. t, CE on "
                         "masked tokens weighted 1/t averaged over tokens; half the rows keep a "
                         "random clean prefix (Dream SFT rule); position 0 never masked",
        }[spec.objective]
    p, n = args.distill_prefix, args.distill_new
    if spec.objective == "causal":
        return (f"next-token cross-entropy on the {n} target tokens only (the {p}-token corpus "
                f"prefix is context, not scored)")
    share = args.distill_block_share
    random_rows = (f"t~U(0,1] per row, each of the {n} continuation tokens masked w.p. t, CE on "
                   f"masked tokens weighted 1/t averaged over the {n}")
    block_rows = (f"a block of masks from a random start in the continuation to its end, t=1 "
                  f"(the drafting case), CE averaged over the {n}")
    rows = (f"every row: {random_rows}" if share == 0 else
            f"every row: {block_rows}" if share == 1 else
            f"a share {share} of the rows: {block_rows}; the others: {random_rows}")
    return (f"masked diffusion on the target's continuation only: the whole {p}-token corpus "
            f"prefix clean in every row; {rows}")


def _card(spec, tok, losses, elapsed, args, n_params, mask_id, results, size_mb) -> dict:
    tail = losses[-50:]
    conventions = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
                   "mask_token_id": mask_id}
    if spec.objective == "diffusion":
        conventions.update(
            attention="bidirectional (config.is_causal=False; mmspec.zoo.load also sets every "
                      "attention module's is_causal=False)",
            shift=True,
            shift_meaning="Dream-style: the logits at position i predict token i+1; to fill a "
                          "mask at position p read logits[p-1] "
                          "(DiffusionDrafter(..., config=DiffusionDrafterConfig(shift=True)))",
        )
    summary = {
        "causal": "Causal Qwen2 LM trained on stdlib Python source.",
        "diffusion": "Dream-style masked diffusion LM: Qwen2 layers used bidirectionally, "
                     "shifted logits, a <|mask|> token.",
    }[spec.objective]
    return {
        "name": spec.name,
        "summary": summary,
        "kind": "causal-lm" if spec.objective == "causal" else "diffusion-lm",
        "architecture": "Qwen2ForCausalLM",
        "params": n_params,
        "size_mb": round(size_mb, 2),
        "dtype": "float16",
        "config": {k: v for k, v in spec.__dict__.items() if k != "name"},
        "drafters": list(spec.drafters),
        "conventions": conventions,
        "objective": _objective(spec, args),
        "data": _data_card(),
        "results": {
            "final_train_loss": round(sum(tail) / len(tail), 4),
            "final_train_loss_note": "mean of the last 50 steps (nats/token)",
            **{k: round(v, 4) for k, v in results.items()},
            "heldout_slice": f"mmspec.zoo.training.data.eval_windows(heldout stream, "
                             f"{spec.seq_len}, {EVAL_WINDOWS}); fp16 weights as shipped",
            "wall_time_s": round(elapsed, 3),
            "threads": args.threads,
            "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs (shared)",
            "seed": args.seed,
        },
        "command": command(MODULE, args.argv),
        **_fine_tune_card(args),
    }


def _fine_tune_card(args) -> dict:
    card = {}
    if args.distill:
        card["distill"] = {
            "data": f"{args.distill} windows of {args.distill_prefix} train-split tokens, each "
                    f"followed by {args.distill_new} greedy tokens of the shipped text-target "
                    f"(mmspec.zoo.training.distill.target_continuations, seed {args.seed})",
            "loss": "on the target's tokens only (the corpus prefix is clean context); see "
                    "objective",
            "block_share": args.distill_block_share,
            "heldout": f"{DISTILL_HELDOUT} held-out-split windows continued alike",
        }
    if args.init_from:
        card["init_from"] = {"ref": args.init_from, "card": committed_card(args.init_from)}
    return card


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=["tokenizer", *SPECS])
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="override the spec's step count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--out", default=str(OUT_DIR), help="checkpoint folder (git-ignored)")
    parser.add_argument("--assets", default=str(ZOO_DIR),
                        help="where the entry goes (DIR/<name>/) and where a spec's init_from "
                             "entry and the tokenizer (DIR/text-tokenizer/, else the shipped "
                             "one) are read; default the shipped assets/zoo")
    parser.add_argument("--save-every-s", type=float, default=120.0)
    parser.add_argument("--lr", type=float, default=None, help="override the spec's peak LR")
    parser.add_argument("--init-from", default=None, metavar="REV:DIR",
                        help="fine-tune from a committed entry, e.g. HEAD:assets/zoo/text-dlm")
    parser.add_argument("--distill", type=int, default=0, metavar="N",
                        help="train on N greedy continuations of the shipped text-target "
                             "(mmspec.zoo.training.distill), scoring the continuation only")
    parser.add_argument("--distill-prefix", type=int, default=224)
    parser.add_argument("--distill-new", type=int, default=32)
    parser.add_argument("--distill-block-share", type=float, default=0.0,
                        help="DLM: share of rows whose continuation is masked from a random "
                             "start to the end (the drafting case) instead of at random")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    if args.distill < 0:
        parser.error(f"--distill must be >= 0, got {args.distill}")
    if args.lr is not None and not args.lr > 0:
        parser.error(f"--lr must be > 0, got {args.lr}")
    if not 0.0 <= args.distill_block_share <= 1.0:
        parser.error(f"--distill-block-share must be in [0, 1], got {args.distill_block_share}")
    if args.model == "tokenizer":
        cmd_tokenizer(args)
    else:
        run_refusals_as_exit(cmd_train, args)


if __name__ == "__main__":
    sys.exit(run_command(main))
