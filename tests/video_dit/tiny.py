"""Tiny configs of the real diffusers video classes, built offline on CPU (no downloads)."""

import torch
from diffusers import (
    AutoencoderKLWan,
    CogVideoXTransformer3DModel,
    FlowMatchEulerDiscreteScheduler,
    HunyuanVideoTransformer3DModel,
    WanPipeline,
    WanTransformer3DModel,
)
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

WORDS = ["a", "cat", "dog", "runs", "on", "the", "beach", "in", "snow", "red", "blue", "car", "city", "at", "night"]


# Wan's layout at a tiny size, shared by Wan, Wan VACE, SkyReels-V2 and the Wan I2V transformer
WAN_TINY = {"patch_size": (1, 2, 2), "num_attention_heads": 2, "attention_head_dim": 12,
            "in_channels": 4, "out_channels": 4, "text_dim": 16, "freq_dim": 32, "ffn_dim": 32,
            "rope_max_seq_len": 32}


def tiny_wan(num_layers: int = 2, seed: int = 0) -> WanTransformer3DModel:
    torch.manual_seed(seed)
    return WanTransformer3DModel(**WAN_TINY, num_layers=num_layers).eval()


def tiny_wan_vace(num_layers: int = 3, seed: int = 0, vace_in_channels: int = 6):
    """WanVACETransformer3DModel: Wan blocks plus VACE blocks (control video) after 0 and 2."""
    from diffusers import WanVACETransformer3DModel

    torch.manual_seed(seed)
    return WanVACETransformer3DModel(**WAN_TINY, num_layers=num_layers, vace_layers=[0, 2],
                                     vace_in_channels=vace_in_channels).eval()


def tiny_skyreels(num_layers: int = 2, seed: int = 0, frames_per_block: int = 1):
    """SkyReelsV2Transformer3DModel (Wan's layout); `frames_per_block` > 1 is diffusion forcing."""
    from diffusers import SkyReelsV2Transformer3DModel

    torch.manual_seed(seed)
    return SkyReelsV2Transformer3DModel(**WAN_TINY, num_layers=num_layers,
                                        num_frame_per_block=frames_per_block).eval()


def tiny_hunyuan(seed: int = 0, num_layers: int = 1, num_single_layers: int = 1,
                 in_channels: int = 4, **config) -> HunyuanVideoTransformer3DModel:
    torch.manual_seed(seed)
    return HunyuanVideoTransformer3DModel(
        in_channels=in_channels, out_channels=4, num_attention_heads=2, attention_head_dim=8,
        num_layers=num_layers, num_single_layers=num_single_layers, num_refiner_layers=1,
        patch_size=1, patch_size_t=1, text_embed_dim=16,
        pooled_projection_dim=8, rope_axes_dim=(2, 2, 4), **config,
    ).eval()


def tiny_hunyuan15(seed: int = 0, num_layers: int = 2, in_channels: int = 4, **config):
    """HunyuanVideo15Transformer3DModel: dual-stream blocks, two text encoders and image tokens."""
    from diffusers import HunyuanVideo15Transformer3DModel

    torch.manual_seed(seed)
    return HunyuanVideo15Transformer3DModel(
        in_channels=in_channels, out_channels=4, num_attention_heads=2, attention_head_dim=8,
        num_layers=num_layers, num_refiner_layers=1, text_embed_dim=16, text_embed_2_dim=12,
        image_embed_dim=8, rope_axes_dim=(2, 2, 4), **config,
    ).eval()


def tiny_cogvideox(seed: int = 0, num_layers: int = 2) -> CogVideoXTransformer3DModel:
    torch.manual_seed(seed)
    return CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
        time_embed_dim=4, text_embed_dim=16, num_layers=num_layers, sample_width=10,
        sample_height=6, sample_frames=9, patch_size=2, temporal_compression_ratio=4, max_text_seq_length=7,
        use_rotary_positional_embeddings=True,
    ).eval()


