"""The byte-level BPE tokenizer shared by the text target, the AR drafter and the diffusion drafter.

Trained with `tokenizers` on the training split of the stdlib corpus. Special tokens follow Dream
(Qwen2.5): one `<|endoftext|>` serves as EOS and pad, and `<|mask|>` is the diffusion mask token.
Byte-level, so every string round-trips and no input is ever `<unk>`.
"""

from __future__ import annotations

import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"  # also the pad token, as in Dream/Qwen2.5
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = (EOS_TOKEN, MASK_TOKEN)  # ids 0 and 1
VOCAB_SIZE = 4096  # small enough that the tied embedding stays a fraction of each model


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # share the CPU politely
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN, mask_token=MASK_TOKEN,
    )


def load_tokenizer(directory: str | Path) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast.from_pretrained(str(directory))
