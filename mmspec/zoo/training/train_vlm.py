"""Train the VLM zoo on synthetic scenes (`mmspec/zoo/scenes.py`): the processor, a tiny LLaVA
target, a text-only assistant (HF assisted generation's baseline), and the ViSpec drafter with its
text-only ablation.

    python -m mmspec.zoo.training.train_vlm tokenizer
    python -m mmspec.zoo.training.train_vlm vlm-target     # a 1000-step fine-tune
    python -m mmspec.zoo.training.train_vlm vlm-assistant
    python -m mmspec.zoo.training.train_vlm vlm-vispec     # then vlm-text-drafter; need vlm-target

Seeded and resumable: the state goes to `out/zoo/<name>/` every `--save-every-s` seconds (the
drafters: every 100 steps, by `mmspec.vision.train`) and `--resume` continues from there (batches
are drawn from a generator seeded by the step) if it was saved with the same `--seed` and no more
than `--steps` steps. At the end the weights are written as fp16 safetensors to
`assets/zoo/<name>/` (`--zoo DIR`: `DIR/<name>/`) with a card whose held-out figures are measured
on the shipped fp16 weights; the entry is staged beside its folder and swapped in whole once the
card is written (`train_text.staged_export`). The processor goes to, and is read from,
`DIR/vlm-processor/` (the shipped one when DIR has none).

The drafters are trained by `mmspec.vision.train.train` on the target's own greedy answers. Those
answers are precomputed here in batches of prompts of equal length (no padding) into the answer
cache that `train` reads: the same greedy answers, an order of magnitude faster than one at a time.
"""

from __future__ import annotations


import argparse
import dataclasses
import hashlib
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, LlavaForConditionalGeneration

from mmspec.atomic import save_atomic, write_text_atomic
from mmspec.eagle.eagle3_train import feature_layers
from mmspec.interrupt import run_command
from mmspec.train_scaffold import (RunExists, TrainLoop, command, cosine_schedule, read_meta,
                                   refuse_old_format, refuse_other_run, refuse_past_steps,
                                   run_refusals_as_exit, saved_model_state)
from mmspec.vision import ViSpecDrafter
from mmspec.vision.train import (
    TrainConfig,
    _checkpoint_dirs,
    held_out_tau,
    precompute_answers,
    refuse_to_overwrite,
    train,
)
from mmspec.zoo.cards import write_card
from mmspec.zoo.paths import OUT_DIR, ZOO_DIR, positive_int
from mmspec.zoo.scenes import (
    HELDOUT_START,
    NO_SHAPE,
    PATCH_COLOURS,
    SHAPES,
    colour_question,
    corpus,
    make_scene,
    patch_labels,
    question_answer,
    render_scene,
)
from mmspec.zoo.training.committed import committed_card, git_show
from mmspec.zoo.training.experiments import EXPERIMENTS
from mmspec.zoo.training.tokenizer import train_processor
from mmspec.zoo.training.train_text import staged_export
from mmspec.zoo.training.vlm_data import (
    answer_loss,
    heldout_seeds,
    image_word_loss,
    scene_batch,
    train_seeds,
    word_ids,
)
from mmspec.zoo.training.vlm_specs import SPECS, DrafterSpec, VLMSpec
from mmspec.zoo.vlm_processor import load_processor, vlm_inputs

MODULE = "mmspec.zoo.training.train_vlm"  # the `python -m` name a card records

PROCESSOR_DIR = ZOO_DIR / "vlm-processor"
TOKENIZER_SEEDS = range(20_000)
HELDOUT_SCENES = 64  # the held-out slice the target's card reports and tests/zoo re-measures
COLOUR_SCENES = 40  # held-out scenes asked "What colour is the <first shape>?"
ONE_SHAPE_SCENES = 30  # held-out one-shape scenes asked the same
DRAFTER_SEEDS = 5_000_000  # the drafters' training prompts: a training-split range the target
#                            sampled from like any other (no held-out scene)
DATA_CARD = {
    "generator": "mmspec.zoo.scenes: seeded scene graph (1-4 shapes of 6 kinds, 8 colours, 2 "
                 "sizes, 3x3 grid places, 30% a word) rendered 64x64 with Pillow; descriptions, "
                 "colour / shape / count / text / background questions",
    "split": f"scene seeds < {HELDOUT_START} train, >= {HELDOUT_START} held out",
}



