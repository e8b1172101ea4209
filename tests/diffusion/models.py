"""Tiny random models of real HF classes: a Qwen2 causal target and a Qwen2 run bidirectionally as a
Dream-style DLM, sharing a toy vocabulary (EOS 1, mask 63)."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB, EOS, MASK = 64, 1, 63


def tiny_qwen2(seed: int, vocab: int = VOCAB, layers: int = 2) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, eos_token_id=EOS, bos_token_id=None,
                         pad_token_id=0, tie_word_embeddings=False, initializer_range=0.3,
                         attn_implementation="sdpa")  # a wide init: peaked, decided logits
    return Qwen2ForCausalLM(config).eval()
