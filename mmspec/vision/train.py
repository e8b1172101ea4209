"""`python -m mmspec.vision.train`: train a ViSpec drafter against its target, online.

Data are (image, prompt) pairs. The target answers each prompt itself (greedy, long answers as in
ViSpec's stage 2, `vispec.md` §1.6); the answers are cached as token ids (`answers.pt`), never as
hidden states: every step runs the frozen target once over prompt + answer to get its last hidden
states and logits (no multi-TB feature dumps).

One step on one sample:
    features, logits = target(prompt + answer)          # no grad
    pred             = drafter(features, tokens)        # teacher-forced, images compressed
    loss             = L(pred) + sum over rollouts of L(drafter(pred shifted right by one))
    L                = w_f SmoothL1(feature) + w_tv sum|p_d - p_t| + w_rank ListMLE(top 10) + w_ce CE
The rollout is ViSpec's anti-shortcut pass (`--rollout-steps`, README: 1).

EAGLE-3's pieces on a ViSpec drafter: `--multi-layer` (or `--feature-layers`) feeds it three
target layers' hidden states, fused by the head's `fuse` (`ViSpecConfig.feature_layers`);
`--training-time-test` makes the rollouts EAGLE-3's training-time test (`tree_passes`: pass i is
the draft tree's level at depth i along the gold tokens, its terms weighted 0.8 ** i).

`--arch eagle3` trains an EAGLE-3 drafter instead (`mmspec/eagle/eagle3_train.py`), for a VLM or a
text-only causal LM target: three target layers' features fused by `fc`, a draft vocabulary of the
answers' most frequent tokens (`--draft-vocab-size`), and the training-time test (`--rollout-steps`
passes that feed the drafter its own outputs, EAGLE-3's default 6), with EAGLE-3's loss (the
feature, tv, rank and ce weights and the noise are ViSpec's and do not apply). It saves in the
speculators format, which `EagleDrafter.from_pretrained` loads and `vllm serve` serves.
`--supervise all` trains on every position of prompt + answer instead of the answers' alone (the
target's logits cover them all), for plain text windows: with `--answer-tokens 0` the samples are
the windows themselves and no answers are made (how the zoo's `text-eagle3` was trained);
`--intermediate-size`, `--heads` and `--kv-heads` shape a layer smaller than the target's.

`--arch dflash` trains a DFlash block-diffusion drafter for a causal LM target on the same data
(`mmspec/vision/train_dflash.py`: the authors' anchor-block loss, their flags, `--format
speculators`).

Optimiser as in ViSpec: AdamW(0.9, 0.95), gradient value clipping 0.5, linear warm-up then decay
(`mmspec.train_scaffold.linear_schedule`), on the trainers' shared loop
(`mmspec.train_scaffold.TrainLoop`). Checkpoints (`<out>/checkpoint`, every
`--checkpoint-every` steps: the drafter as `save_pretrained` writes it, accelerate's saved state
and the step, swapped in whole) resume with `--resume` (without it an existing checkpoint is
refused, never overwritten); the answers are saved as they come.
Held-out tau (with bonus, EAGLE's convention) every `--eval-every` steps through
`mmspec.generate`.

Multi-GPU: `accelerate launch -m mmspec.vision.train ...` (or torchrun). The processes split
the target's answers (`answers-<rank>.pt`), each step takes `--batch-size` samples per process
and the gradients are averaged (`accelerator.reduce`), so N processes train as one with an N
times larger batch.

Data files: a `.jsonl` of {"image": path or [paths], "prompt": text} (needs the target's processor;
{"prompt": text} for a causal LM target, through its tokenizer's chat template, or as plain text
when it has none), or a `.pt` list of ready samples {"input_ids": long [1, L], **processor
outputs}.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from mmspec.atomic import save_atomic
from mmspec.decoding import generate
from mmspec.decoding.settings import eos_ids, sampling_config
from mmspec.interrupt import Interrupted, run_command
from mmspec.train_scaffold import (META, RunExists, RunRefused, TrainLoop, checkpoint_dirs,
                                   linear_schedule, settle)

from mmspec.diffusion.dflash import DFlashDrafter
from mmspec.diffusion.dflash_speculators import check_exportable
from mmspec.diffusion.dflash_train import sample_loss as dflash_sample_loss
from mmspec.eagle.checkpoint import check_state, read_config, read_weights
from mmspec.eagle.drafter import EagleDrafter
from mmspec.eagle.eagle3_train import (DRAFT_VOCAB_SIZE, PASS_DECAY, ROLLOUT_STEPS, eagle3_loss,
                                       feature_layers, fit_draft_vocabulary, new_eagle3_drafter,
                                       target_argmax)
from mmspec.eagle.speculators import read_speculators

from . import train_dflash
from .drafter import ViSpecDrafter
from .losses import feature_loss, list_mle, soft_cross_entropy, total_variation

# a sample is one unpadded row: its attention mask (if a processor returned one) is all ones and is
# rebuilt for every longer sequence, so it is never passed on as an extra
NOT_EXTRAS = ("input_ids", "attention_mask")
LONG_ANSWER = "Please answer with at least 1000 words."  # vispec.md §1.6, stage-2 data


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    lr: float = 3e-6  # vispec.md §1.6 (README, batch 1 per GPU, 7B); tiny models want ~1e-3
    betas: tuple = (0.9, 0.95)  # vispec.md §1.6
    grad_clip: float = 0.5  # vispec.md §1.6: gradient *value* clipping
    warmup_steps: int = 100  # ViSpec: one epoch of linear warm-up, then linear decay
    feature_weight: float = 1.0  # EAGLE stage 1 (ViSpec stage 2 sets 0)
    tv_weight: float = 10.0  # ViSpec stage 2
    rank_weight: float = 0.1  # ViSpec, both stages
    rank_top: int = 10
    ce_weight: float = 0.0  # EAGLE stage 1 uses 0.1
    rollout_steps: int = 1  # ViSpec README --mtp-steps 1
    # ViSpec drafters: the rollouts are EAGLE-3's training-time test (`tree_passes`: pass i is the
    # tree level at depth i, weighted 0.8 ** i) instead of ViSpec's shifted passes
    training_time_test: bool = False
    noise: float = 0.2  # EAGLE uniform feature noise, scaled by 512 / seq_len
    answer_tokens: int = 1024  # vispec.md §1.6: max_new_tokens of the generated answers
    # EAGLE-3: "answers" supervises the entries that predict answer tokens (ViSpec's, and the
    # reference's loss_mask on chat data); "all" every position of prompt + answer, for plain
    # text windows whose every position the target's logits cover (answer_tokens 0: no answers)
    supervise: str = "answers"
    batch_size: int = 1  # samples per step and process (ViSpec: 1 per GPU); losses averaged
    # DFlash: blocks per sample (SpecForge's num_anchors) and the decay of a block's row weights,
    # exp(-(k - 1) / gamma) (paper: 7 for blocks of 16, 5 for 10, 4 for 8)
    anchors: int = 512
    gamma: float = 7.0
    # DFlash: each row scored against the target's next-token distribution instead of the token
    # (EAGLE's soft labels; the authors' loss uses the token)
    soft_labels: bool = False
    eval_every: int = 100
    eval_new_tokens: int = 64
    checkpoint_every: int = 100
    seed: int = 0

    def __post_init__(self):
        for name, low in (("steps", 1), ("warmup_steps", 0), ("rank_top", 1), ("batch_size", 1),
                          ("anchors", 1),
                          ("rollout_steps", 0), ("answer_tokens", 0), ("eval_every", 0),
                          ("eval_new_tokens", 1), ("checkpoint_every", 0), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                zero = " (0: never)" if name in ("eval_every", "checkpoint_every") else ""
                raise ValueError(f"TrainConfig.{name} must be an int >= {low}{zero}, got "
                                 f"{value!r}")
        for name, positive in (("lr", True), ("grad_clip", True), ("noise", False),
                               ("gamma", True), ("feature_weight", False), ("tv_weight", False),
                               ("rank_weight", False), ("ce_weight", False)):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0 or (positive and value == 0)):
                raise ValueError(f"TrainConfig.{name} must be a finite number "
                                 f"{'> 0' if positive else '>= 0'}, got {value!r}")
        if (len(self.betas) != 2
                or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas)):
            raise ValueError(f"TrainConfig.betas must be two numbers in [0, 1), got "
                             f"{self.betas!r}")
        for name in ("training_time_test", "soft_labels"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"TrainConfig.{name} must be a bool, got "
                                 f"{getattr(self, name)!r}")
        if self.supervise not in ("answers", "all"):
            raise ValueError(f"TrainConfig.supervise must be 'answers' or 'all', got "
                             f"{self.supervise!r}")
        if self.answer_tokens == 0 and self.supervise != "all":
            raise ValueError("TrainConfig.answer_tokens 0 (no answers) needs supervise='all': "
                             "only the answers would be supervised, and there would be none")
        if not any((self.feature_weight, self.tv_weight, self.rank_weight, self.ce_weight)):
            raise ValueError("TrainConfig: feature_weight, tv_weight, rank_weight and ce_weight "
                             "are all 0: there would be nothing to train on")


def check_samples(samples, name: str) -> None:
    """ValueError naming `name` (and the sample) unless `samples` is a non-empty list of dicts
    with `input_ids` an integer tensor `[1, L]` (one unpadded row) and only tensors besides."""
    if not isinstance(samples, list) or not samples:
        got = "an empty list" if isinstance(samples, list) else f"a {type(samples).__name__}"
        raise ValueError(f"{name}: expected a non-empty list of samples (dicts with input_ids "
                         f"[1, L]), got {got}")
    for i, sample in enumerate(samples):
        where = f"{name}[{i}]"
        if not isinstance(sample, dict) or "input_ids" not in sample:
            got = sorted(sample) if isinstance(sample, dict) else type(sample).__name__
            raise ValueError(f"{where}: expected a dict with input_ids, got {got}")
        ids = sample["input_ids"]
        if (not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.dtype == torch.bool
                or ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] == 0):
            got = (f"{ids.dtype} {list(ids.shape)}" if isinstance(ids, torch.Tensor)
                   else type(ids).__name__)
            raise ValueError(f"{where}: input_ids must be an integer tensor [1, L] (one row, "
                             f"L >= 1), got {got}")
        for key, value in sample.items():
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"{where}: {key} must be a tensor (a processor output), got "
                                 f"{type(value).__name__}")


def _extend_extras(extras: dict, length: int) -> dict:
    """Processor outputs for a longer sequence: per-token types get zeros (text) appended."""
    out = dict(extras)
    types = out.get("mm_token_type_ids")
    if types is not None and types.shape[1] < length:
        out["mm_token_type_ids"] = torch.cat(
            [types, types.new_zeros(types.shape[0], length - types.shape[1])], 1)
    return out


# config entries that say where a model came from or how it was saved (save_pretrained fills
# dtype and architectures in), not how it answers; the parameters carry the dtype
_NOT_ANSWERING = frozenset({"_name_or_path", "transformers_version", "architectures", "dtype",
                            "torch_dtype"})


def target_fingerprint(target) -> str:
    """What the target's greedy answers depend on, hashed: its class, config and generation
    config (not the folder it was loaded from: a moved model keeps its answers) and its weights,
    the name, dtype, shape and first 16 values of every parameter (differ between checkpoints and
    dtypes, and cost little even for a 7B)."""
    def answering(config: dict) -> dict:
        return {k: answering(v) if isinstance(v, dict) else v
                for k, v in config.items() if k not in _NOT_ANSWERING}

    digest = hashlib.sha1(type(target).__name__.encode())
    for config in (target.config.to_dict(), target.generation_config.to_dict()):
        digest.update(json.dumps(answering(config), sort_keys=True, default=str).encode())
    for name, p in target.named_parameters():
        digest.update(f"{name}:{p.dtype}:{tuple(p.shape)}".encode())
        digest.update(p.detach().reshape(-1)[:16].cpu().view(torch.uint8).numpy())
    return digest.hexdigest()[:16]


def _key(index: int, sample: dict, max_new_tokens: int, target: str) -> str:
    """Cache key of a sample's answer: its position, every tensor in it (the image too: the same
    prompt with another image has another answer), the answer length and `target`, the
    answering model's `target_fingerprint` (another target's cached answers are not its own:
    they are made anew, never distilled)."""
    digest = hashlib.sha1(f"{max_new_tokens}:{target}".encode())
    for name in sorted(sample):
        value = sample[name]
        if isinstance(value, torch.Tensor):
            digest.update(name.encode())
            digest.update(value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return f"{index}:{digest.hexdigest()[:16]}"


class AnswerCache:
    """The answer cache file, `{_key: long [A]}`, the answers of every target it served. New
    answers are saved every `save_every_s` seconds (and by `save`) through `save_atomic`, so an
    interrupted run keeps the answers made so far and a rerun makes only the missing ones (as
    `mmspec.zoo.training.distill.target_continuations`). With `path` None it is a plain dict in
    memory."""

    def __init__(self, path: Path | None, save_every_s: float = 120.0, also=()):
        self.path = Path(path) if path is not None else None
        self.answers = torch.load(self.path, weights_only=True) \
            if self.path is not None and self.path.is_file() else {}
        self.save_every_s, self.last_save, self.unsaved = save_every_s, time.time(), False
        self.others: dict = {}  # read-only: `also`, the caches of other processes or runs
        for other in also:
            if Path(other).is_file() and Path(other) != self.path:
                self.others.update(torch.load(other, weights_only=True))

    def __contains__(self, key: str) -> bool:
        return key in self.answers or key in self.others

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.answers[key] if key in self.answers else self.others[key]

    def add(self, key: str, answer: torch.Tensor) -> None:
        self.answers[key] = answer
        self.unsaved = True
        if time.time() - self.last_save >= self.save_every_s:
            self.save()

    def save(self) -> None:
        if self.path is not None and self.unsaved:
            save_atomic(self.answers, self.path)
        self.unsaved, self.last_save = False, time.time()


def answer_cache_paths(out_dir: Path, rank: int = 0, world: int = 1) -> tuple[Path, list]:
    """(this process's answer cache, every cache in `out_dir`): `answers.pt` for a single
    process, `answers-<rank>.pt` for each process of a multi-process run; each reads all."""
    own = out_dir / ("answers.pt" if world == 1 else f"answers-{rank}.pt")
    return own, sorted(out_dir.glob("answers*.pt"))


def target_answers(target, samples: list, max_new_tokens: int, cache_path: Path | None,
                   save_every_s: float = 120.0, also=(), shard: tuple[int, int] = (0, 1)) -> list:
    """The target's greedy answer to each sample (long `[A_i]`), cached as token ids in
    `cache_path` (saved every `save_every_s` seconds: a rerun resumes; the caches in `also` are
    read too). `shard=(rank, world)`: this process makes only the answers of samples
    `rank, rank + world, ...` and returns None for the others."""
    rank, world = shard
    cache = AnswerCache(cache_path, save_every_s, also)
    fingerprint = target_fingerprint(target)
    answers = []
    try:
        for i, s in enumerate(tqdm(samples, desc="target answers", leave=False,
                                   disable=rank != 0)):
            key = _key(i, s, max_new_tokens, fingerprint)
            if key not in cache and i % world != rank:
                answers.append(None)
                continue
            if key not in cache:
                ids = s["input_ids"]
                extras = {k: v for k, v in s.items() if k not in NOT_EXTRAS}
                with torch.no_grad():
                    out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                          do_sample=False, max_new_tokens=max_new_tokens,
                                          **extras)
                cache.add(key, out[0, ids.shape[1]:].cpu().clone())  # not the prompt's storage
            answers.append(cache[key])
    finally:  # an interrupt (Ctrl-C) keeps every answer made; a kill, those of the last save
        cache.save()
    return answers


@torch.no_grad()
def precompute_answers(target, samples: list, max_new_tokens: int, cache_path: Path,
                       save_every_s: float = 120.0) -> None:
    """Fill `mmspec.vision.train`'s answer cache: greedy answers, prompts of equal length batched
    (no padding, so each row is the answer `target.generate` gives it alone: cut after its first
    EOS, any of them when the generation config lists several). Saved every `save_every_s`
    seconds as `target_answers` does: a rerun makes only the missing answers. Samples are VLM
    ones (with `pixel_values`) or text-only ones (`input_ids` alone)."""
    cache = AnswerCache(cache_path, save_every_s)
    fingerprint = target_fingerprint(target)  # the keys `target_answers` reads them under
    keys = [_key(i, s, max_new_tokens, fingerprint) for i, s in enumerate(samples)]
    groups: dict = {}
    for i, s in enumerate(samples):
        if keys[i] not in cache:
            groups.setdefault(s["input_ids"].shape[1], []).append(i)
    eos = eos_ids(target, None)  # the generation config's: None, an id or a list of ids
    todo = [idx[j:j + 16] for idx in groups.values() for j in range(0, len(idx), 16)]
    try:
        for chunk in tqdm(todo, desc="target answers", file=sys.stdout, mininterval=10):
            ids = torch.cat([samples[i]["input_ids"] for i in chunk])
            extras = {k: torch.cat([samples[i][k] for i in chunk]) for k in samples[chunk[0]]
                      if k not in ("input_ids", "attention_mask")}  # pixel_values, if any
            out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                  **extras, do_sample=False, max_new_tokens=max_new_tokens)
            for row, i in zip(out[:, ids.shape[1]:].cpu(), chunk):
                stop = torch.isin(row, eos).nonzero()
                cache.add(keys[i], (row[:int(stop[0]) + 1] if len(stop) else row).clone())
    finally:  # an interrupt (Ctrl-C) keeps every answer made; a kill, those of the last save
        cache.save()


def sample_loss(drafter: ViSpecDrafter, target, sample: dict, answer: torch.Tensor,
                cfg: TrainConfig, generator: torch.Generator | None = None):
    """(loss, parts dict) for one sample and its cached answer."""
    prompt = sample["input_ids"]
    device = _device(drafter)
    ids = torch.cat([prompt, answer[None].to(prompt)], 1).to(device)  # [1, T]
    first = prompt.shape[1] if cfg.supervise == "answers" else 0  # 0: every entry
    if isinstance(drafter, DFlashDrafter):  # a causal LM target: no extras
        return dflash_sample_loss(drafter, ids, first, cfg.anchors, generator, cfg.gamma,
                                  cfg.soft_labels)
    extras = _extend_extras({k: v.to(device) for k, v in sample.items() if k not in NOT_EXTRAS},
                            ids.shape[1])
    if isinstance(drafter, EagleDrafter):
        return eagle3_loss(drafter, target, ids, first, extras, cfg.rollout_steps)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        out = target(input_ids=ids, attention_mask=mask, output_hidden_states=True, **extras)
    hidden = out.hidden_states[-1].to(drafter.embed_weight.dtype)  # [1, T, d]
    logits = out.logits  # [1, T, V]
    layers = drafter.config.feature_layers
    raw = torch.cat([out.hidden_states[i] for i in layers], -1)[:, :-1] if layers else hidden[:, :-1]
    features = drafter.target_features(raw)  # [1, T-1, d]; `fuse` trains with the rest
    if cfg.noise > 0:
        u = torch.rand(features.shape, generator=generator, device="cpu").to(features)
        features = features + (u - 0.5) * cfg.noise * 512 / ids.shape[1]
    positions = drafter.adapter.prompt_positions(ids, mask, extras)[..., :-1]
    entries = drafter.sequence_entries(ids, mask.bool(), features, positions, extras)
    # supervise pairs whose next feature predicts an answer token: i + 1 >= prompt_len - 1
    sel = entries.valid & ~entries.is_compressed & (entries.pair_index >= prompt.shape[1] - 2)
    if cfg.training_time_test:
        return _tree_passes_loss(drafter, entries, ids, sel, hidden, logits, cfg)
    target_idx = entries.pair_index[sel] + 1
    t_hidden, t_logits = hidden[0, target_idx], logits[0, target_idx]
    total, parts = 0.0, {}
    for rollout in range(cfg.rollout_steps + 1):
        pred, _ = drafter.run(entries)
        loss, terms = _terms(drafter, pred[sel], t_hidden, t_logits, cfg)
        total = total + loss
        for name, value in terms.items():
            parts[f"{name}{rollout}"] = value
        shifted = torch.cat([entries.features[:, :1], pred[:, :-1]], 1)  # own predictions
        entries = dataclasses.replace(entries, features=shifted)
    return total, parts


def tree_passes(drafter: ViSpecDrafter, entries, ids: torch.Tensor, steps: int) -> list:
    """EAGLE-3's training-time test for a ViSpec drafter: `steps` outputs `[1, N, d]`. Pass 0 is
    the teacher-forced pass over `entries` (built from `ids` `[1, T]`); entry j of pass i > 0 is
    the tree node at depth i below entry j (pair p) along the gold tokens: the token of slot
    p + 1 + i, the entry's own output of pass i - 1 as its feature (no `fuse`, no image input
    but the global vector), at position + i, attending the pass-0 entries up to j and its own
    entries of passes 1..i, exactly as `propose`'s tree step does at depth i. Entries past the
    end (and compressed tokens, after pass 0) are computed but never supervised."""
    head = drafter.head
    b, n = entries.valid.shape
    device = ids.device
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    eye = torch.eye(n, dtype=torch.bool, device=device)
    base = (causal & entries.valid[:, None, :]) | eye  # [B, n, n]: pass 0's mask
    x = head.inputs(entries.embeds, entries.features, entries.global_vecs, entries.compressed,
                    entries.is_compressed)
    h, past = head(x, entries.positions, None, base)
    outputs = [h]
    no_image = torch.zeros(b, n, dtype=torch.bool, device=device)  # passes > 0: no compressed
    for i in range(1, steps):
        slot = (entries.pair_index + 1 + i).clamp(0, ids.shape[1] - 1)  # [B, n]
        embeds = drafter.embed_weight[ids[0][slot]].to(h.dtype)
        x = head.inputs(embeds, h, entries.global_vecs, torch.zeros_like(h), no_image)
        mask = torch.cat([base] + [eye.expand(b, n, n)] * i, 2)
        h, new = head(x, entries.positions + i, past, mask)
        past = [(torch.cat([pk, nk], 2), torch.cat([pv, nv], 2))
                for (pk, pv), (nk, nv) in zip(past, new)]
        outputs.append(h)
    return outputs


def _tree_passes_loss(drafter, entries, ids, sel, hidden, logits, cfg: TrainConfig):
    """(loss, parts) of `tree_passes`: ViSpec's terms on each pass's entries whose gold next
    slot is still in the sequence, pass i weighted `PASS_DECAY ** i` (EAGLE-3's)."""
    steps = cfg.rollout_steps + 1
    outputs = tree_passes(drafter, entries, ids, steps)
    total, parts = 0.0 * outputs[0].sum(), {}
    for i, pred in enumerate(outputs):
        idx = entries.pair_index + 1 + i  # the target's slot whose feature and logits it predicts
        keep = sel & (idx <= ids.shape[1] - 1)
        if not bool(keep.any()):
            continue
        loss, terms = _terms(drafter, pred[keep], hidden[0, idx[keep]], logits[0, idx[keep]], cfg)
        total = total + PASS_DECAY ** i * loss
        for name, value in terms.items():
            parts[f"{name}{i}"] = value
    return total, parts


def _terms(drafter, pred, t_hidden, t_logits, cfg: TrainConfig):
    draft_logits = drafter.logits(pred)
    terms = {}
    if cfg.feature_weight:
        terms["feature"] = (cfg.feature_weight, feature_loss(pred, t_hidden))
    if cfg.tv_weight:
        terms["tv"] = (cfg.tv_weight, total_variation(draft_logits, t_logits))
    if cfg.rank_weight:
        terms["rank"] = (cfg.rank_weight, list_mle(draft_logits, t_logits, cfg.rank_top))
    if cfg.ce_weight:
        terms["ce"] = (cfg.ce_weight, soft_cross_entropy(draft_logits, t_logits))
    loss = sum(w * v for w, v in terms.values())
    return loss, {k: float(v.detach()) for k, (_, v) in terms.items()}


def held_out_tau(drafter, target, samples: list, max_new_tokens: int) -> float:
    """Mean tokens per target forward (bonus included) over `samples`, greedy."""
    accepted, rounds = _held_out_counts(drafter, target, samples, max_new_tokens)
    return accepted / max(rounds, 1)


def _held_out_counts(drafter, target, samples: list, max_new_tokens: int) -> tuple[int, int]:
    """(tokens committed, row-rounds) of greedy `mmspec.generate` over `samples`."""
    accepted = rounds = 0
    for s in samples:
        extras = {k: v for k, v in s.items() if k not in NOT_EXTRAS}
        stats = generate(target, drafter, s["input_ids"], max_new_tokens=max_new_tokens,
                         do_sample=False, **extras).stats
        accepted += stats.committed
        rounds += stats.row_rounds
    return accepted, rounds


def _noise_generator(seed: int, step: int, slot: int) -> torch.Generator:
    """The feature noise of one sample of one step: the same whatever the number of processes
    (slot = position in the step's global batch) and after a resume."""
    digest = hashlib.sha1(f"{seed}:{step}:{slot}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


class _SampleStream:
    """The run's `random.Random` of sample picks, as accelerate checkpoints an object."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def state_dict(self) -> dict:
        return {"state": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(state["state"])


def _process_state(device: torch.device):
    """accelerate's state of a run on `device`; refused if it counts other processes than the
    launched ones (a CPU process group that accelerate's state was not told of)."""
    import torch.distributed as dist
    from accelerate import PartialState

    state = PartialState(cpu=device.type == "cpu")
    launched = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if launched != state.num_processes:
        raise ValueError(f"torch.distributed runs {launched} processes but accelerate's state "
                         f"counts {state.num_processes}: on CPUs create it with "
                         f"accelerate.PartialState(cpu=True) before training")
    return state


class ResumeError(RunRefused):
    """A checkpoint that this run cannot continue (its settings differ, or it does not load)."""


def train(drafter: ViSpecDrafter | EagleDrafter | DFlashDrafter, target, samples: list,
          cfg: TrainConfig, held_out: list | None = None, out_dir=None, resume: bool = False,
          fit_vocabulary: bool = False, save_format: str | None = None) -> list:
    """Train `drafter` in place; returns the losses of the steps this call made. `out_dir` gets
    checkpoints, the answer cache and the final drafter.

    fit_vocabulary: an EAGLE-3 drafter's draft vocabulary (`d2t`) and the start of its lm_head
    are set from the target's answers first (`eagle3_train.fit_draft_vocabulary`), as for a new
    drafter (`new_eagle3_drafter`).
    save_format: a DFlash drafter's layout in `out_dir`, "dflash" (the authors', the default) or
    "speculators" (`DFlashDrafter.save_pretrained`); its checkpoints are in the authors'.

    Under `accelerate launch` / `torchrun` (an initialised `torch.distributed`), the processes
    split the target's answers, each step draws `cfg.batch_size` samples per process from one
    shared stream and the gradients are averaged: N processes train exactly as one with N times
    the batch. Process 0 writes the checkpoints and the drafter; the held-out tau is shared out."""
    check_samples(samples, "samples")
    _check_kind(drafter, cfg, save_format)
    if held_out:
        check_samples(held_out, "held_out")
    state = _process_state(_device(drafter))
    out_dir = Path(out_dir) if out_dir is not None else None
    if out_dir is not None and not resume:
        refuse_to_overwrite(out_dir)
    target.eval().requires_grad_(False)
    if held_out:  # `held_out_tau` runs mmspec.generate: refuse its settings now, not at the eval
        sampling_config(target, False, None, None, None)
    answers = _all_answers(drafter, target, samples, cfg, out_dir, state)
    if fit_vocabulary:  # every process has every answer: the same vocabulary everywhere
        supervised = answers if cfg.supervise == "answers" else target_argmax(target, samples,
                                                                              answers)
        fit_draft_vocabulary(drafter, supervised)
    if isinstance(drafter, DFlashDrafter):
        _refuse_blockless(drafter.config.block_size, samples, answers, cfg)
    rng = random.Random(cfg.seed)  # the same stream in every process
    loop, sched = _train_loop(drafter, cfg, out_dir, rng)
    start = _resumed_step(loop, drafter, sched, cfg) if resume and out_dir else 0
    first = len(loop.losses)  # the losses of earlier calls, resumed
    run = _Run(drafter, target, samples, answers, cfg, loop)
    log = _step_log(out_dir, start) if out_dir is not None and run.rank == 0 else None
    bar = loop.steps(cfg.steps, f"train {_kind(drafter)}", mininterval=0.1, file=sys.stderr)
    drafter.train()
    try:
        for step in bar:
            run.step(step, [rng.randrange(len(samples)) for _ in range(run.batch)], bar)
            if log is not None:
                log.write(json.dumps({"step": loop.done, "loss": loop.losses[-1],
                                      "time": time.time()}) + "\n")
                log.flush()
            if held_out and cfg.eval_every and loop.done % cfg.eval_every == 0:
                run.evaluate(held_out, loop.done, bar, log)
            if out_dir and cfg.checkpoint_every and loop.done % cfg.checkpoint_every == 0:
                loop.save()
    except KeyboardInterrupt:
        if out_dir is None:
            raise
        raise Interrupted(f"{_last_checkpoint(out_dir)} of {cfg.steps} (every "
                          f"{cfg.checkpoint_every} steps); rerun with --resume to continue from "
                          f"it") from None
    finally:
        if log is not None:
            log.close()
    drafter.eval()
    if out_dir:
        loop.save()
        if run.rank == 0:
            drafter.save_pretrained(out_dir, **({"format": save_format} if save_format else {}))
    loop.accelerator.wait_for_everyone()  # the drafter is on disk before any process returns
    return loop.losses[first:]


def _device(drafter) -> torch.device:
    return next(drafter.parameters()).device


def _kind(drafter) -> str:
    return {DFlashDrafter: "dflash", EagleDrafter: "eagle3"}.get(type(drafter), "vispec")


def _check_kind(drafter, cfg: TrainConfig, save_format: str | None) -> None:
    """ValueError when a setting is not for this kind of drafter."""
    if cfg.supervise == "all" and isinstance(drafter, ViSpecDrafter):
        raise ValueError("cfg.supervise 'all' trains EAGLE-3 and DFlash drafters; a ViSpec "
                         "drafter's loss supervises the answers only (supervise='answers')")
    if save_format is None:
        return
    if not isinstance(drafter, DFlashDrafter):
        raise ValueError(f"save_format: a {_kind(drafter)} drafter saves in its one layout; "
                         f"save_format is for DFlash drafters, got {save_format!r}")
    if save_format not in ("dflash", "speculators"):
        raise ValueError(f"save_format must be 'dflash' or 'speculators', got {save_format!r}")
    if save_format == "speculators":  # refused now, not after the training
        check_exportable(drafter)


class UnfitData(ValueError):
    """Samples that the drafter cannot train on: its main prints the message as one line."""


def _refuse_blockless(block_size: int, samples: list, answers: list, cfg: TrainConfig) -> None:
    """UnfitData when no sample holds a DFlash block of supervised labels (anchors lie in
    [max(1, first - 1), T - block_size], `dflash_train.supervised_anchors`); a note on stderr
    when some do not (they train nothing)."""
    spans = []
    for sample, answer in zip(samples, answers):
        prompt, total = sample["input_ids"].shape[1], sample["input_ids"].shape[1] + len(answer)
        first = prompt if cfg.supervise == "answers" else 0
        spans.append(total - max(1, first - 1))  # the block's rows from its earliest anchor on
    fit = sum(span >= block_size for span in spans)
    if not fit:
        raise UnfitData(f"samples: none of the {len(samples)} holds a DFlash block of "
                        f"{block_size} rows over supervised tokens (the longest supervised span "
                        f"is {max(spans)} tokens): make longer answers (--answer-tokens) or "
                        f"give a smaller --block-size")
    if fit < len(samples):
        print(f"{len(samples) - fit} of {len(samples)} samples hold no DFlash block of "
              f"{block_size} rows over supervised tokens: they train nothing", file=sys.stderr)


def _train_loop(drafter, cfg: TrainConfig, out_dir: Path | None, rng: random.Random) -> tuple:
    """(the shared `TrainLoop` of ViSpec's update, its scheduler unwrapped): AdamW, the linear
    schedule, gradients summed over the processes (no DDP: the drafter trains through `run` and
    `logits`, not `forward`) and clipped by value; checkpoints in `<out_dir>/checkpoint` hold
    the drafter as `save_pretrained` writes it (its config checked on resume) and the sample
    stream `rng` beside accelerate's states, written every `checkpoint_every` steps by `train`
    (never by the clock)."""
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas)
    sched = linear_schedule(opt, cfg.warmup_steps, cfg.steps)
    ckpt = _checkpoint_dirs(out_dir)[0] if out_dir is not None else None
    loop = TrainLoop(drafter, opt, sched, ckpt, dataclasses.asdict(cfg), save_every_s=math.inf,
                     clip_norm=None, cpu=_device(drafter).type == "cpu",
                     clip_value=cfg.grad_clip, sum_grads=True,
                     save_model=drafter.save_pretrained, states=(_SampleStream(rng),))
    return loop, sched


def _all_answers(drafter, target, samples: list, cfg: TrainConfig, out_dir: Path | None,
                 state) -> list:
    """The target's answer to every sample, in every process of accelerate's `state` (each
    makes its share, cached in `out_dir`), and one start for the drafter in every process."""
    from accelerate.utils import broadcast, gather_object

    world, rank = state.num_processes, state.process_index
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        own, others = answer_cache_paths(out_dir, rank, world)
    else:
        own, others = None, ()
    if cfg.answer_tokens:
        answers = target_answers(target, samples, cfg.answer_tokens, own, also=others,
                                 shard=(rank, world))
    else:  # the windows alone (supervise="all")
        answers = [torch.zeros(0, dtype=torch.long) for _ in samples]
    if world > 1:  # every process needs every answer
        for part in gather_object([{i: a for i, a in enumerate(answers) if a is not None}]):
            for i, a in part.items():
                answers[i] = a
        for p in drafter.state_dict().values():  # one start, whatever each process built
            broadcast(p, from_process=0)
    return answers


def _resumed_step(loop: TrainLoop, drafter, sched, cfg: TrainConfig) -> int:
    """Load the checkpoint of `loop` (if any) into the drafter, optimizer, scheduler and sample
    stream; its step, refused (ResumeError) when this run's --lr or --steps cannot continue it."""
    from accelerate.utils import OPTIMIZER_NAME

    if loop.accelerator.is_main_process:
        settle(loop.ckpt)
    loop.accelerator.wait_for_everyone()
    if not (loop.ckpt / META).is_file():
        return 0
    if not (loop.ckpt / f"{OPTIMIZER_NAME}.bin").is_file():  # trainer.pt held the states
        raise ResumeError(f"resume: the checkpoint in {loop.ckpt} is of an earlier mmspec (its "
                          f"states in {META}, not accelerate's files): it cannot be resumed; "
                          f"finish it with the mmspec that wrote it, or delete it")
    _load_drafter_weights(drafter, loop.ckpt)
    # a checkpoint of this trainer before it ran on the shared loop holds the step alone (its
    # losses are in log.jsonl only)
    meta = {"losses": [], "elapsed": 0.0, **torch.load(loop.ckpt / META, weights_only=True)}
    start = loop.resume(meta)
    saved_lr = sched.base_lrs[0]  # the checkpoint's: loading quietly replaced this run's
    if not math.isclose(saved_lr, cfg.lr, rel_tol=1e-9):
        raise ResumeError(f"resume: the checkpoint in {loop.ckpt.parent} was trained with --lr "
                          f"{saved_lr:g}, this run's is {cfg.lr:g}: resume it with the "
                          f"settings it was started with")
    if start > cfg.steps:  # it rewrote the checkpoint as step cfg.steps, states of `start`
        raise ResumeError(f"resume: the checkpoint in {loop.ckpt.parent} is at step {start}, "
                          f"past --steps {cfg.steps}; give --steps >= {start} to continue it")
    return start


def _step_log(out_dir: Path, start: int):
    """`out_dir/log.jsonl` open for appending: one JSON line a step (and one per held-out eval),
    what a model card reports (the final loss, tau, wall time) without parsing the progress bar.
    A resumed run keeps the lines up to its checkpoint and drops those of the steps it makes
    again."""
    path = out_dir / "log.jsonl"
    kept = [line for line in (path.read_text().splitlines() if path.is_file() else ())
            if json.loads(line)["step"] <= start]
    path.write_text("".join(line + "\n" for line in kept))
    return path.open("a")


@dataclass
class _Run:
    """What every step of one `train` call shares: the models, the data and answers, the settings
    and the shared training loop."""

    drafter: ViSpecDrafter | EagleDrafter
    target: object
    samples: list
    answers: list
    cfg: TrainConfig
    loop: TrainLoop

    @property
    def rank(self) -> int:
        return self.loop.accelerator.process_index

    @property
    def batch(self) -> int:
        """Samples per step over every process (the global batch)."""
        return self.cfg.batch_size * self.loop.accelerator.num_processes

    def step(self, step: int, picks: list, bar) -> None:
        """One update on the step's global batch `picks` (sample indices; this process takes its
        slots), recording the mean loss over the global batch."""
        cfg, loop = self.cfg, self.loop
        loop.zero_grad()
        total = torch.zeros((), dtype=torch.float64, device=loop.params[0].device)  # NCCL: GPU
        for slot in range(self.rank * cfg.batch_size, (self.rank + 1) * cfg.batch_size):
            i = picks[slot]
            loss, _ = sample_loss(self.drafter, self.target, self.samples[i], self.answers[i],
                                  cfg, _noise_generator(cfg.seed, step, slot))
            loop.backward(loss / self.batch)  # the mean over the step's global batch
            total += float(loss.detach())
        if loop.accelerator.num_processes > 1:
            total = loop.accelerator.reduce(total, "sum")
        loop.apply(float(total) / self.batch, step, bar, digits=4)

    def evaluate(self, held_out: list, done: int, bar, log) -> None:
        """Held-out tau after `done` steps, each process its share (none waits on another's
        eval: NCCL timeout), written to the bar and the log by process 0."""
        share = held_out[self.rank::self.loop.accelerator.num_processes]
        self.drafter.eval()
        counts = torch.tensor(_held_out_counts(self.drafter, self.target, share,
                                               self.cfg.eval_new_tokens),
                              device=self.loop.params[0].device)
        counts = self.loop.accelerator.reduce(counts, "sum")
        self.drafter.train()
        if self.rank == 0:
            tau = int(counts[0]) / max(int(counts[1]), 1)
            bar.write(f"step {done}: held-out tau {tau:.3f} (with bonus)")
            if log is not None:
                log.write(json.dumps({"step": done, "held_out_tau": tau}) + "\n")


def refuse_to_overwrite(out_dir: Path) -> None:
    """FileExistsError if `out_dir` holds a run's checkpoint: as mmspec.zoo's trainers, a run
    without `--resume` never overwrites another's state."""
    ckpt, _, previous = _checkpoint_dirs(Path(out_dir))  # previous: a save killed mid-swap
    for path in (ckpt, previous):
        if path.exists():
            raise RunExists(f"{path} exists: pass --resume (resume=True) to continue it, "
                                  "or delete it")


def _last_checkpoint(out_dir: Path) -> str:
    """Where the run in `out_dir` would resume, in words."""
    ckpt, _, previous = _checkpoint_dirs(out_dir)  # previous: a save killed mid-swap
    for folder in (ckpt, previous):
        if (folder / "trainer.pt").is_file():
            step = torch.load(folder / "trainer.pt", weights_only=True)["step"]
            return f"the checkpoint in {out_dir} is at step {step}"
    return f"no checkpoint in {out_dir} yet: a rerun with --resume starts at step 0"


def _checkpoint_dirs(out_dir: Path) -> tuple[Path, Path, Path]:
    """(the checkpoint, the one being written, the previous one while the new is swapped in)."""
    return checkpoint_dirs(out_dir / "checkpoint")


def _load_drafter_weights(drafter, ckpt: Path) -> None:
    """The drafter saved in checkpoint folder `ckpt` into `drafter`, refused (ResumeError) when
    it is not this run's kind of drafter."""
    if isinstance(drafter, EagleDrafter):
        _load_eagle3_weights(drafter, ckpt)
    elif isinstance(drafter, DFlashDrafter):
        try:
            train_dflash.load_checkpoint(drafter, ckpt)
        except (FileNotFoundError, ValueError) as err:
            raise ResumeError(f"resume: {err}") from None
    else:
        _load_vispec_weights(drafter, ckpt)


def _load_eagle3_weights(drafter: EagleDrafter, ckpt: Path) -> None:
    """The saved head's weights as written (float32 master weights, not the target's dtype
    `EagleDrafter.from_pretrained` would cast to), if they fit this run's drafter."""
    try:
        _, state, layers = read_speculators(read_config(ckpt), read_weights(ckpt), ckpt)
        own = drafter.head.state_dict()
        state = {k: v for k, v in state.items() if k in own}
        check_state(own, state, ckpt)
    except (FileNotFoundError, ValueError) as err:
        raise ResumeError(f"resume: the checkpoint in {ckpt} does not load as this run's "
                          f"EAGLE-3 drafter: {err}") from None
    if layers is not None and tuple(layers) != drafter.config.feature_layers:
        raise ResumeError(f"resume: the checkpoint in {ckpt} reads target layers {list(layers)}, "
                          f"this run's drafter {list(drafter.config.feature_layers)}: resume it "
                          f"with the settings it was started with")
    drafter.head.load_state_dict(state)


def _load_vispec_weights(drafter: ViSpecDrafter, ckpt: Path) -> None:
    try:
        loaded = ViSpecDrafter.from_pretrained(ckpt, drafter.adapter.target, dtype=torch.float32)
    except (FileNotFoundError, ValueError) as err:  # its "path:"/"target:" name no flag here
        raise ResumeError(f"resume: the checkpoint in {ckpt} does not load: {err}") from None
    saved, now = dataclasses.asdict(loaded.config), dataclasses.asdict(drafter.config)
    def shown(k, value):
        return f"{k}={value!r}" + (" (--text-only)" if k == "text_only" and value else "")

    differ = [f"{shown(k, saved[k])}, this run's {shown(k, now[k])}" for k in saved
              if k not in ("target", "depth", "top_k", "total_tokens")  # tree: not in the weights
              and saved[k] != now[k]]
    if differ:
        raise ResumeError(f"resume: the checkpoint in {ckpt} holds a drafter with "
                         f"{'; '.join(differ)}: resume it with the settings it was started with")
    drafter.load_state_dict(loaded.state_dict())


# --- command line ---

def _data_path(data: Path, image: str) -> Path:
    """An image path of a `--data` line: absolute, or relative to the .jsonl's folder when the
    file is there, else to the working directory."""
    image = Path(image)
    beside = data.parent / image
    return beside if not image.is_absolute() and beside.exists() else image


def _jsonl_rows(path: Path, text_only: bool = False):
    """(where, row) for each non-empty line of the `--data` file `path`: a JSON object with a
    text "prompt" and (unless `text_only`: none) an "image"; ValueError naming the line."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"--data {path} line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not JSON ({err})") from None
        keys = {"prompt"} if text_only else {"image", "prompt"}
        if not isinstance(row, dict) or not keys <= set(row) or (text_only and "image" in row):
            got = sorted(row) if isinstance(row, dict) else type(row).__name__
            expected = ('{"prompt": text} (a text-only target: no "image")' if text_only
                        else '{"image": path or [paths], "prompt": text}')
            raise ValueError(f"{where}: expected {expected}, got {got}")
        if not isinstance(row["prompt"], str):
            raise ValueError(f'{where}: "prompt" must be text, got {row["prompt"]!r}')
        yield where, row


def _load_text_jsonl(path: Path, tokenizer, suffix: str) -> list:
    """Samples of a causal LM target: each prompt (with `suffix`) as a user turn of the
    tokenizer's chat template, or as plain text when it has none (a base model)."""
    samples = []
    for _, row in _jsonl_rows(path, text_only=True):
        text = f"{row['prompt']} {suffix}".strip()
        if tokenizer.chat_template:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                 add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=not tokenizer.chat_template,
                        return_tensors="pt")["input_ids"]
        samples.append({"input_ids": ids})
    if not samples:
        raise ValueError(f"--data {path}: no samples, the file has no non-empty line")
    return samples


def _load_jsonl(path: Path, processor, suffix: str) -> list:
    from PIL import Image

    samples = []
    for where, row in _jsonl_rows(path):
        paths = row["image"] if isinstance(row["image"], list) else [row["image"]]
        if not paths or not all(isinstance(p, str) for p in paths):
            raise ValueError(f'{where}: "image" must be a path or a non-empty list of paths, '
                             f"got {row['image']!r}")
        try:
            # relative paths: from the .jsonl's folder (a dataset folder moves as one), else
            # from the working directory (as before)
            images = [Image.open(_data_path(path, p)).convert("RGB") for p in paths]
        except OSError as err:  # a missing or unreadable file, or not an image
            raise ValueError(f"{where}: {err}") from None
        text = f"{row['prompt']} {suffix}".strip()
        conv = [{"role": "user", "content": [{"type": "image"} for _ in images]
                 + [{"type": "text", "text": text}]}]
        prompt = processor.apply_chat_template(conv, add_generation_prompt=True)
        inputs = processor(text=prompt, images=images, return_tensors="pt")
        samples.append({k: v for k, v in inputs.items() if k != "attention_mask"})
    if not samples:
        raise ValueError(f"--data {path}: no samples, the file has no non-empty line")
    return samples


def start_from_saved(path, target, text_only: bool) -> ViSpecDrafter:
    """The drafter `--drafter PATH` trains: the saved one as it is, or, a text-only drafter
    (ViSpec's stage 1) in a ViSpec run, a ViSpec drafter with its head and new `img_fc`
    (`[I | 0]`: it drafts as the text drafter did until it learns to use the images) and adaptor;
    the new weights are printed."""
    saved = ViSpecDrafter.from_pretrained(path, target, dtype=torch.float32)
    if saved.config.text_only == text_only:
        return saved
    if text_only:
        raise ValueError(f"--text-only: the --drafter in {path} is a ViSpec drafter (with a "
                         "vision adaptor); a text-only run starts from a text-only one or none")
    kept = {k: v for k, v in dataclasses.asdict(saved.config).items()
            if k not in ("text_only", "target")}
    drafter = ViSpecDrafter.from_target(target, **kept).float()
    new = drafter.load_state_dict(saved.state_dict(), strict=False).missing_keys
    print(f"--drafter {path}: a text-only drafter, its head loaded into a ViSpec drafter; new: "
          f"{', '.join(new)}")
    return drafter


def load_samples(path: Path, target_path: str, suffix: str, text_only: bool = False) -> list:
    """The samples of `--data`: a `.pt` list as saved, or a `.jsonl` through the target's
    processor (`text_only`, a causal LM target: its tokenizer); ValueError naming the file (and
    line or sample) when they are not samples."""
    if path.suffix == ".pt":
        samples = torch.load(path, weights_only=True)
    elif text_only:
        from transformers import AutoTokenizer

        samples = _load_text_jsonl(path, AutoTokenizer.from_pretrained(target_path), suffix)
    else:
        from transformers import AutoProcessor

        samples = _load_jsonl(path, AutoProcessor.from_pretrained(target_path), suffix)
    check_samples(samples, f"--data {path}")
    return samples


def _load_target(path: str, dtype: torch.dtype, causal_lm: bool, text_only: bool = False):
    """The target: a VLM, or (`causal_lm`, for EAGLE-3) a text-only causal LM where the folder
    holds no VLM; `text_only` (DFlash): a causal LM alone."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if text_only:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    try:
        return AutoModelForImageTextToText.from_pretrained(path, dtype=dtype)
    except ValueError:  # transformers: "Unrecognized configuration class ..." (not a VLM)
        if not causal_lm:
            raise
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)


def _parser() -> argparse.ArgumentParser:
    """The command line: the run's own options, then one per `TrainConfig` field."""
    p = argparse.ArgumentParser(prog="python -m mmspec.vision.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True,
                   help="path or hub id of the target VLM (or causal LM: --arch eagle3, dflash)")
    p.add_argument("--data", required=True, type=Path,
                   help=".jsonl (image, prompt; image paths relative to the .jsonl's folder; "
                        "a prompt alone for a causal LM target) or .pt samples")
    p.add_argument("--out", required=True, type=Path,
                   help="folder for checkpoints, the answer cache and the drafter")
    p.add_argument("--drafter", help="start from this saved drafter: a ViSpec one as saved; a "
                   "text-only one (stage 1) keeps its head and gets a new adaptor, or stays "
                   "text-only with --text-only")
    p.add_argument("--text-only", action="store_true", help="the ablation baseline drafter")
    p.add_argument("--arch", default="vispec", choices=["vispec", "eagle3", "dflash"],
                   help="vispec: a ViSpec drafter (a VLM target); eagle3: an EAGLE-3 drafter "
                        "(a VLM or a causal LM target); dflash: a DFlash drafter (a causal LM "
                        "target)")
    p.add_argument("--draft-vocab-size", type=int, default=DRAFT_VOCAB_SIZE,
                   help="eagle3: the draft vocabulary, the answers' most frequent tokens "
                        "(default: %(default)s, EAGLE-3's, at most the target's vocabulary)")
    p.add_argument("--feature-layers", type=int, nargs=3, default=None, metavar="ID",
                   help="the target layers whose inputs are the features, fused by a linear "
                        "layer (eagle3's default: 2, L//2, L-3 as EAGLE-3; 1, L//2, L-1 for "
                        "targets under 7 layers; vispec's: none, the last hidden state)")
    p.add_argument("--multi-layer", action="store_true",
                   help="vispec: EAGLE-3's three feature layers (as --arch eagle3's default) "
                        "instead of the last hidden state")
    p.add_argument("--intermediate-size", type=int, default=None,
                   help="eagle3, dflash: the layers' MLP width (default: the target's)")
    p.add_argument("--heads", type=int, default=None,
                   help="eagle3: attention heads (default: the target's; head_dim = its width / "
                        "heads)")
    p.add_argument("--kv-heads", type=int, default=None,
                   help="eagle3, dflash: key/value heads (default: the target's)")
    train_dflash.add_arguments(p)
    p.add_argument("--held-out", type=float, default=0.05, help="fraction for tau (ViSpec: 5%%)")
    p.add_argument("--suffix", default=LONG_ANSWER,
                   help="appended to every jsonl prompt (default: %(default)r, ViSpec's "
                        "long-answer request; '' for none)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--batched-answers", action="store_true",
                   help="make the target's answers first, prompts of equal length in batches "
                        "of 16 (no padding: the same answers, several times faster on a CPU)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default=None,
                   help="default: this process's GPU under accelerate launch, else cuda if "
                        "available, else cpu")
    for f in dataclasses.fields(TrainConfig):
        if f.name == "warmup_steps":  # default None: min(the config's, --steps), as the zoo does
            p.add_argument("--warmup-steps", type=int, default=None,
                           help=f"linear warm-up steps (default: {f.default}, at most --steps)")
        elif f.name == "lr":  # default None: per --arch
            p.add_argument("--lr", type=float, default=None,
                           help=f"peak learning rate (default: {f.default} for vispec and eagle3, "
                                f"ViSpec's; {train_dflash.LR} for dflash, the authors')")
        elif f.name == "rollout_steps":  # default None: per --arch
            p.add_argument("--rollout-steps", type=int, default=None,
                           help=f"passes that feed the drafter its own outputs (default: "
                                f"{f.default} for vispec as its README, {ROLLOUT_STEPS} for "
                                f"eagle3 as its trainer)")
        elif f.name == "training_time_test":
            p.add_argument("--training-time-test", action="store_true",
                           help="vispec: the --rollout-steps passes are EAGLE-3's training-time "
                                "test (pass i is the draft tree's level i, weighted 0.8 ** i) "
                                "instead of ViSpec's shifted passes (eagle3 always trains so)")
        elif f.name == "supervise":
            p.add_argument("--supervise", default=f.default, choices=["answers", "all"],
                           help="eagle3, dflash: the positions supervised, the answers' "
                                "(default) or all of prompt + answer (plain text windows; "
                                "with --answer-tokens 0 the windows alone, no answers made)")
        elif f.name == "soft_labels":
            p.add_argument("--soft-labels", action="store_true",
                           help="dflash: score each block row against the target's next-token "
                                "distribution (EAGLE's soft labels) instead of the token (the "
                                "authors')")
        elif f.name in ("anchors", "gamma"):
            what = ("blocks per sample, at most" if f.name == "anchors"
                    else "decay of a block's row weights, exp(-(k - 1) / gamma)")
            p.add_argument("--" + f.name, type=type(f.default), default=f.default,
                           help=f"dflash: {what} (default: %(default)s, the authors')")
        elif f.name != "betas":
            p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default),
                           default=f.default, help="default: %(default)s")
    return p