def _machine(args) -> dict:
    return {"threads": args.threads, "seed": args.seed,
            "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs (shared)"}


def processor_dir(zoo: Path) -> Path:
    """The processor of a zoo folder: its own `vlm-processor` if it has one (written by
    `train_vlm tokenizer --zoo DIR`), else the shipped one."""
    own = Path(zoo) / "vlm-processor"
    return own if (own / "tokenizer.json").is_file() else PROCESSOR_DIR


def refuse_other_vocab(state: dict, tokenizer, what: str) -> None:
    """ValueError when the token embedding in `state` (the weights of `what`) has another number
    of rows than `tokenizer` has tokens: trained with another processor, its ids mean other
    tokens."""
    rows = next(v.shape[0] for k, v in state.items() if k.endswith("embed_tokens.weight"))
    if rows != len(tokenizer):
        raise ValueError(f"--processor {tokenizer.name_or_path}: a vocabulary of "
                         f"{len(tokenizer)} tokens, but {what} embeds {rows}; pass the processor "
                         f"it was trained with (--processor, or a --zoo DIR holding it)")


def cmd_tokenizer(args) -> None:
    t0 = time.time()
    processor = train_processor(corpus(TOKENIZER_SEEDS))
    tok = processor.tokenizer
    out_dir = Path(args.zoo) / "vlm-processor"
    if (out_dir / "tokenizer.json").is_file():
        old = load_processor(out_dir).tokenizer
        if old.get_vocab() != tok.get_vocab():
            raise SystemExit(
                f"{out_dir} holds another processor ({len(old)} tokens; these scenes give "
                f"{len(tok)}, other merges): the VLM entries trained on it would no longer match "
                f"it. Write this one elsewhere with --zoo DIR, or delete {out_dir} first")
    with staged_export(out_dir) as stage:  # a kill mid-write leaves the previous processor
        processor.save_pretrained(str(stage))
        _processor_card(stage, tok, t0, args)
    print(f"processor: {len(tok)} tokens -> {out_dir}")


def _processor_card(out_dir: Path, tok, t0: float, args) -> None:
    write_card(out_dir, {
        "name": "vlm-processor",
        "summary": "LlavaProcessor of the VLM zoo: byte-level BPE on the scene texts, <image>, "
                   "LLaVA-1.5 chat template, 64x64 CLIP image processor.",
        "kind": "processor",
        "vocab_size": len(tok),
        "special_tokens": {"pad": tok.pad_token_id, "bos": tok.bos_token_id,
                           "eos": tok.eos_token_id, "image": tok.convert_tokens_to_ids("<image>")},
        "data": {**DATA_CARD, "tokenizer_seeds": f"{TOKENIZER_SEEDS.start}-{TOKENIZER_SEEDS.stop}"},
        "wall_time_s": round(time.time() - t0, 3),
        "command": command(MODULE, args.argv),
    })


# --- target and assistant ---

def build_model(spec: VLMSpec, tokenizer):
    if not spec.vision_layers:
        return LlamaForCausalLM(spec.text_config(tokenizer))
    config = spec.llava_config(tokenizer)
    if spec.init_from:
        model = committed_model(spec.init_from, config, tokenizer)
    else:
        model = LlavaForConditionalGeneration(config)
    with torch.no_grad():  # bring the projected image features into the text-embedding range
        model.model.multi_modal_projector.linear_2.weight.mul_(spec.projector_gain)
        model.model.multi_modal_projector.linear_2.bias.mul_(spec.projector_gain)
    return model


def committed_model(ref: str, config, tokenizer):
    """`<git rev>:<entry dir>`'s weights in fp32 (read with `git show`, so a fine-tune starts from
    the same weights after the entry has been overwritten); refused if they embed another
    vocabulary than `tokenizer`'s."""
    import tempfile

    from safetensors.torch import load

    blob = git_show(ref, "model.safetensors")
    refuse_other_vocab(load(blob), tokenizer, f"init_from {ref}")
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        (Path(tmp) / "model.safetensors").write_bytes(blob)
        return LlavaForConditionalGeneration.from_pretrained(tmp, dtype=torch.float32)


