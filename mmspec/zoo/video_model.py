"""The video zoo model: a tiny `WanTransformer3DModel` (diffusers) denoising pixels, conditioned on a
caption encoded by a tiny frozen `UMT5EncoderModel` over a word-level tokenizer.

Choices (and why):
- pixel space, no VAE: the clips are 32x32 and flat-coloured, a VAE would cost more to train than
  it saves; Wan's patchify (1, 2, 2) turns a frame into a 16x16 token grid, i.e. 4x4 = 16 tiles of
  (4, 4) tokens for DraftAttention, and RoPE lets the model be sampled on larger grids;
- the text encoder stays at its seeded random init (frozen): the caption vocabulary has 16 words,
  a random 1-layer UMT5 keeps them distinguishable, and Wan's trained `text_embedder` and
  cross-attention learn to read it. Its weights ship with the transformer so nothing is
  re-derived at load time;
- rectified flow matching as in Wan: x_t = (1 - t) x_0 + t n, the model predicts v = n - x_0 at
  timestep 1000 t; t ~ logit-normal(0, 1) (SD3) shifted by 3 towards noise (`train_video.sample_t`); 10% of captions are dropped to "" so the
  pipeline can use classifier-free guidance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from diffusers import WanTransformer3DModel
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

from mmspec.zoo.clips import WORDS

MAX_TEXT_LEN = 8  # "a <colour> <shape> moving <direction>" + </s>, padded


@dataclass(frozen=True)
class VideoModelSpec:
    """The defaults are the shipped `video-dit` (`train_video.SPEC`).

    Heads of 128, Wan 2.1's head size. Wan RMS-normalises q and k, so a head's logits are bounded
    by about sqrt(head_dim) (gains ~1): with 4 heads of 32 the zoo DiT's attention stayed diffuse
    (10% of the blocks held 30% of the mass at the training grid), with 1 head of 128 they held
    62% (400-step pilots on the same textured clips; video-dit card `attempts`). Two heads of 128
    and 3 layers (2.5M parameters, 5.1 MB in fp16) fit the zoo's 40 MB; 4 layers (3.2M) would
    leave none.
    """

    # token grid at training size: (frames, height / 2, width / 2) = (4, 16, 16), 1024 tokens
    frames: int = 4
    height: int = 32
    width: int = 32
    num_layers: int = 3
    num_heads: int = 2
    head_dim: int = 128  # Wan RoPE splits it 44 (t) / 42 (h) / 42 (w)
    ffn_dim: int = 256
    text_dim: int = 32
    freq_dim: int = 64
    text_layers: int = 1

    def transformer_config(self) -> dict:
        return dict(patch_size=(1, 2, 2), num_attention_heads=self.num_heads,
                    attention_head_dim=self.head_dim, in_channels=3, out_channels=3,
                    text_dim=self.text_dim, freq_dim=self.freq_dim, ffn_dim=self.ffn_dim,
                    num_layers=self.num_layers, cross_attn_norm=True,
                    qk_norm="rms_norm_across_heads", rope_max_seq_len=256)

    def text_config(self) -> UMT5Config:
        return UMT5Config(vocab_size=len(WORDS) + 3, d_model=self.text_dim, d_kv=8,
                          d_ff=2 * self.text_dim, num_layers=self.text_layers, num_heads=4,
                          relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1,
                          decoder_start_token_id=0)

    def to_dict(self) -> dict:
        return asdict(self)


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["<pad>", "</s>", "<unk>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>")


def build_transformer(spec: VideoModelSpec) -> WanTransformer3DModel:
    return WanTransformer3DModel(**spec.transformer_config())


def build_text_encoder(spec: VideoModelSpec, seed: int = 0) -> UMT5EncoderModel:
    torch.manual_seed(seed)
    return UMT5EncoderModel(spec.text_config()).eval().requires_grad_(False)


@torch.no_grad()
def encode_prompts(tokenizer, text_encoder, prompts: list[str]) -> torch.Tensor:
    """Captions -> `[B, MAX_TEXT_LEN, text_dim]`, zero past each caption's </s> (as WanPipeline)."""
    ids = [tokenizer(p.lower())["input_ids"][: MAX_TEXT_LEN - 1] + [tokenizer.eos_token_id]
           for p in prompts]
    input_ids = torch.zeros(len(ids), MAX_TEXT_LEN, dtype=torch.long)
    mask = torch.zeros(len(ids), MAX_TEXT_LEN, dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    device = text_encoder.device  # on a GPU under `pipe.to("cuda")`
    hidden = text_encoder(input_ids=input_ids.to(device), attention_mask=mask.to(device))
    hidden = hidden.last_hidden_state
    return hidden * mask[..., None].to(hidden)
