"""Tiny random configs of the three real target classes, and prompts for them (CPU, seeded)."""

import torch
from transformers import (
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    MistralConfig,
    PixtralVisionConfig,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
)

VOCAB = 128
IMAGE = 127  # image token id in every tiny target
EOS = 2


def _text_config(**extra):
    return dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=1024,
                bos_token_id=1, eos_token_id=EOS, pad_token_id=0, **extra)


def _vision_config(image_size=32):
    return CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, image_size=image_size, patch_size=8,
                            projection_dim=32)


def _seeded(seed, build):
    torch.manual_seed(seed)
    return build().eval()


def tiny_llava(seed=0, image_size=32):
    """LLaVA-1.5 layout: CLIP (2 layers) + Llama (2 layers); (image_size / 8)^2 tokens per image."""
    cfg = LlavaConfig(vision_config=_vision_config(image_size), text_config=LlamaConfig(**_text_config()),
                      image_token_id=IMAGE, projector_hidden_act="gelu", vision_feature_layer=-1,
                      image_seq_length=(image_size // 8) ** 2)
    return _seeded(seed, lambda: LlavaForConditionalGeneration(cfg))


def llava_prompt(images=1, tokens_per_image=16, text=(5, 6, 7), seed=0, image_size=32):
    """input_ids `[1, L]` with `images` image spans, each preceded and followed by text."""
    g = torch.Generator().manual_seed(seed)
    ids = [1]
    for _ in range(images):
        ids += list(text) + [IMAGE] * tokens_per_image
    ids += [9, 10, 11]
    pixel_values = torch.randn(images, 3, image_size, image_size, generator=g)
    return torch.tensor([ids]), {"pixel_values": pixel_values}


def tiny_llava_next(seed=0):
    cfg = LlavaNextConfig(vision_config=_vision_config(32), text_config=LlamaConfig(**_text_config()),
                          image_token_id=IMAGE, projector_hidden_act="gelu", vision_feature_layer=-1,
                          image_grid_pinpoints=[[32, 32], [32, 64]], image_seq_length=16)
    return _seeded(seed, lambda: LlavaNextForConditionalGeneration(cfg))


def tiny_pixtral_llava(seed=0):
    """Pixtral / Mistral LLaVA layout: a Pixtral tower (any image size up to 32, patch 8) under
    `LlavaForConditionalGeneration`; an image of h x w has (h / 8) * (w / 8) tokens."""
    vision = PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, image_size=32, patch_size=8)
    cfg = LlavaConfig(vision_config=vision, text_config=MistralConfig(**_text_config()),
                      image_token_id=IMAGE, projector_hidden_act="gelu", vision_feature_layer=-1,
                      vision_feature_select_strategy="full")
    return _seeded(seed, lambda: LlavaForConditionalGeneration(cfg))


def tiny_qwen2_5_vl(seed=0):
    cfg = Qwen2_5_VLConfig(
        vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                       "out_hidden_size": 64, "patch_size": 4, "spatial_merge_size": 2,
                       "temporal_patch_size": 2, "window_size": 16, "fullatt_block_indexes": [1]},
        text_config=_text_config(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                  "mrope_section": [2, 3, 3]}),
        image_token_id=IMAGE, video_token_id=126, vision_start_token_id=124,
        vision_end_token_id=125)
    return _seeded(seed, lambda: Qwen2_5_VLForConditionalGeneration(cfg))


def qwen_prompt(grids=((1, 4, 8),), text=(5, 6, 7), seed=0):
    """input_ids `[1, L]` with one `<vision_start> image <vision_end>` block per grid (t, h, w)."""
    g = torch.Generator().manual_seed(seed)
    ids = [1]
    for t, h, w in grids:
        ids += list(text) + [124] + [IMAGE] * (t * h * w // 4) + [125]
    ids += [9, 10, 11]
    ids = torch.tensor([ids])
    patches = sum(t * h * w for t, h, w in grids)
    extras = {"pixel_values": torch.randn(patches, 3 * 2 * 4 * 4, generator=g),
              "image_grid_thw": torch.tensor(grids),
              "mm_token_type_ids": (ids == IMAGE).int()}
    return ids, extras


def no_eos(target):
    """Generate full-length answers: the random tiny targets would otherwise stop at random."""
    target.generation_config.eos_token_id = None
    return target


def reference(target, ids, extras, new):
    """The target's own greedy answer `[1, L + new]`."""
    return target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=new, **extras)


def quick_train(drafter, target, prompts, steps=40, lr=3e-3):
    """A brief training run (a few seconds) so that drafts get accepted."""
    from mmspec.vision.train import TrainConfig, train

    samples = [{"input_ids": ids, **extras} for ids, extras in prompts]
    cfg = TrainConfig(steps=steps, lr=lr, warmup_steps=4, noise=0.0, answer_tokens=24,
                      eval_every=0, checkpoint_every=0)
    return train(drafter, target, samples, cfg)


def tiny_llava_processor():
    """A LlavaProcessor for `tiny_llava`: word-level tokenizer `w4 ... w126`, `<image>` = 127."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import CLIPImageProcessorPil, LlavaProcessor, PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, IMAGE)] + ["<image>"]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                                   bos_token="<s>", eos_token="</s>",
                                   extra_special_tokens={"image_token": "<image>"})
    template = ("{% for m in messages %}w5 {% for c in m['content'] %}{% if c['type'] == 'image' %}"
                "<image> {% else %}{{ c['text'] }} {% endif %}{% endfor %}{% endfor %}w6")
    images = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return LlavaProcessor(image_processor=images, tokenizer=fast, patch_size=8,
                          vision_feature_select_strategy="default", image_token="<image>",
                          num_additional_image_tokens=1, chat_template=template)
