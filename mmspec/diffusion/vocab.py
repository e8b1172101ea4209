"""Vocabulary checks between a drafter and its target: speculative decoding compares token ids.

Logit widths may differ inside one tokenizer family (Qwen2.5 >= 7B pads to 152064, Qwen2.5 <= 3B
and Qwen3 to 151936; huggingface/transformers#45307), so widths alone are not a mismatch: the
lattice is cut or padded to the target's width. With both tokenizers given, every id they share
must map to the same token, and every target id must exist in the drafter's tokenizer; ids only the
drafter knows (Dream's `<|mask|>`) are DLM-only specials and are suppressed from the lattice.
"""

from __future__ import annotations

import torch

from mmspec.decoding.vocab import VocabularyMismatch


def check_dlm_width(drafter_width: int, target_width: int) -> None:
    """A diffusion drafter's logits and the target's are one vocabulary, maybe padded or with a
    few ids of one side's own (a DLM's mask token appended; Qwen2.5's 151936 beside 152064; a
    DLM narrower than its target reads the ids it lacks as masks): widths within 1% or 64 of
    each other. Anything else is another vocabulary, which drafted silently at tau 1 (a
    50257-token model for a 64-token target). Tokenizers, when given, are compared id by id
    (`drafter_only_ids`); widths alone cannot tell two tokenizers of one size apart."""
    if abs(drafter_width - target_width) > max(0.01 * target_width, 64):
        raise VocabularyMismatch(
            f"the diffusion drafter's vocabulary ({drafter_width} logits) does not match the "
            f"target's ({target_width}); target and drafter must share a tokenizer (widths "
            f"within 1% or 64 of each other are taken as one vocabulary, padded)")


def logits_width(model) -> int:
    """Columns of the model's logits (the output embedding rows, else `config.vocab_size`)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        return head.weight.shape[0]
    return model.config.vocab_size


def target_width(target) -> int:
    """`target` is a model, a config with `vocab_size`, or an int."""
    if isinstance(target, int):
        return target
    if hasattr(target, "get_output_embeddings"):
        return logits_width(target)
    if hasattr(target, "vocab_size"):
        return target.vocab_size
    raise TypeError(f"target must be a model, a config or an int vocab size, got "
                    f"{type(target).__name__}")


def check_mask_token(mask_token_id: int, drafter_width: int, eos_ids) -> None:
    if not 0 <= mask_token_id < drafter_width:
        raise ValueError(f"mask_token_id {mask_token_id} is outside the drafter's vocabulary "
                         f"[0, {drafter_width})")
    if mask_token_id in set(eos_ids):
        raise ValueError(f"mask_token_id {mask_token_id} is also an EOS id {sorted(eos_ids)}")


def drafter_only_ids(tokenizer, target_tokenizer, drafter_width: int) -> list[int]:
    """Compare two tokenizers; raise on a mismatch, return the ids only the drafter knows."""
    drafter = {i: t for t, i in tokenizer.get_vocab().items()}
    target = {i: t for t, i in target_tokenizer.get_vocab().items()}
    if max(target) >= drafter_width:
        raise ValueError(f"vocabulary mismatch: the target's tokenizer has id {max(target)} but "
                         f"the drafter's logits have only {drafter_width} columns")
    differ = sorted(i for i in drafter.keys() & target.keys() if drafter[i] != target[i])
    missing = sorted(target.keys() - drafter.keys())
    if differ or missing:
        example = (f"id {differ[0]} is {drafter[differ[0]]!r} for the drafter and "
                   f"{target[differ[0]]!r} for the target" if differ
                   else f"id {missing[0]} ({target[missing[0]]!r}) is not in the drafter's")
        raise ValueError(
            f"vocabulary mismatch: {len(differ)} shared ids map to different tokens and "
            f"{len(missing)} target ids are missing from the drafter's tokenizer ({example}); "
            f"the drafter and the target must share one tokenizer"
        )
    return sorted(drafter.keys() - target.keys())


def suppressed_ids(mask_token_id: int, extra_ids) -> torch.Tensor:
    return torch.tensor(sorted({mask_token_id, *extra_ids}), dtype=torch.long)
