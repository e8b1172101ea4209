"""Distillation data for the text drafters: the zoo target's own greedy continuations.

A drafter is scored on how often it proposes what the *target* would say next, not what the corpus
says. DistillSpec (Zhou et al. 2024) and EAGLE's regenerated data train drafters on the target's
outputs for that reason; the 8.3M target's greedy code is also more regular than the corpus.

Each example is a window of `prefix_len` corpus tokens followed by `new_tokens` tokens the target
generates greedily from it (no stop at EOS: the target's EOS is a token like any other, and a
drafter should learn where it comes). The windows come from the train split, drawn by a generator
seeded per batch, so a resumed run makes the same examples. Progress is saved to the cache file
every `save_every_s` seconds; a rerun continues from there.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from mmspec._cache_name import cache_kwargs, output_cache
from mmspec.atomic import save_atomic
from mmspec.zoo.training.data import random_windows
from mmspec.zoo.training.objectives import masked_diffusion_loss


@torch.no_grad()
def greedy_continuations(target, prefixes: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """prefixes long `[B, P]` (no padding) -> long `[B, P + new_tokens]`, greedy, KV-cached."""
    out = target(input_ids=prefixes, use_cache=True, logits_to_keep=1)
    cache, tokens = output_cache(out), [out.logits[:, -1].argmax(-1)]
    for _ in range(new_tokens - 1):
        out = target(input_ids=tokens[-1][:, None], **cache_kwargs(target.forward, cache),
                     use_cache=True)
        tokens.append(out.logits[:, -1].argmax(-1))
    return torch.cat([prefixes, torch.stack(tokens, dim=1)], dim=1)


def _fingerprint(target, stream: torch.Tensor) -> str:
    h = hashlib.sha1()
    for p in target.state_dict().values():  # the first 1024 values of every tensor
        h.update(p.detach().flatten()[:1024].float().numpy().tobytes())
    h.update(stream[:100_000].numpy().tobytes())
    return h.hexdigest()[:10]


def target_continuations(target, stream: torch.Tensor, n: int, prefix_len: int, new_tokens: int,
                         cache_dir: Path, seed: int = 0, batch: int = 32,
                         save_every_s: float = 120.0) -> torch.Tensor:
    """long `[n, prefix_len + new_tokens]`: corpus windows of `stream` and the target's greedy
    continuations, cached (and resumed) under `cache_dir`, keyed by the target's weights, the
    stream and the arguments."""
    for name, value in (("n", n), ("prefix_len", prefix_len), ("new_tokens", new_tokens)):
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    key = f"{_fingerprint(target, stream)}-{n}x{prefix_len}+{new_tokens}-s{seed}"
    path = Path(cache_dir) / f"continuations-{key}.pt"
    done = torch.load(path, weights_only=True) if path.exists() \
        else torch.zeros(0, prefix_len + new_tokens, dtype=torch.int16)
    if len(done) >= n:
        return done[:n].long()
    target.eval()
    parts, last_save = [done], time.time()

    def save():  # atomic: a kill mid-save keeps what was saved before
        save_atomic(torch.cat(parts), path)

    count = len(done)
    bar = tqdm(total=n, initial=count, desc="target continuations", unit="seq", mininterval=5,
               file=sys.stdout)
    while count < n:  # batch i is drawn from Generator(seed, i): a resumed run continues alike
        i = count // batch
        gen = torch.Generator().manual_seed(seed * 1_000_003 + i)
        prefixes = random_windows(stream, batch, prefix_len, gen)
        seqs = greedy_continuations(target, prefixes, new_tokens)[: n - count]
        parts.append(seqs.to(torch.int16))  # vocab < 32768
        count += len(seqs)
        bar.update(len(seqs))
        if time.time() - last_save > save_every_s:
            save()
            last_save = time.time()
    bar.close()
    save()
    return torch.cat(parts).long()


def continuation_loss(objective: str, model, tokens: torch.Tensor, prefix_len: int,
                      mask_token_id: int, generator: torch.Generator,
                      block_share: float = 0.0) -> torch.Tensor:
    """The drafter's loss on the continuation `tokens[:, prefix_len:]` only (the prefix is the
    clean context). causal: next-token CE; diffusion: the masked-diffusion loss with every row's
    prefix clean (`masked_diffusion_loss(cut=prefix_len, block_share=...)`)."""
    if objective == "causal":
        logits = model(input_ids=tokens).logits[:, prefix_len - 1:-1]  # predicts tokens[P:]
        return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, prefix_len:].flatten())
    return masked_diffusion_loss(model, tokens, mask_token_id, generator, cut=prefix_len,
                                 block_share=block_share)