def _refuse_flags_of_other_archs(p: argparse.ArgumentParser, args) -> None:
    """`p.error` for a flag that this run's --arch does not read."""
    eagle3, dflash = args.arch == "eagle3", args.arch == "dflash"
    if dflash:
        train_dflash.refuse_other_flags(p, args)
        return
    theirs = train_dflash.given_flags(args) + [
        f"--{name.replace('_', '-')}" for name in ("anchors", "gamma", "soft_labels")
        if getattr(args, name) != p.get_default(name)]
    if theirs:
        p.error(f"{', '.join(theirs)}: for --arch dflash, not --arch {args.arch}")
    for flag, given in (("--drafter", args.drafter), ("--text-only", args.text_only)):
        if eagle3 and given:
            p.error(f"{flag} is for --arch vispec; --arch eagle3 trains a new EAGLE-3 drafter")
    for flag, given in (("--training-time-test", args.training_time_test),
                        ("--multi-layer", args.multi_layer)):
        if eagle3 and given:
            p.error(f"{flag} is for --arch vispec; --arch eagle3 always trains so")
    shape = (args.intermediate_size, args.heads, args.kv_heads)
    if not eagle3 and (args.supervise != "answers" or args.draft_vocab_size != DRAFT_VOCAB_SIZE
                       or shape != (None,) * 3):
        p.error("--draft-vocab-size, --supervise, --intermediate-size, --heads and --kv-heads "
                "are for --arch eagle3 (--supervise, --intermediate-size and --kv-heads also for "
                "--arch dflash)")


