"""Token streams of the corpus splits, cached (the trainers: under `--out`), and the windows drawn
from them.

Each split is one stream: every file's tokens followed by EOS. Training draws random windows with a
generator seeded per step (so a resumed run sees the same batches); evaluation uses fixed windows
spread evenly over the held-out stream.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from mmspec.atomic import save_atomic
from mmspec.zoo.corpus import read_texts
from mmspec.zoo.paths import OUT_DIR

CACHE_DIR = OUT_DIR / "data"


def token_stream(tokenizer, split: str, cache_dir: Path = CACHE_DIR) -> torch.Tensor:
    """long `[N]`: the split's files tokenized and joined with EOS. Cached in `cache_dir` by
    tokenizer content and by the texts themselves (the corpus is this Python's stdlib, which
    differs by version)."""
    texts = read_texts(split)
    digest = hashlib.sha1(tokenizer.backend_tokenizer.to_str().encode())
    for text in texts:
        digest.update(hashlib.sha1(text.encode()).digest())
    path = Path(cache_dir) / f"{split}-{digest.hexdigest()[:12]}.pt"
    if path.exists():
        return torch.load(path, weights_only=True).long()
    ids = []
    for enc in tokenizer.backend_tokenizer.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(tokenizer.eos_token_id)
    stream = torch.tensor(ids, dtype=torch.int16)  # vocab < 32768
    save_atomic(stream, path)  # a killed write never leaves a torn cache
    return stream.long()


def random_windows(stream: torch.Tensor, batch_size: int, seq_len: int,
                   generator: torch.Generator) -> torch.Tensor:
    """long `[batch_size, seq_len]` windows at uniform random offsets."""
    starts = torch.randint(0, stream.numel() - seq_len, (batch_size,), generator=generator)
    return torch.stack([stream[s:s + seq_len] for s in starts.tolist()])


def eval_windows(stream: torch.Tensor, seq_len: int, num_windows: int) -> torch.Tensor:
    """long `[num_windows, seq_len]`, starts evenly spaced over the stream (deterministic)."""
    if stream.numel() < seq_len * num_windows:
        raise ValueError(f"stream of {stream.numel()} tokens is too short for {num_windows} "
                         f"windows of {seq_len}")
    starts = torch.linspace(0, stream.numel() - seq_len, num_windows).long()
    return torch.stack([stream[s:s + seq_len] for s in starts.tolist()])
