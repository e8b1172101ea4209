"""Training batches of scenes for the VLM zoo: (image, question) prompts followed by the answer,
with the loss on answer tokens only.

Batches are drawn from a generator seeded by the step (a resumed run sees the same data); the
held-out slice is the first `n` seeds of the held-out range.
"""

from __future__ import annotations

import random

import torch

from mmspec.zoo.scenes import (
    HELDOUT_START,
    NO_SHAPE,
    make_scene,
    patch_labels,
    question_answer,
    render_scene,
)
from mmspec.zoo.vlm_processor import answer_ids, vlm_inputs

IGNORE = -100


def train_seeds(step: int, batch_size: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed * 1_000_003 + step)
    return [rng.randrange(HELDOUT_START) for _ in range(batch_size)]


def heldout_seeds(n: int) -> list[int]:
    return list(range(HELDOUT_START, HELDOUT_START + n))


def scene_batch(processor, seeds: list[int], describe_share: float = 0.6,
                colour_share: float = 0.0, patch: int | None = None) -> dict:
    """`input_ids`, `attention_mask`, `labels` long `[B, T]` (right-padded; labels are IGNORE
    outside the answers) and `pixel_values` `[B, 3, 64, 64]`. With `patch`, also the scene graph's
    per-patch labels (`scenes.patch_labels`): `patch_colours` and `patch_kinds` long `[B, P]`."""
    rows, labels, pixels, patch_colours, patch_kinds = [], [], [], [], []
    for seed in seeds:
        scene = make_scene(seed)
        question, answer = question_answer(scene, describe_share, colour_share)
        if patch is not None:
            colours, kinds = patch_labels(scene, patch)
            patch_colours.append(colours)
            patch_kinds.append(kinds)
        inputs = vlm_inputs(processor, render_scene(scene), question)
        prompt = inputs["input_ids"][0].tolist()
        answer = answer_ids(processor, answer)
        rows.append(prompt + answer)
        labels.append([IGNORE] * len(prompt) + answer)
        pixels.append(inputs["pixel_values"])
    width = max(map(len, rows))
    pad = processor.tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    lab = torch.tensor([r + [IGNORE] * (width - len(r)) for r in labels])
    batch = {"input_ids": ids, "attention_mask": mask, "labels": lab,
             "pixel_values": torch.cat(pixels)}
    if patch is not None:
        batch["patch_colours"] = torch.tensor(patch_colours)
        batch["patch_kinds"] = torch.tensor(patch_kinds)
    return batch


def word_ids(tokenizer, words) -> torch.Tensor:
    """The token id of each word as it appears mid-sentence (` red`); each must be one token."""
    ids = []
    for word in words:
        piece = tokenizer(" " + word, add_special_tokens=False)["input_ids"]
        if len(piece) != 1:
            raise ValueError(f"words: expected {word!r} to be one token, got {len(piece)}: {piece}")
        ids.append(piece[0])
    return torch.tensor(ids)


def image_word_loss(lm_head, image_features: torch.Tensor, batch: dict, colour_ids: torch.Tensor,
                    kind_ids: torch.Tensor) -> torch.Tensor:
    """Auxiliary loss on the projected image tokens `[B, P, H]`: read through the LM's own (tied)
    output head, every image token should name its patch's colour word and, on patches that show
    a shape, the shape's kind word (`batch["patch_colours"]`, `batch["patch_kinds"]`, with
    `NO_SHAPE` for none). The image tokens then sit near the words the answers use, so "the
    circle" in a question can find the circle's patches and read their colour off them.
    Mean -log p(colour word) over all patches plus mean -log p(kind word) over shape patches."""
    colours, kinds = batch["patch_colours"], batch["patch_kinds"]
    if image_features.shape[:2] != colours.shape:
        raise ValueError(f"image_features: expected [B, P, H] with [B, P] = "
                         f"{list(colours.shape)} (the batch's patch labels), got "
                         f"{list(image_features.shape)}")
    logp = lm_head(image_features).float().log_softmax(-1)  # [B, P, V]
    colour = logp.gather(-1, colour_ids[colours].unsqueeze(-1)).squeeze(-1)
    shape = kinds != NO_SHAPE
    kind = logp.gather(-1, kind_ids[kinds.clamp(max=len(kind_ids) - 1)].unsqueeze(-1)).squeeze(-1)
    return -(colour.mean() + (kind * shape).sum() / shape.sum().clamp(min=1))


def answer_loss(model, batch: dict, with_images: bool = True,
                per_answer: bool = False) -> torch.Tensor:
    """Next-token cross-entropy (nats) on the answer tokens of `batch`: the mean over all answer
    tokens, or with `per_answer` the mean of each answer's own mean (a 6-token colour answer then
    weighs as much as a 150-token description instead of 25x less)."""
    kwargs = {"pixel_values": batch["pixel_values"]} if with_images else {}
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   **kwargs).logits  # [B, T, V]
    labels = batch["labels"][:, 1:]  # [B, T-1]
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2).float(), labels,
                                           ignore_index=IGNORE, reduction="none")  # [B, T-1]
    scored = (labels != IGNORE).float()
    if per_answer:
        return ((ce * scored).sum(1) / scored.sum(1).clamp(min=1)).mean()
    return (ce * scored).sum() / scored.sum().clamp(min=1)
