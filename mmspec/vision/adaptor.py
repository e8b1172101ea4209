"""The vision adaptor (ViSpec `ImgAdaptor`, `vispec.md` §1.3).

A few learnable queries cross-attend, in one non-causal attention step, over one image's token
embeddings (the target's projected image features, layer-0 `inputs_embeds` at the image positions;
the target's hidden states there are not used). For `num_queries = Q` the first Q - 1 outputs become
compressed image tokens of the draft sequence, the last one the image's global vector.

Deliberate difference: images are processed as a padded batch with a key mask, so any number of
images of any token count (LLaVA-NeXT anyres, Qwen2.5-VL dynamic resolution) works in one call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ViSpecConfig


class VisionAdaptor(nn.Module):
    def __init__(self, cfg: ViSpecConfig):
        super().__init__()
        inner = cfg.num_heads * cfg.head_dim
        self.heads, self.head_dim = cfg.num_heads, cfg.head_dim
        # vispec.md §1.3: queries [num_q, heads, head_dim] ~ N(0, head_dim^-0.5)
        self.queries = nn.Parameter(torch.randn(cfg.num_queries, cfg.num_heads, cfg.head_dim)
                                    * cfg.head_dim ** -0.5)
        self.k_proj = nn.Linear(cfg.hidden_size, inner, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, inner, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(inner, cfg.hidden_size, bias=False)

    def forward(self, images: list) -> torch.Tensor:
        """images: K tensors `[n_k, d]` -> `[K, Q, d]`."""
        k_imgs = len(images)
        n_max = max(x.shape[0] for x in images)
        d = images[0].shape[-1]
        x = images[0].new_zeros(k_imgs, n_max, d)
        keep = torch.zeros(k_imgs, n_max, dtype=torch.bool, device=x.device)
        for i, img in enumerate(images):
            x[i, : img.shape[0]] = img
            keep[i, : img.shape[0]] = True
        k, v = (p(x).view(k_imgs, n_max, self.heads, self.head_dim).transpose(1, 2)
                for p in (self.k_proj, self.v_proj))  # [K, H, n, Dh]
        q = self.queries.to(x.dtype).transpose(0, 1)[None].expand(k_imgs, -1, -1, -1)  # [K, H, Q, Dh]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        return self.o_proj(out.transpose(1, 2).reshape(k_imgs, q.shape[2], -1))  # [K, Q, d]