def tiny_tokenizer(special: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """Word-level over WORDS; `special` tokens follow them in the vocabulary and are matched whole
    before the split on whitespace and punctuation (Llama's `<|eot_id|>`, Llava's `<image>`)."""
    vocab = {w: i for i, w in enumerate(["<pad>", "</s>", "<unk>", *WORDS, *special])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(special))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>")


# the call of the tiny Wan-family pipelines in tests: 5 frames of 64 x 64, 3 steps, CFG 2
TINY_CALL = {"negative_prompt": "blue", "height": 64, "width": 64, "num_frames": 5,
             "num_inference_steps": 3, "guidance_scale": 2.0, "max_sequence_length": 8,
             "output_type": "np"}


def tiny_wan_pipeline(seed: int = 0) -> WanPipeline:
    torch.manual_seed(seed)
    text_encoder = UMT5EncoderModel(UMT5Config(
        vocab_size=len(WORDS) + 3, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )).eval()
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
    ).eval()
    return WanPipeline(
        tokenizer=tiny_tokenizer(), text_encoder=text_encoder, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), transformer=tiny_wan(seed=seed),
    )


def tiny_wan_i2v_pipeline(seed: int = 0, expand_timesteps: bool = False):
    """WanImageToVideoPipeline as Wan 2.2 builds it (no CLIP image encoder): the transformer takes
    the noise, the encoded first frame and its mask (4 + 4 + 4 channels). `expand_timesteps`:
    as Wan2.2-TI2V-5B, the first latent frame is the image itself and the transformer gets a
    timestep per token (0 on the first frame)."""
    from diffusers import WanImageToVideoPipeline

    base = tiny_wan_pipeline(seed)
    torch.manual_seed(seed)
    channels = 4 if expand_timesteps else 12
    transformer = WanTransformer3DModel(**{**WAN_TINY, "in_channels": channels},
                                        num_layers=2).eval()
    return WanImageToVideoPipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder,
                                   vae=base.vae, scheduler=base.scheduler, transformer=transformer,
                                   expand_timesteps=expand_timesteps)


def tiny_cogvideox_pipeline(seed: int = 0, image_to_video: bool = False):
    """CogVideoXPipeline: tiny T5 encoder, tiny VAE, and a transformer whose latent frames are
    2 x 4 x 4 tokens (height = width = 64, 5 frames). `image_to_video`:
    CogVideoXImageToVideoPipeline, the image latents concatenated (4 + 4 channels)."""
    from diffusers import (
        AutoencoderKLCogVideoX,
        CogVideoXDDIMScheduler,
        CogVideoXImageToVideoPipeline,
        CogVideoXPipeline,
    )
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    text_encoder = T5EncoderModel(T5Config(
        vocab_size=len(WORDS) + 3, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )).eval()
    vae = AutoencoderKLCogVideoX(
        in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
        up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
        latent_channels=4, layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4,
    ).eval()
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=8 if image_to_video else 4,
        out_channels=4, time_embed_dim=4, text_embed_dim=16, num_layers=2, sample_width=8,
        sample_height=8, sample_frames=5, patch_size=2, temporal_compression_ratio=4,
        max_text_seq_length=8, use_rotary_positional_embeddings=True,
    ).eval()
    cls = CogVideoXImageToVideoPipeline if image_to_video else CogVideoXPipeline
    return cls(tokenizer=tiny_tokenizer(), text_encoder=text_encoder, vae=vae,
               transformer=transformer, scheduler=CogVideoXDDIMScheduler())


