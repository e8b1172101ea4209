"""The zoo's one tokenizer trainer: a byte-level BPE (`tokenizers`), so every string round-trips
and no input is ever `<unk>`, with the special tokens first (ids 0, 1, ...).

`train_tokenizer` makes the text zoo's (`mmspec/zoo/tokenizer.py` names its special tokens),
`train_processor` the VLM zoo's processor around its own (`mmspec/zoo/vlm_processor.py`).
"""

from __future__ import annotations

import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlavaProcessor, PreTrainedTokenizerFast

from mmspec.zoo import tokenizer as text
from mmspec.zoo import vlm_processor as vlm


def train_bpe(texts: list[str], vocab_size: int, special_tokens: tuple[str, ...],
              **roles) -> PreTrainedTokenizerFast:
    """A byte-level BPE of `vocab_size` tokens trained on `texts`, `special_tokens` first; `roles`
    are `PreTrainedTokenizerFast`'s (`eos_token=...`, `extra_special_tokens={...}`)."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # share the CPU politely
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, **roles)


def train_tokenizer(texts: list[str],
                    vocab_size: int = text.VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """The text zoo's: one `<|endoftext|>` as EOS and pad, `<|mask|>` the diffusion mask
    (Dream)."""
    return train_bpe(texts, vocab_size, text.SPECIAL_TOKENS, eos_token=text.EOS_TOKEN,
                     pad_token=text.EOS_TOKEN, mask_token=text.MASK_TOKEN)


def train_processor(texts: list[str]) -> LlavaProcessor:
    """The VLM zoo's processor, its tokenizer trained on the scene texts and the chat template's
    words (so that `USER:` and `ASSISTANT:` are tokens of their own)."""
    tokenizer = train_bpe(texts + ["USER: ASSISTANT:"], vlm.VOCAB_SIZE, vlm.SPECIAL_TOKENS,
                          pad_token=vlm.PAD, bos_token=vlm.BOS, eos_token=vlm.EOS,
                          extra_special_tokens={"image_token": vlm.IMAGE})
    return vlm.make_processor(tokenizer)
