"""The text zoo's model specs: one frozen dataclass per shipped model.

Sizes were picked so each recipe fits its share of the CPU budget of the project's 2-core
machines (each card records its run's wall time) and the three fit in ~21 MB as fp16, which with
the VLM (~12 MB) and video (~2 MB) models keeps the zoo under its 40 MB.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import Qwen2Config

from mmspec.zoo.tokenizer import EOS_TOKEN, MASK_TOKEN


@dataclass(frozen=True)
class TextModelSpec:
    name: str
    objective: str  # "causal" (next-token CE) or "diffusion" (masked diffusion, Dream-style)
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    steps: int
    seq_len: int = 256
    batch_size: int = 8  # ~2M tokens in the budget: more, smaller steps learn more per token
    lr: float = 2e-3  # small models tolerate a high peak LR; cosine decay to 10%
    warmup: int = 50
    init_from: str | None = None  # Dream initialises its DLM from an AR checkpoint (Qwen2.5-7B)
    drafters: tuple[str, ...] = ()

    def qwen2_config(self, tokenizer) -> Qwen2Config:
        eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
        mask = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
        extra = {}
        if self.objective == "diffusion":
            # read by mmspec.zoo.load and by whoever builds a DiffusionDrafter from config.json
            extra = dict(is_causal=False, mask_token_id=mask, diffusion_shift=True)
        return Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=4096,
            rope_theta=10000.0,
            tie_word_embeddings=True,
            bos_token_id=eos,
            eos_token_id=eos,
            pad_token_id=eos,
            **extra,
        )


SPECS = {
    s.name: s
    for s in (
        # 8.3M parameters (16.6 MB as fp16), the largest round size the 40 MB zoo leaves room for
        # beside the VLM and video models: 3000 steps x 8 x 256 = 6.1M tokens
        TextModelSpec("text-target", "causal", hidden_size=320, num_layers=6, num_heads=5,
                      num_kv_heads=1, intermediate_size=960, steps=3000, lr=1.5e-3, warmup=100,
                      drafters=("text-drafter", "text-dlm", "text-eagle3")),
        # 5000 steps = 10.2M tokens (1.1 epochs): a drafter trained for a tenth of that falls far
        # behind a target of this size (the card's `attempts`)
        TextModelSpec("text-drafter", "causal", hidden_size=128, num_layers=2, num_heads=2,
                      num_kv_heads=1, intermediate_size=384, steps=5000),
        # Dream recipe: start from the AR drafter's weights, then adapt to masked diffusion
        TextModelSpec("text-dlm", "diffusion", hidden_size=128, num_layers=2, num_heads=2,
                      num_kv_heads=1, intermediate_size=384, steps=3000, lr=1e-3,
                      init_from="text-drafter"),
    )
}