def _train_config(p: argparse.ArgumentParser, args) -> TrainConfig:
    """The run's `TrainConfig` from parsed `args`, after the checks across options (each
    refusal names its options, through `p.error`)."""
    eagle3 = args.arch == "eagle3"
    _refuse_flags_of_other_archs(p, args)
    if args.rollout_steps is None:
        args.rollout_steps = ROLLOUT_STEPS if eagle3 else TrainConfig.rollout_steps
    if args.multi_layer and args.feature_layers is not None:
        p.error("--multi-layer picks EAGLE-3's feature layers; give it or --feature-layers")
    if args.drafter and (args.multi_layer or args.feature_layers is not None):
        p.error("--feature-layers and --multi-layer build a new drafter; --drafter keeps the "
                "saved drafter's")
    if not 0 <= args.held_out < 1:  # 5 (meaning 5%) or 1.0 would leave one training sample
        p.error(f"--held-out must be a fraction in [0, 1), got {args.held_out}")
    if args.lr is None:
        args.lr = train_dflash.LR if args.arch == "dflash" else TrainConfig.lr
    if args.warmup_steps is None:  # a warm-up longer than the run never reaches the peak LR
        args.warmup_steps = min(TrainConfig.warmup_steps, args.steps)
    elif args.warmup_steps > args.steps:
        p.error(f"--warmup-steps must be at most --steps ({args.steps}): the LR would never "
                f"reach --lr; got {args.warmup_steps}")
    try:
        cfg = TrainConfig(**{f.name: getattr(args, f.name)
                             for f in dataclasses.fields(TrainConfig) if f.name != "betas"})
    except ValueError as err:  # "TrainConfig.lr must be ..." -> "--lr must be ..."
        message = re.sub(r"TrainConfig\.(\w+)", lambda m: "--" + m[1].replace("_", "-"),
                         str(err))
        message = re.sub(r"\b(feature|tv|rank|ce)_weight\b", r"--\1-weight",
                         message.replace("TrainConfig: ", ""))
        p.error(message)
    return cfg