def pretrain_vision(model, spec: VLMSpec, processor, ckpt_dir: Path, resume: bool,
                    save_every_s: float = 120.0, resume_command: str = "") -> dict:
    """Stage 0: train the CLIP tower alone to say, for every patch, which colour it shows and which
    kind of shape (or none), from the scene graph (`scenes.patch_labels`), with two linear heads
    that are thrown away afterwards. Returns held-out patch accuracies; the tower is cached in
    `ckpt_dir/vision.pt` (a resumed run reuses it).

    The loop is the scaffold's (`TrainLoop`, as every trainer's): batches of 32 scenes drawn by
    the step, warm-up of 50 steps, then the zoo's cosine down to 10% (`cosine_schedule`), a
    checkpoint `ckpt_dir/vision-ckpt/` every `save_every_s` seconds and on Ctrl-C, which
    `resume` continues (`resume_command` is printed to do so).

    Why: shape kinds are what an end-to-end tower fails to learn, and this stage teaches them.
    Trained on further with the LM the pre-trained tower helped nothing; kept frozen
    (`VLMSpec.freeze_vision`) it lifted the colour accuracy on one-shape scenes well above the
    end-to-end tower's, while multi-shape scenes stayed weak (the figures: vlm-target card
    `attempts`)."""
    tower = model.model.vision_tower
    path = ckpt_dir / "vision.pt"
    patch = tower.config.patch_size
    hidden = tower.config.hidden_size
    heads = torch.nn.ModuleDict({"colour": torch.nn.Linear(hidden, len(PATCH_COLOURS)),
                                 "kind": torch.nn.Linear(hidden, len(SHAPES) + 1)})

    def batch(seeds):
        scenes = [make_scene(s) for s in seeds]
        pixels = processor.image_processor([render_scene(s) for s in scenes],
                                           return_tensors="pt")["pixel_values"]
        labels = [patch_labels(s, patch) for s in scenes]
        return pixels, torch.tensor([c for c, _ in labels]), torch.tensor([k for _, k in labels])

    def accuracy(data) -> dict:
        with torch.no_grad():
            h = tower(data[0]).last_hidden_state[:, 1:]
            shape = data[2] != NO_SHAPE
            colour = heads["colour"](h).argmax(-1) == data[1]
            kind = heads["kind"](h).argmax(-1) == data[2]
        return {"patch_colour": round(colour.float().mean().item(), 4),
                "shape_patch_kind": round(kind[shape].float().mean().item(), 4)}

    held = batch(heldout_seeds(128))
    if resume and path.is_file():
        state = torch.load(path, weights_only=True)
        tower.load_state_dict(state["tower"])
        heads.load_state_dict(state["heads"])
        print(f"vision tower: pre-trained stage reused from {path}")
        return accuracy(held)
    stage = torch.nn.ModuleDict({"tower": tower, "heads": heads})
    steps = spec.vision_pretrain_steps
    ckpt = ckpt_dir / "vision-ckpt"
    refuse_old_format(ckpt_dir / "vision-partial.pt", ckpt)
    meta = read_meta(ckpt)
    if meta is not None and not resume:
        raise RunExists(f"{ckpt} exists: pass --resume to continue it, or delete it")
    run = {"seed": 1, "lr": spec.vision_pretrain_lr}  # the stage's data and rate, whatever --seed
    opt = torch.optim.AdamW(stage.parameters(), lr=spec.vision_pretrain_lr, weight_decay=0.05)
    loop = TrainLoop(stage, opt, cosine_schedule(opt, 50, steps), ckpt, run, save_every_s)
    if meta is not None:
        refuse_other_run(meta, run, ckpt)
        refuse_past_steps(meta["step"], steps, ckpt)
        loop.resume(meta)
        print(f"vision tower: resumed at step {loop.done}")
    bar = loop.steps(steps, f"{spec.name} vision tower")
    try:
        for step in bar:
            pixels, colours, kinds = batch(train_seeds(step, 32, seed=1))
            h = tower(pixels).last_hidden_state[:, 1:]
            loss = (torch.nn.functional.cross_entropy(heads["colour"](h).flatten(0, 1),
                                                      colours.flatten())
                    + torch.nn.functional.cross_entropy(heads["kind"](h).flatten(0, 1),
                                                        kinds.flatten()))
            loop.update(loss, step, bar)
    except KeyboardInterrupt:
        raise loop.interrupted(f"{spec.name} vision tower", steps,
                               f"resume: {resume_command}") from None
    save_atomic({"tower": tower.state_dict(), "heads": heads.state_dict()}, path)
    shutil.rmtree(ckpt, ignore_errors=True)  # the finished stage lives on in vision.pt
    result = accuracy(held)
    print(f"vision tower: held-out {result}")
    return result