def tiny_skyreels_pipeline(diffusion_forcing: bool = False, seed: int = 0,
                           image_to_video: bool = False):
    """SkyReelsV2Pipeline, or SkyReelsV2DiffusionForcingPipeline (which sets the transformer's
    num_frame_per_block to its causal_block_size), on the tiny Wan parts. `image_to_video`:
    SkyReelsV2ImageToVideoPipeline, with a tiny CLIP image encoder (its tokens go to the
    cross-attention) and the first frame's latents concatenated (4 + 4 + 4 channels)."""
    from diffusers import (
        SkyReelsV2DiffusionForcingPipeline,
        SkyReelsV2ImageToVideoPipeline,
        SkyReelsV2Pipeline,
        SkyReelsV2Transformer3DModel,
        UniPCMultistepScheduler,
    )

    base = tiny_wan_pipeline(seed)
    parts = {"tokenizer": base.tokenizer, "text_encoder": base.text_encoder, "vae": base.vae,
             "scheduler": UniPCMultistepScheduler(prediction_type="flow_prediction",
                                                  use_flow_sigmas=True, flow_shift=8.0)}
    if image_to_video:
        from transformers import (
            CLIPImageProcessor,
            CLIPVisionConfig,
            CLIPVisionModelWithProjection,
        )

        torch.manual_seed(seed)
        clip = CLIPVisionModelWithProjection(CLIPVisionConfig(
            hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
            image_size=32, patch_size=8, projection_dim=8)).eval()
        transformer = SkyReelsV2Transformer3DModel(**{**WAN_TINY, "in_channels": 12},
                                                   num_layers=2, image_dim=8).eval()
        pipe = SkyReelsV2ImageToVideoPipeline(
            **parts, image_encoder=clip, transformer=transformer,
            image_processor=CLIPImageProcessor(crop_size=32, size={"shortest_edge": 32}))
    else:
        cls = SkyReelsV2DiffusionForcingPipeline if diffusion_forcing else SkyReelsV2Pipeline
        pipe = cls(**parts, transformer=tiny_skyreels(seed=seed))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_hunyuan_pipeline(seed: int = 0):
    """HunyuanVideoPipeline: tiny Llama and CLIP text encoders (our word-level tokenizer for both),
    a tiny VAE (8x spatial, 4x temporal), and a transformer with guidance embedding."""
    from diffusers import AutoencoderKLHunyuanVideo, HunyuanVideoPipeline
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    torch.manual_seed(seed)
    ids = {"vocab_size": len(WORDS) + 3, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 1}
    # the pipeline takes the hidden states 3 layers from the top
    llama = LlamaModel(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                   num_attention_heads=2, num_key_value_heads=2, **ids)).eval()
    clip = CLIPTextModel(CLIPTextConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                        num_attention_heads=2, max_position_embeddings=77,
                                        projection_dim=8, **ids)).eval()
    vae = AutoencoderKLHunyuanVideo(
        in_channels=3, out_channels=3, latent_channels=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
        layers_per_block=1, norm_num_groups=4, spatial_compression_ratio=8,
        temporal_compression_ratio=4,
    ).eval()
    return HunyuanVideoPipeline(
        text_encoder=llama, tokenizer=tiny_tokenizer(), text_encoder_2=clip,
        tokenizer_2=tiny_tokenizer(), vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        transformer=tiny_hunyuan(seed=seed, num_layers=2, num_single_layers=2),
    )


