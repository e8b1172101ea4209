"""Whether a drafter's logits and the target's are one vocabulary: the engine compares token ids.

Logit widths may differ inside one tokenizer family (Qwen2.5 >= 7B pads to 152064, Qwen2.5 <= 3B
and Qwen3 to 151936; huggingface/transformers#45307), so widths alone are not a mismatch.
"""

from __future__ import annotations


class VocabularyMismatch(ValueError):
    """The drafter's output vocabulary is not the target's (nor the same one padded)."""


def padded_widths(drafter_width: int, target_width: int) -> bool:
    """Two widths of one tokenizer's output layer padded differently (Qwen2.5-0.5B: 151936 rows,
    Qwen2.5-7B: 152064): within 1% of each other, both multiples of 64 (GPT-2's 50257 beside
    Pythia's 50304 are two tokenizers). A `ModelDrafter` cuts or fills its logits to match."""
    return (abs(drafter_width - target_width) <= 0.01 * target_width
            and drafter_width % 64 == 0 and target_width % 64 == 0)