def _is_vision(name: str) -> bool:
    return "vision_tower" in name or "multi_modal_projector" in name


@torch.no_grad()
def heldout_loss(model, processor, with_images: bool, n: int) -> float:
    """Answer-token cross-entropy (nats/token) over the first `n` held-out scenes."""
    model.eval()
    total = count = 0
    seeds = heldout_seeds(n)
    for i in range(0, n, 16):
        batch = scene_batch(processor, seeds[i:i + 16])
        tokens = int((batch["labels"][:, 1:] != -100).sum())
        total += answer_loss(model, batch, with_images).item() * tokens
        count += tokens
    return total / count


def colour_seeds(n: int) -> range:
    """Held-out scenes for the colour question (apart from the loss slice)."""
    return range(HELDOUT_START + 10_000, HELDOUT_START + 10_000 + n)


def one_shape_seeds(n: int) -> list[int]:
    """The first `n` scenes of `colour_seeds`' range that show exactly one shape."""
    seeds, seed = [], HELDOUT_START + 10_000
    while len(seeds) < n:
        if len(make_scene(seed).shapes) == 1:
            seeds.append(seed)
        seed += 1
    return seeds


@torch.no_grad()
def colour_accuracy(model, processor, n: int, seeds=None) -> float:
    """Share of held-out scenes (`colour_seeds(n)` unless `seeds` are given) where the greedy
    answer to "What colour is the <first shape>?" is exactly the reference answer."""
    model.eval()
    right = 0
    seeds = colour_seeds(n) if seeds is None else seeds
    n = len(seeds)
    for seed in seeds:
        scene = make_scene(seed)
        question, reference = colour_question(scene)
        inputs = vlm_inputs(processor, render_scene(scene), question)
        out = model.generate(**inputs, do_sample=False, max_new_tokens=24)
        text = processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:],
                                          skip_special_tokens=True).strip()
        right += text == reference
    return right / n


def recipes() -> dict:
    """Every recipe `main` trains, by name: the shipped entries' (`vlm_specs.SPECS`) and the
    experiments without shipped weights (`experiments.EXPERIMENTS`)."""
    return {**SPECS, **EXPERIMENTS}