def _check_paths(p: argparse.ArgumentParser, args) -> None:
    """`--device` (resolved into `args.device`), `--out` and `--data` before a big target
    loads."""
    from accelerate import PartialState

    # under `accelerate launch` / torchrun this joins the process group that `train` uses
    if args.device is not None:
        try:
            device = torch.device(args.device)
        except RuntimeError as err:
            p.error(f"--device {args.device}: {err}")
        if device.type == "cuda" and not torch.cuda.is_available():
            p.error(f"--device {args.device}: this torch sees no CUDA device")
    args.device = args.device or PartialState(cpu=not torch.cuda.is_available()).device
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out {args.out} is a file; give a folder")
    if not args.data.is_file():
        p.error(f"--data {args.data}: no such file")  # before a big target loads


def _target_and_samples(p: argparse.ArgumentParser, args) -> tuple:
    """(the target on `args.device`, the held-out samples, the training samples)."""
    dflash = args.arch == "dflash"
    try:
        target = _load_target(args.target, getattr(torch, args.dtype), args.arch == "eagle3",
                              text_only=dflash).to(args.device)
    except (OSError, ValueError) as err:  # no such folder or hub id, no weights, not a VLM
        where = "" if Path(args.target).is_dir() else " (no such folder; tried as a hub id)"
        kind = {"eagle3": "a vision-language or causal LM",
                "dflash": "a causal LM (--arch dflash trains drafters for text-only causal LM "
                          "targets)"}.get(args.arch, "a vision-language model")
        p.error(f"--target {args.target}: cannot load it as {kind}{where}: "
                f"{str(err).strip().splitlines()[0]}")
    if dflash and getattr(target.config, "vision_config", None) is not None:
        p.error(f"--target {args.target}: a vision-language model ({type(target).__name__}); "
                f"--arch dflash trains drafters for text-only causal LM targets")
    text_only = getattr(target.config, "vision_config", None) is None
    try:
        samples = [{k: v.to(args.device) for k, v in s.items()}
                   for s in load_samples(args.data, args.target, args.suffix, text_only)]
    except ValueError as err:  # names --data and the line or sample
        p.error(str(err))
    n_held = min(len(samples) - 1, math.ceil(args.held_out * len(samples))) if args.held_out else 0
    held, train_set = samples[:n_held], samples[n_held:]
    return target, held, train_set


