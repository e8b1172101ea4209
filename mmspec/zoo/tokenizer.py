"""The byte-level BPE tokenizer shared by the text target, the AR drafter and the diffusion drafter.

Trained on the training split of the stdlib corpus (`mmspec.zoo.training.tokenizer`). Special
tokens follow Dream (Qwen2.5): one `<|endoftext|>` serves as EOS and pad, and `<|mask|>` is the
diffusion mask token. Byte-level, so every string round-trips and no input is ever `<unk>`.
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"  # also the pad token, as in Dream/Qwen2.5
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = (EOS_TOKEN, MASK_TOKEN)  # ids 0 and 1
VOCAB_SIZE = 4096  # small enough that the tied embedding stays a fraction of each model


def load_tokenizer(directory: str | Path) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast.from_pretrained(str(directory))