def cmd_train(args) -> None:
    spec = recipes()[args.model]
    if args.steps is not None:
        spec = VLMSpec(**{**spec.__dict__, "steps": args.steps})
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    processor = load_processor(args.processor or processor_dir(args.zoo))
    processor.patch_size = spec.patch_size  # <image> expands to this spec's number of patches
    with_images = spec.vision_layers > 0
    ckpt_path = Path(args.out) / spec.name / "ckpt"
    old_format = ckpt_path.with_name("ckpt.pt")
    meta = read_meta(ckpt_path)
    if not args.resume and (meta is not None or old_format.exists()):
        # as train_video: never overwrite a run's state
        raise RunExists(f"{ckpt_path if meta else old_format} exists: pass --resume to "
                        f"continue it, or delete it")
    run = {"seed": args.seed}  # what a resumed checkpoint must share (--steps may grow)
    refuse_old_format(old_format, ckpt_path)
    if meta is not None:  # refused before anything is built or trained
        refuse_other_run(meta, run, ckpt_path, "resume with its settings, ")
        refuse_past_steps(meta["step"], spec.steps, ckpt_path)
        refuse_other_vocab(saved_model_state(ckpt_path), processor.tokenizer, str(ckpt_path))
    model = build_model(spec, processor.tokenizer)
    vision_pretrain = {}
    if spec.vision_pretrain_steps and meta is None:
        t_vision = time.time()
        vision_pretrain = pretrain_vision(model, spec, processor, ckpt_path.parent, args.resume,
                                          args.save_every_s,
                                          command(MODULE, args.argv, resume=True))
        vision_pretrain["wall_time_s"] = round(time.time() - t_vision, 3)
    if spec.freeze_vision:  # pre-trained above, then fixed: not in the optimizer
        model.model.vision_tower.requires_grad_(False)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    # each group's peak rate; the schedule scales them alike
    opt = torch.optim.AdamW([
        {"params": [p for n, p in named if p.ndim >= 2 and _is_vision(n) == vision],
         "weight_decay": 0.1, "lr": spec.lr * (spec.vision_lr_mult if vision else 1.0)}
        for vision in (False, True)] + [
        {"params": [p for n, p in named if p.ndim < 2 and _is_vision(n) == vision],
         "weight_decay": 0.0, "lr": spec.lr * (spec.vision_lr_mult if vision else 1.0)}
        for vision in (False, True)], lr=spec.lr, betas=(0.9, 0.95))
    loop = TrainLoop(model, opt, cosine_schedule(opt, spec.warmup, spec.steps), ckpt_path, run,
                     args.save_every_s)
    loop.extra["vision_pretrain"] = vision_pretrain
    if meta is not None:
        loop.resume(meta)
        vision_pretrain = loop.extra.get("vision_pretrain", {})
        print(f"resumed {spec.name} at step {loop.done} ({loop.elapsed:.0f}s trained)")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{spec.name}: {n_params / 1e6:.2f}M params")

    aux = None
    if spec.image_word_loss:  # the projector's output is caught in the forward, not recomputed
        aux = {"colours": word_ids(processor.tokenizer, PATCH_COLOURS),
               "kinds": word_ids(processor.tokenizer, SHAPES)}
        model.model.multi_modal_projector.register_forward_hook(
            lambda module, inputs, output: aux.__setitem__("features", output))
    model.train()
    if spec.freeze_vision:
        model.model.vision_tower.eval()
    bar = loop.steps(spec.steps, spec.name)
    try:
        for step in bar:
            batch = scene_batch(processor, train_seeds(step, spec.batch_size, args.seed),
                                spec.describe_share, spec.colour_share,
                                patch=spec.patch_size if aux else None)
            loss = answer_loss(model, batch, with_images, spec.per_answer_loss)
            if aux:
                loss = loss + spec.image_word_loss * image_word_loss(
                    model.lm_head, aux.pop("features"), batch, aux["colours"], aux["kinds"])
            loop.update(loss, step, bar)
    except KeyboardInterrupt:
        raise loop.interrupted(spec.name, spec.steps,
                               f"resume: {command(MODULE, args.argv, resume=True)}") from None
    loop.finish()
    losses, elapsed = loop.losses, loop.elapsed
    export_model(spec, model, processor, losses, elapsed, args, n_params, vision_pretrain)


def export_model(spec: VLMSpec, model, processor, losses, elapsed, args, n_params,
                 vision_pretrain=None) -> None:
    out_dir = Path(args.zoo) / spec.name
    with staged_export(out_dir) as stage:  # a kill mid-export leaves the previous entry
        model.to(torch.float16).save_pretrained(str(stage))
        processor.save_pretrained(str(stage))
        cls = type(model)
        shipped = cls.from_pretrained(str(stage), dtype=torch.float32)
        with_images = spec.vision_layers > 0
        results = {"heldout_loss": round(heldout_loss(shipped, processor, with_images,
                                                      HELDOUT_SCENES), 4)}
        if with_images:
            results["heldout_colour_accuracy"] = colour_accuracy(shipped, processor,
                                                                 COLOUR_SCENES)
            results["heldout_one_shape_colour_accuracy"] = round(colour_accuracy(
                shipped, processor, 0, one_shape_seeds(ONE_SHAPE_SCENES)), 4)
        size_mb = (stage / "model.safetensors").stat().st_size / 1e6
        card = _model_card(spec, cls, processor, losses, elapsed, args, n_params, results,
                           size_mb, vision_pretrain)
        if with_images:
            render_scene(make_scene(card["sample_seed"])).save(stage / "sample.png")
        write_card(stage, card)
    print(f"exported {out_dir}: {size_mb:.2f} MB, {results}")


