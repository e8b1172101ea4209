"""The VLM zoo's model specs: one frozen dataclass per shipped model.

Sizes were picked so that each recipe trains in well under an hour on one or two threads of the
project's shared 2-core machines (each card records its run's wall time). The target is deep
rather than wide because a tiny model's decode step is dominated by per-layer overhead, and the
ViSpec head is one layer: depth buys the drafter its speed-up ratio. The recipes tried and not
shipped are `experiments.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

from mmspec.zoo.scenes import IMAGE_SIZE
from mmspec.zoo.vlm_processor import PATCH_SIZE


@dataclass(frozen=True)
class VLMSpec:
    """A LLaVA-1.5 layout (CLIP vision tower, 2-layer GELU projector, Llama text model); with
    `vision_layers=0` a text-only `LlamaForCausalLM` on the same tokenizer."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    steps: int
    vision_hidden: int = 128
    vision_layers: int = 3
    # image tokens per image: (IMAGE_SIZE / patch_size)^2, 64 at 8. Patch 4 gives 256, nearer
    # LLaVA's 576 (ViSpec's case), at about three times the training cost
    patch_size: int = PATCH_SIZE
    batch_size: int = 16
    lr: float = 1e-3  # small models tolerate a high peak LR; cosine decay to 10%
    warmup: int = 50
    describe_share: float = 0.6  # share of training scenes asked for a description
    per_answer_loss: bool = False  # average per answer, not per token (vlm_data.answer_loss)
    projector_gain: float = 1.0  # scales the projector's linear_2 (weight and bias) at init
    vision_lr_mult: float = 1.0  # LR multiplier of the vision tower and projector
    init_from: str = ""  # "<git rev>:<entry dir>": start from those committed weights
    vision_pretrain_steps: int = 0  # stage 0: the CLIP tower alone on patch colour / kind labels
    vision_pretrain_lr: float = 2e-3
    # keep the pre-trained tower fixed while the projector and LM learn (needs the stage above);
    # the shipped vlm-target's recipe (its card has the pilots that led to it)
    freeze_vision: bool = False
    colour_share: float = 0.0  # share of training scenes asked a colour question (scenes.question_answer)
    image_word_loss: float = 0.0  # weight of vlm_data.image_word_loss (image tokens name their words)
    drafters: tuple[str, ...] = ()

    def __post_init__(self):
        if self.patch_size < 1 or IMAGE_SIZE % self.patch_size:
            raise ValueError(f"patch_size: expected a divisor of the image size {IMAGE_SIZE}, "
                             f"got {self.patch_size}")
        if self.freeze_vision and not (self.vision_pretrain_steps or self.init_from):
            raise ValueError("freeze_vision: expected vision_pretrain_steps > 0 or init_from (a "
                             "frozen tower must be pre-trained first), got vision_pretrain_steps "
                             f"{self.vision_pretrain_steps} and no init_from")
        if not 0.0 <= self.colour_share <= 1.0:
            raise ValueError(f"colour_share: expected a share in [0, 1], got {self.colour_share}")
        if self.image_word_loss < 0 or (self.image_word_loss and not self.vision_layers):
            raise ValueError("image_word_loss: expected a weight >= 0, and 0 for a text-only "
                             f"model, got {self.image_word_loss} with {self.vision_layers} "
                             "vision layers")

    def text_config(self, tokenizer) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
            max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id)

    def llava_config(self, tokenizer) -> LlavaConfig:
        vision = CLIPVisionConfig(hidden_size=self.vision_hidden,
                                  intermediate_size=4 * self.vision_hidden,
                                  num_hidden_layers=self.vision_layers,
                                  num_attention_heads=self.vision_hidden // 32,
                                  image_size=IMAGE_SIZE, patch_size=self.patch_size)
        return LlavaConfig(vision_config=vision, text_config=self.text_config(tokenizer),
                           image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                           projector_hidden_act="gelu", vision_feature_layer=-1,
                           vision_feature_select_strategy="default",
                           image_seq_length=(IMAGE_SIZE // self.patch_size) ** 2,
                           tie_word_embeddings=True)


@dataclass(frozen=True)
class DrafterSpec:
    """A ViSpec drafter (or its text-only ablation) trained by `mmspec.vision.train`."""

    name: str
    text_only: bool
    steps: int
    samples: int = 600  # training scenes (prompts); answers are the target's own, greedy
    held_out: int = 16  # held-out scenes for tau
    lr: float = 1e-3  # tiny head: mmspec.vision.train's docs suggest ~1e-3
    warmup_steps: int = 100
    answer_tokens: int = 192  # the longest scene description is ~185 tokens
    eval_new_tokens: int = 128
    target: str = "vlm-target"  # the zoo entry it drafts for (and whose answers it learns)
    num_queries: int = 2  # the adaptor's queries: num_queries - 1 compressed tokens + 1 global
    # EAGLE-3's pieces on a ViSpec drafter (issue 30's variant): "eagle3" fuses the target's
    # layers 2, L//2, L-3 (`ViSpecConfig.feature_layers`); training_time_test makes the
    # rollout_steps passes EAGLE-3's tree levels (`mmspec.vision.train.tree_passes`)
    features: str = "last"
    rollout_steps: int = 1
    training_time_test: bool = False

    def __post_init__(self):
        if self.features not in ("last", "eagle3"):
            raise ValueError(f"DrafterSpec {self.name}: features must be 'last' or 'eagle3', got "
                             f"{self.features!r}")


SPECS = {
    s.name: s
    for s in (
        # a fine-tune of the committed target named in `init_from` (CLIP tower pre-trained alone
        # on patch colour / shape-kind labels, then frozen under the LM's steps; its card is kept
        # in this card's `init_from`). Half the scenes ask a colour question and every image
        # token learns to read as its patch's words, so the target names the colour of a lone
        # shape; colours in scenes of several kinds stay weak. Everything tried on colour
        # binding, and why it was not shipped, is in the card's `attempts`.
        VLMSpec("vlm-target", hidden_size=192, num_layers=8, num_heads=3, num_kv_heads=1,
                intermediate_size=576, steps=1000, lr=1e-3, warmup=20,
                init_from="50c0e3b:assets/zoo/vlm-target", freeze_vision=True,
                colour_share=0.5, image_word_loss=0.3,
                drafters=("vlm-vispec", "vlm-text-drafter", "vlm-eagle3", "vlm-assistant")),
        # HF assisted-generation baseline: same tokenizer, sees the prompt's <image> tokens as text
        VLMSpec("vlm-assistant", hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                intermediate_size=384, steps=500, vision_layers=0),
        # the target's answers to the 2400 prompts are computed once (cached, shared by both);
        # fewer prompts and steps left both undertrained, the text-only one more so (vlm-vispec
        # card `attempts`). Both train with EAGLE-3's training-time test, which raised tau on
        # the zoo chain over ViSpec's shifted rollout, the same recipe otherwise (two seeds each,
        # BENCHMARKS.md `vispec_variants`; the old recipe is experiments.py's vlm-vispec-shifted)
        DrafterSpec("vlm-vispec", text_only=False, steps=5000, samples=2400, rollout_steps=6,
                    training_time_test=True),
        DrafterSpec("vlm-text-drafter", text_only=True, steps=5000, samples=2400,
                    rollout_steps=6, training_time_test=True),
    )
}
