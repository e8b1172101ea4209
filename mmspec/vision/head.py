"""The EAGLE-style draft head (EAGLE-1/2, Li et al. 2024; `vispec.md` §1.2, §1.4).

    x   = fc([embed(token) ; img_fc([feature ; global image vector])])   # [B, N, d]
    h   = decoder layer(s)(x)                                              # predicted feature
    p   = softmax(target.lm_head(h))                                       # no extra final norm

`feature` is the target's last hidden state (post final norm) one position earlier, or with
`feature_layers` (EAGLE-3's multi-layer features) `fuse` of several layers' hidden states side by
side; inside the tree it is the head's own output, which enters without `fuse`. `img_fc` starts
as `[I | 0]`, so a head without image information behaves like the text drafter it starts from.
Compressed image tokens from the vision adaptor skip `fc` and enter the layers directly.

The first layer has no input RMSNorm (EAGLE). Attention over the drafter's own short sequence
(text tokens plus one entry per image) is dense SDPA, except over a tree level off a CPU, which
goes through the shared block-sparse layer (`mmspec/eagle/tree_attention.py` says where each runs
and why).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mmspec.eagle.draft_kv import KV, extend
from mmspec.eagle.rope import apply_rope, rope_cos_sin
from mmspec.eagle.tree_attention import attend

from .config import ViSpecConfig


class HeadAttention(nn.Module):
    """Full multi-head attention (no GQA, as in ViSpec's drafter) with an explicit KV prefix."""

    def __init__(self, cfg: ViSpecConfig):
        super().__init__()
        inner = cfg.num_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, inner, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, inner, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, inner, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(inner, cfg.hidden_size, bias=False)
        self.heads, self.head_dim = cfg.num_heads, cfg.head_dim

    def forward(self, x, cos, sin, past: KV | None, mask):
        """x `[B, N, d]`, mask bool `[B, N, P + N]` or a `BlockSparseMask` over the same (a tree
        level) -> out `[B, N, d]`, the new (k, v) `[B, H, N, Dh]`."""
        b, n, _ = x.shape
        q, k, v = (p(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # [B, H, N, Dh]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attend(q, *extend(past, k, v), mask)  # [B, H, N, Dh]
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1)), (k, v)


class DraftLayer(nn.Module):
    def __init__(self, cfg: ViSpecConfig, first: bool):
        super().__init__()
        # EAGLE: the fused input is already normalised features, so layer 0 skips its input norm
        norm = nn.RMSNorm  # same outputs and `weight` key as the hand-written one it replaced
        self.input_norm = nn.Identity() if first else norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = HeadAttention(cfg)
        self.post_norm = nn.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.gate = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, past, mask):
        a, kv = self.attn(self.input_norm(x), cos, sin, past, mask)
        x = x + a
        h = self.post_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h)), kv


class DraftHead(nn.Module):
    def __init__(self, cfg: ViSpecConfig):
        super().__init__()
        d = cfg.hidden_size
        self.cfg = cfg
        self.fc = nn.Linear(2 * d, d, bias=True)
        layers = len(cfg.feature_layers)
        self.fuse = nn.Linear(layers * d, d, bias=False) if layers else None
        self.img_fc = None if cfg.text_only else nn.Linear(2 * d, d, bias=True)
        self.layers = nn.ModuleList(DraftLayer(cfg, i == 0) for i in range(cfg.num_layers))
        self.reset_img_fc()

    @torch.no_grad()
    def reset_img_fc(self):
        """`img_fc = [I | 0]`, zero bias (vispec.md §1.4)."""
        if self.img_fc is None:
            return
        d = self.cfg.hidden_size
        self.img_fc.weight.zero_()
        self.img_fc.weight[:, :d].copy_(torch.eye(d))
        self.img_fc.bias.zero_()

    def target_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's hidden states `[..., k d]` (k = len(feature_layers), 1 without) ->
        features `[..., d]`."""
        if self.fuse is None:
            return hidden
        return self.fuse(hidden.to(self.fuse.weight.dtype))

    def inputs(self, embeds, features, global_vecs, compressed, is_compressed):
        """All `[B, N, d]` (is_compressed bool `[B, N]`) -> layer input `[B, N, d]`."""
        if self.img_fc is not None:
            features = self.img_fc(torch.cat([features, global_vecs], -1))
        x = self.fc(torch.cat([embeds, features], -1))
        return torch.where(is_compressed[..., None], compressed.to(x.dtype), x)

    def forward(self, x, positions, past: list | None, mask):
        """x `[B, N, d]`, positions long `[A, B, N]`, past: per layer (k, v) `[B, H, P, Dh]` or None,
        mask bool `[B, N, P + N]` or a `BlockSparseMask` (a tree level,
        `mmspec.eagle.tree_attention`) ->
        (hidden `[B, N, d]`, per-layer new (k, v) `[B, H, N, Dh]`)."""
        cfg = self.cfg
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, cfg.mrope_section, x.dtype)
        new_kv = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, cos, sin, None if past is None else past[i], mask)
            new_kv.append(kv)
        return x, new_kv