OBJECTIVE = "next-token cross-entropy on the answer tokens (prompt and image not scored)"


def _model_card(spec: VLMSpec, cls, processor, losses, elapsed, args, n_params, results,
                size_mb, vision_pretrain) -> dict:
    with_images = spec.vision_layers > 0
    tail = losses[-50:]
    card = {
        "name": spec.name,
        "summary": ("Tiny LLaVA-1.5 (CLIP vision tower, GELU projector, Llama) trained on "
                    "synthetic scenes." if with_images else
                    "Text-only Llama on the scene prompts and answers (the <image> tokens read as "
                    "text): the draft model of HF assisted generation, the baseline."),
        "kind": "vlm" if with_images else "vlm-assistant",
        "architecture": cls.__name__,
        "params": n_params,
        "size_mb": round(size_mb, 2),
        "dtype": "float16",
        "config": {k: v for k, v in spec.__dict__.items() if k != "name"},
        "drafters": list(spec.drafters),
        "conventions": {"processor": "LlavaProcessor saved alongside (mmspec.zoo.vlm_processor)",
                        "inputs": "mmspec.zoo.vlm_inputs(processor, image, question)",
                        "eos_token_id": processor.tokenizer.eos_token_id,
                        "pad_token_id": processor.tokenizer.pad_token_id},
        "objective": OBJECTIVE + (f" + {spec.image_word_loss} x image-word loss "
                                  f"(mmspec.zoo.training.objectives.image_word_loss)"
                                  if spec.image_word_loss else ""),
        "data": DATA_CARD,
        "results": {
            "final_train_loss": round(sum(tail) / len(tail), 4),
            "final_train_loss_note": "mean of the last 50 steps of the objective (nats/answer "
                                     "token" + (", the image-word term included: not comparable "
                                                "with the held-out answer loss"
                                                if spec.image_word_loss else "") + ")",
            **results,
            "heldout_slice": f"mmspec.zoo.training.vlm_data.heldout_seeds({HELDOUT_SCENES}); fp16 "
                             "weights as shipped",
            "colour_accuracy_slice": f"seeds {HELDOUT_START + 10_000}-"
                                     f"{HELDOUT_START + 10_000 + COLOUR_SCENES - 1}, exact match",
            "one_shape_colour_accuracy_slice": f"train_vlm.one_shape_seeds({ONE_SHAPE_SCENES}): "
                                               "the first one-shape scenes from seed "
                                               f"{HELDOUT_START + 10_000}, exact match",
            "wall_time_s": round(elapsed, 3),
            **_machine(args),
        },
        "command": command(MODULE, args.argv),
    }
    if spec.init_from:  # a fine-tune: say what it started from, with that model's own card
        card["init_from"] = {"ref": spec.init_from, "card": committed_card(spec.init_from)}
    if vision_pretrain:
        card["results"]["vision_pretrain"] = {
            **vision_pretrain, "slice": "heldout_seeds(128), every patch; shape_patch_kind on "
                                        "patches showing a shape; the heads are not shipped"}
    if with_images:
        card["sample_image"] = "sample.png"
        card["sample_seed"] = HELDOUT_START + 7
        card["sample_prompt"] = "Describe the image."
    return card


# --- drafters ---

def drafter_samples(processor, seeds) -> list[dict]:
    """Ready samples for `mmspec.vision.train`: {"input_ids" [1, L], "pixel_values"}."""
    out = []
    for seed in seeds:
        scene = make_scene(seed)
        question, _ = question_answer(scene, describe_share=0.8)
        inputs = vlm_inputs(processor, render_scene(scene), question)
        out.append({"input_ids": inputs["input_ids"], "pixel_values": inputs["pixel_values"]})
    return out


