"""The built-in default target of `mmspec generate`, until the model zoo exists.

A randomly initialised Llama made on the fly (seeded, a few MB) over a character tokenizer. It needs
no download, so the command always runs, but its text is noise: it shows the engine working
(streaming, acceptance, speed), not a language model. `--target PATH` loads a real one.
"""

from __future__ import annotations

import torch

OFFSET = 3  # ids 0, 1, 2 are pad, bos, eos
CHARS = "".join(chr(c) for c in range(32, 127)) + "\n"  # printable ASCII and newline


class CharTokenizer:
    """One token per printable ASCII character (others become '?'); what the streamers need."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    vocab_size = len(CHARS) + OFFSET

    def encode(self, text: str) -> list[int]:
        return [self.bos_token_id] + [CHARS.find(c if c in CHARS else "?") + OFFSET for c in text]

    def decode(self, ids, skip_special_tokens: bool = True, **kwargs) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return "".join(CHARS[i - OFFSET] for i in ids if i >= OFFSET)


def builtin_model(layers: int = 4, hidden: int = 256, seed: int = 0):
    """A random Llama over `CharTokenizer`'s vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = CharTokenizer()
    cfg = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                      num_key_value_heads=max(1, hidden // 128), max_position_embeddings=4096,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    return model