# HunyuanVideo-I2V's prompt template at the tiny size (the whitespace is dropped): the system turn
# holds the image, 16 CLIP patch tokens once expanded (from position 3), whose hidden states lead
# the prompt embeddings; the rest of the turn is cropped off after the text encoder, as are the 4
# tokens that end the user turn. crop_start: the tokens before the prompt
HUNYUAN_I2V_SPECIAL = ("<image>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                       "system", "user", "assistant")
HUNYUAN_I2V_TEMPLATE = {
    "template": "<|start_header_id|>system<|end_header_id|>\n\n<image>\nthe city<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "crop_start": 10, "image_emb_start": 3, "image_emb_end": 19, "image_emb_len": 16,
}


def tiny_hunyuan_i2v_pipeline(seed: int = 0, image_condition_type: str = "token_replace"):
    """HunyuanVideoImageToVideoPipeline: the text encoder is a tiny Llava (Llama text model, CLIP
    vision tower on 32x32 images: 16 image tokens in the prompt), with HUNYUAN_I2V_TEMPLATE; the
    CLIP text encoder, VAE and scheduler of `tiny_hunyuan_pipeline`. `image_condition_type`:
    "token_replace" (HunyuanVideo-I2V: the first latent frame is the image's, modulated as at
    t = 0) or "latent_concat" (HunyuanVideo-I2V-33ch: noise, image latents on the first frame
    and their mask, 4 + 4 + 1 channels; the decoded video loses its first 4 frames)."""
    from diffusers import HunyuanVideoImageToVideoPipeline
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    base = tiny_hunyuan_pipeline(seed)
    tokenizer = tiny_tokenizer(HUNYUAN_I2V_SPECIAL)
    torch.manual_seed(seed)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                       num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
                       pad_token_id=0, eos_token_id=1, bos_token_id=1)
    vision = CLIPVisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                              num_attention_heads=2, image_size=32, patch_size=8)
    # the pipeline reads pad_token_id from the Llava config itself
    llava = LlavaForConditionalGeneration(LlavaConfig(
        text_config=text, vision_config=vision, pad_token_id=0,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"))).eval()
    transformer = tiny_hunyuan(seed=seed, num_layers=2, num_single_layers=2,
                               in_channels=9 if image_condition_type == "latent_concat" else 4,
                               image_condition_type=image_condition_type)
    pipe = HunyuanVideoImageToVideoPipeline(
        text_encoder=llava, tokenizer=tokenizer, transformer=transformer, vae=base.vae,
        scheduler=base.scheduler, text_encoder_2=base.text_encoder_2,
        tokenizer_2=base.tokenizer_2, image_processor=CLIPImageProcessorPil(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_hunyuan15_pipeline(seed: int = 0, image_to_video: bool = False):
    """HunyuanVideo15Pipeline (text-to-video): tiny Qwen2.5-VL text model and ByT5 encoder, a tiny
    VAE (16x spatial, 4x temporal), CFG through diffusers' guider (one forward per branch). The
    transformer takes the noise, the condition latents and their mask: 4 + 4 + 1 channels.
    Tests pass prompt embeddings: the pipeline's chat prompt template needs Qwen's tokenizer.
    `image_to_video`: HunyuanVideo15ImageToVideoPipeline, with a tiny SigLIP encoder whose 16
    tokens per 32x32 image join the text; video sizes are buckets of 128 pixels."""
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        ClassifierFreeGuidance,
        HunyuanVideo15Pipeline,
    )
    from transformers import (
        ByT5Tokenizer,
        Qwen2_5_VLTextConfig,
        Qwen2_5_VLTextModel,
        T5Config,
        T5EncoderModel,
    )

    torch.manual_seed(seed)
    qwen = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(
        vocab_size=len(WORDS) + 3, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, bos_token_id=1, eos_token_id=1,
        rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]})).eval()
    byt5 = T5EncoderModel(T5Config(vocab_size=384, d_model=12, d_kv=6, d_ff=24, num_layers=1,
                                   num_heads=2, relative_attention_num_buckets=8)).eval()
    vae = AutoencoderKLHunyuanVideo15(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,) * 5,
        layers_per_block=1, spatial_compression_ratio=16, temporal_compression_ratio=4).eval()
    parts = {"text_encoder": qwen, "tokenizer": tiny_tokenizer(), "text_encoder_2": byt5,
             "tokenizer_2": ByT5Tokenizer(), "vae": vae,
             "scheduler": FlowMatchEulerDiscreteScheduler(shift=7.0),
             "guider": ClassifierFreeGuidance(guidance_scale=6.0)}
    if not image_to_video:
        return HunyuanVideo15Pipeline(**parts, transformer=tiny_hunyuan15(seed, in_channels=9))
    from diffusers import HunyuanVideo15ImageToVideoPipeline
    from transformers import SiglipImageProcessorPil, SiglipVisionConfig, SiglipVisionModel

    siglip = SiglipVisionModel(SiglipVisionConfig(
        hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        image_size=32, patch_size=8)).eval()
    return HunyuanVideo15ImageToVideoPipeline(
        **parts, transformer=tiny_hunyuan15(seed, in_channels=9, target_size=128),
        image_encoder=siglip, feature_extractor=SiglipImageProcessorPil(
            size={"height": 32, "width": 32}))