def answers_cache_path(out: Path, spec: DrafterSpec, target_dir: Path) -> Path:
    """Where the target's greedy answers to the drafters' training prompts are cached. Keyed by
    the target's weights, so a retrained target never feeds a drafter stale answers."""
    digest = hashlib.sha256((target_dir / "model.safetensors").read_bytes()).hexdigest()[:12]
    return out / f"vlm-drafter-answers-{spec.samples}x{spec.answer_tokens}-{digest}.pt"


def refuse_other_drafter_run(out_dir: Path, run: dict, steps: int) -> None:
    """As `cmd_train` refuses a checkpoint of another --seed or past --steps, for the
    `mmspec.vision.train` checkpoint in `out_dir` (its run is recorded beside it in run.json; a
    checkpoint from before that was recorded passes)."""
    record = out_dir / "run.json"
    if record.is_file():
        refuse_other_run({"run": json.loads(record.read_text())}, run, out_dir,
                         "resume with its settings, ")
    ckpt, _, previous = _checkpoint_dirs(out_dir)  # previous: a save killed mid-swap
    for folder in (ckpt, previous):
        if (folder / "trainer.pt").is_file():
            done = torch.load(folder / "trainer.pt", weights_only=True)["step"]
            refuse_past_steps(done, steps, folder)
            return


def cmd_drafter(args) -> None:
    from mmspec.zoo.registry import load

    spec: DrafterSpec = recipes()[args.model]
    steps = args.steps if args.steps is not None else spec.steps
    torch.set_num_threads(args.threads)
    target_entry = load(spec.target, Path(args.zoo))
    target, processor = target_entry.model, target_entry.tokenizer
    out_dir = Path(args.out) / spec.name
    run = {"seed": args.seed}  # what a resumed checkpoint must share (--steps may grow)
    if args.samples is not None:  # a quick run: the target answers only these scenes
        spec = dataclasses.replace(spec, samples=args.samples)
        run["samples"] = args.samples
    if args.resume:  # before the answers, which can take long
        refuse_other_drafter_run(out_dir, run, steps)
    else:
        refuse_to_overwrite(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out_dir / "run.json", json.dumps(run) + "\n")
    samples = drafter_samples(processor, range(DRAFTER_SEEDS, DRAFTER_SEEDS + spec.samples))
    held = drafter_samples(processor, heldout_seeds(spec.held_out))
    torch.save(samples, out_dir / "samples.pt")  # the `--data` file of `mmspec.vision.train`
    t0 = time.time()
    # both drafters train on the same prompts: the target answers them once
    shared = answers_cache_path(Path(args.out), spec, Path(args.zoo) / spec.target)
    precompute_answers(target, samples, spec.answer_tokens, shared, args.save_every_s)
    shutil.copyfile(shared, out_dir / "answers.pt")
    answers_s = time.time() - t0
    cfg = TrainConfig(steps=steps, lr=spec.lr, warmup_steps=min(spec.warmup_steps, steps),
                      answer_tokens=spec.answer_tokens, eval_every=args.eval_every,
                      eval_new_tokens=spec.eval_new_tokens,
                      rollout_steps=spec.rollout_steps,
                      training_time_test=spec.training_time_test,
                      checkpoint_every=100, seed=args.seed)
    torch.manual_seed(args.seed)
    layers = () if spec.features == "last" else feature_layers(
        target.config.get_text_config(decoder=True).num_hidden_layers)
    drafter = ViSpecDrafter.from_target(target, text_only=spec.text_only,
                                        num_queries=spec.num_queries, feature_layers=layers)
    losses = train(drafter, target, samples, cfg, held_out=held, out_dir=out_dir,
                   resume=args.resume)
    elapsed = time.time() - t0
    # the card's config records the steps this run trained, not the spec's default
    spec = dataclasses.replace(spec, steps=steps)
    export_drafter(spec, drafter, target, held, losses, cfg, elapsed, answers_s, args)