def _start_drafter(p: argparse.ArgumentParser, args, target, eagle3: bool):
    """The drafter to train: `--drafter`'s, a new EAGLE-3, DFlash or ViSpec one, fp32."""
    shape = (args.intermediate_size, args.heads, args.kv_heads)
    if args.arch == "dflash":
        return train_dflash.start_drafter(p, args, target)
    if args.drafter:
        try:
            drafter = start_from_saved(args.drafter, target, args.text_only)
        except (FileNotFoundError, ValueError) as err:  # nothing saved there, another target
            named = str(err) if str(err).startswith("--") else f"--drafter {args.drafter}: {err}"
            p.error(named)
    elif eagle3:
        try:
            drafter = new_eagle3_drafter(target, args.draft_vocab_size,
                                         args.feature_layers and tuple(args.feature_layers),
                                         *shape)
        except ValueError as err:  # "draft_vocab_size: ..." / "feature_layers: ..." / ...
            flags = {"num_heads": "heads", "num_kv_heads": "kv_heads"}
            p.error(re.sub(r"^(draft_vocab_size|feature_layers|intermediate_size|num_heads|"
                           r"num_kv_heads)\b",
                           lambda m: "--" + flags.get(m[1], m[1]).replace("_", "-"), str(err)))
    else:
        text = target.config.get_text_config(decoder=True)
        try:
            layers = (feature_layers(text.num_hidden_layers) if args.multi_layer
                      else tuple(args.feature_layers or ()))
            drafter = ViSpecDrafter.from_target(target, text_only=args.text_only,
                                                feature_layers=layers)
        except ValueError as err:  # "feature_layers: ..." / "target: ... has too few"
            p.error(re.sub(r"^(ViSpecConfig\.)?feature_layers\b", "--feature-layers",
                           str(err)))
    return drafter.float()  # fp32 master weights whatever the target's dtype (features cast)


def main(argv=None) -> None:
    p = _parser()
    args = p.parse_args(argv)
    cfg = _train_config(p, args)
    eagle3 = args.arch == "eagle3"
    _check_paths(p, args)
    target, held, train_set = _target_and_samples(p, args)
    torch.manual_seed(cfg.seed)  # the initial weights: all, or those a --drafter lacks
    drafter = _start_drafter(p, args, target, eagle3)
    if args.batched_answers and cfg.answer_tokens:  # into the cache `train` reads (answers.pt)
        args.out.mkdir(parents=True, exist_ok=True)
        precompute_answers(target, train_set, cfg.answer_tokens, args.out / "answers.pt")
    try:
        train(drafter, target, train_set, cfg, held_out=held, out_dir=args.out,
              resume=args.resume, fit_vocabulary=eagle3, save_format=args.format)
    except (RunExists, ResumeError, UnfitData) as err:  # --out holds a run; a resume that
        p.error(str(err))  # cannot be; no sample a DFlash block fits


if __name__ == "__main__":
    sys.exit(run_command(main))