def export_drafter(spec: DrafterSpec, drafter, target, held, losses, cfg, elapsed, answers_s,
                   args) -> None:
    out_dir = Path(args.zoo) / spec.name
    with staged_export(out_dir) as stage:  # a kill mid-export leaves the previous entry
        drafter.half().save_pretrained(stage)
        shipped = ViSpecDrafter.from_pretrained(stage, target).eval()
        t0 = time.time()
        tau = held_out_tau(shipped, target, held, spec.eval_new_tokens)
        size_mb = (stage / "model.safetensors").stat().st_size / 1e6
        write_card(stage, _drafter_card(spec, shipped, losses, cfg, elapsed, answers_s, args,
                                        tau, time.time() - t0, size_mb))
    print(f"exported {out_dir}: {size_mb:.2f} MB, held-out tau {tau:.3f}")


def _drafter_card(spec: DrafterSpec, shipped, losses, cfg, elapsed, answers_s, args, tau,
                  tau_s, size_mb) -> dict:
    tail = losses[-100:]
    n_params = sum(p.numel() for p in shipped.parameters())
    return {
        "name": spec.name,
        "summary": ("ViSpec drafter (EAGLE-2 head + vision adaptor + global image vector)"
                    if not spec.text_only else
                    "ViSpec's text-only ablation (no adaptor, no global vector: image tokens stay "
                    "in the draft sequence)") + f" for {spec.target}.",
        "kind": "vispec",
        "target": spec.target,
        "architecture": "mmspec.vision.ViSpecDrafter",
        "params": n_params,
        "size_mb": round(size_mb, 2),
        "dtype": "float16",
        "config": {k: v for k, v in spec.__dict__.items() if k != "name"},
        "train_config": {k: v for k, v in cfg.__dict__.items()},
        "data": {**DATA_CARD,
                 "prompts": f"{spec.samples} training scenes (seeds {DRAFTER_SEEDS}-"
                            f"{DRAFTER_SEEDS + spec.samples - 1}), 80% description questions; "
                            f"answers: {spec.target}'s own greedy answers",
                 "held_out": f"mmspec.zoo.training.vlm_data.heldout_seeds({spec.held_out})"},
        "results": {
            "final_train_loss": round(sum(tail) / len(tail), 4),
            "final_train_loss_note": "mean of the last 100 steps (mmspec.vision.train's loss)",
            "heldout_tau": round(tau, 3),
            "heldout_tau_note": f"tokens per target forward, bonus included, greedy, "
                                f"{spec.eval_new_tokens} new tokens, fp16 weights as shipped "
                                "(mmspec.vision.train.held_out_tau)",
            "heldout_tau_wall_s": round(tau_s, 3),
            "answers_wall_time_s": round(answers_s, 3),
            "wall_time_s": round(elapsed, 3),
            "wall_time_note": "answers + training of the last invocation (a resumed run counts "
                              "only its own part)",
            **_machine(args),
        },
        "command": command(MODULE, args.argv),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=["tokenizer", *recipes()])
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="override the spec's step count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    parser.add_argument("--out", default=str(OUT_DIR), help="checkpoint folder (git-ignored)")
    parser.add_argument("--zoo", default=str(ZOO_DIR), help="where the shipped entries go")
    parser.add_argument("--processor", default=None,
                        help="target and assistant: the processor to train with (default: the "
                             "--zoo folder's vlm-processor, else the shipped one)")
    parser.add_argument("--save-every-s", type=float, default=120.0)
    parser.add_argument("--eval-every", type=int, default=500, help="drafters: held-out tau")
    parser.add_argument("--samples", type=positive_int, default=None,
                        help="drafters: training scenes, whose answers the target computes "
                             "first (default: the spec's, 2400 for the shipped drafters)")
    args = parser.parse_args(argv)
    if args.samples is not None and not isinstance(recipes().get(args.model), DrafterSpec):
        parser.error(f"--samples: only drafters take it (their training scenes); {args.model} "
                     f"is not a drafter")
    args.argv = sys.argv[1:] if argv is None else list(argv)
    if args.model == "tokenizer":
        cmd_tokenizer(args)
    else:  # mmspec.vision.train's refusals (ResumeError) are the scaffold's too
        run_refusals_as_exit(cmd_drafter if isinstance(recipes()[args.model], DrafterSpec)
                             else cmd_train, args)


if __name__ == "__main__":
    sys.exit(run_command(main))
