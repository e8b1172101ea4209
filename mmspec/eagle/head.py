"""EAGLE-1/2 and EAGLE-3 draft heads as the SafeAILab checkpoints define them.

EAGLE-1/2 (Li et al. 2024; SafeAILab/EAGLE `eagle/model/cnets1.py`), for entry i:

    x_i = fc([embed(t_{i+1}) ; f_i])           # f_i: the target's last hidden state (after its
    h_i = layers(x_i)                           #  final norm), or the draft's own h at a tree node
    p   = softmax(target.lm_head(h_i))          # no final norm

Layer 0 has no input RMSNorm; later layers are plain Llama decoder layers.

EAGLE-3 (Li et al. 2025; SafeAILab/EAGLE `eagle/model/cnets.py`), for entry i:

    g_i = fc([low_i ; mid_i ; high_i])          # three target layers' inputs, no bias; a tree node
                                                #   feeds its parent's h instead and skips fc
    a_i = attn([input_norm(embed(t_{i+1})) ; hidden_norm(g_i)])   # q, k, v read 2d features
    h_i = g_i + a_i;  h_i = h_i + mlp(post_norm(h_i))             # the next node's g
    p   = softmax(lm_head(norm(h_i)))           # over the draft vocabulary; draft id j is
                                                #   target id j + d2t[j]

Module and parameter names are the checkpoints' own (`fc`, `layers.N.self_attn.q_proj`,
`midlayer.hidden_norm`, `d2t`, ...), so a SafeAILab state dict loads without renaming.

Attention is over the drafter's short sequence with an explicit KV prefix, as in ViSpec's head
(`mmspec/vision/head.py`): dense SDPA with a boolean mask, tree levels off a CPU through the shared
block-sparse layer (`tree_attention.py`). Deliberate differences from the reference code: batched
rows with per-row masks and positions, and the attention softmax in the input dtype (the reference
upcasts to fp32; fp32 drafters are identical).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from .draft_kv import extend
from .rope import apply_rope, rope_cos_sin
from .tree_attention import attend


@dataclass(frozen=True)
class EagleConfig:
    """One EAGLE checkpoint's architecture (read from its config.json) and the tree shape."""

    arch: str  # "eagle" (EAGLE-1/2) or "eagle3"
    hidden_size: int
    target_hidden_size: int  # EAGLE-3 `target_hidden_size`, else hidden_size
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    num_layers: int  # EAGLE-3 has exactly one (`midlayer`)
    vocab_size: int
    draft_vocab_size: int  # EAGLE-3 `draft_vocab_size`; equal to vocab_size for EAGLE-1/2
    rms_norm_eps: float = 1e-6  # EConfig's default
    rope_theta: float = 10000.0  # cnets: LlamaRotaryEmbedding's base without a rope_theta
    rope_linear_factor: float = 1.0  # rope_scaling {"type": "linear"}: positions / factor
    fc_bias: bool = True  # ea_model.py: config.json "bias", True when absent (EAGLE-1/2 only)
    qkv_bias: bool = False  # cnets1: config "qkv_bias" (Qwen2 drafters)
    hidden_act: str = "silu"
    # the target hidden states fed to the head: entries of transformers' `hidden_states` tuple
    feature_layers: tuple = (-1,)
    # tree shape, mmspec's meaning: depth = draft levels (EAGLE's `depth` + 1), total_tokens
    # counts the root (as EAGLE's `total_token`); ea_model.py defaults: total_token=60, depth=7,
    # top_k=10
    depth: int = 8
    top_k: int = 10
    total_tokens: int = 60

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads  # cnets: no separate head_dim field

    @property
    def draft_nodes(self) -> int:
        return self.total_tokens - 1


class EagleAttention(nn.Module):
    """Grouped-query attention with an explicit KV prefix; its input is d (EAGLE-1/2) or 2d
    (EAGLE-3: embedding and hidden state side by side)."""

    def __init__(self, cfg: EagleConfig, in_features: int, bias: bool):
        super().__init__()
        dh = cfg.head_dim
        self.q_proj = nn.Linear(in_features, cfg.num_heads * dh, bias=bias)
        self.k_proj = nn.Linear(in_features, cfg.num_kv_heads * dh, bias=bias)
        self.v_proj = nn.Linear(in_features, cfg.num_kv_heads * dh, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * dh, cfg.hidden_size, bias=False)
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, dh

    def forward(self, x, cos, sin, past, mask):
        """x `[B, N, in]`, mask bool `[B, N, P + N]` or a `BlockSparseMask` over the same (a tree
        level) -> out `[B, N, d]`, the new (k, v) `[B, Hkv, N, Dh]`."""
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)  # [B, H, N, Dh]
        k, v = (p(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
                for p in (self.k_proj, self.v_proj))  # [B, Hkv, N, Dh]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attend(q, *extend(past, k, v), mask)  # [B, H, N, Dh]
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1)), (k, v)


class EagleMLP(nn.Module):
    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = ACT2FN[cfg.hidden_act]

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class EagleLayer(nn.Module):
    """A Llama decoder layer. EAGLE-1/2 layer 0 has no input norm; the EAGLE-3 layer norms the
    embedding (`input_layernorm`) and the hidden state (`hidden_norm`) apart and concatenates
    them."""

    def __init__(self, cfg: EagleConfig, index: int):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.eagle3 = cfg.arch == "eagle3"
        if self.eagle3:
            self.hidden_norm = nn.RMSNorm(d, eps)
        if self.eagle3 or index > 0:
            self.input_layernorm = nn.RMSNorm(d, eps)
        self.self_attn = EagleAttention(cfg, 2 * d if self.eagle3 else d,
                                        bias=cfg.qkv_bias and not self.eagle3)
        self.post_attention_layernorm = nn.RMSNorm(d, eps)
        self.mlp = EagleMLP(cfg)

    def forward(self, x, embeds, cos, sin, past, mask):
        if self.eagle3:
            h = torch.cat([self.input_layernorm(embeds), self.hidden_norm(x)], -1)  # [B, N, 2d]
        else:
            h = self.input_layernorm(x) if hasattr(self, "input_layernorm") else x
        a, kv = self.self_attn(h, cos, sin, past, mask)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class EagleHead(nn.Module):
    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        if cfg.arch == "eagle3":
            self.fc = nn.Linear(3 * cfg.target_hidden_size, d, bias=False)
            self.midlayer = EagleLayer(cfg, 0)
            self.norm = nn.RMSNorm(d, cfg.rms_norm_eps)
            self.lm_head = nn.Linear(d, cfg.draft_vocab_size, bias=False)
            if cfg.draft_vocab_size != cfg.vocab_size:
                # `t2d` (which target ids the draft vocabulary holds) only serves training
                self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        else:
            self.fc = nn.Linear(2 * d, d, bias=cfg.fc_bias)
            self.layers = nn.ModuleList(EagleLayer(cfg, i) for i in range(cfg.num_layers))

    @property
    def blocks(self) -> list:
        return [self.midlayer] if self.cfg.arch == "eagle3" else list(self.layers)

    def layer_input(self, embeds, features, from_target: bool):
        """embeds `[B, N, d]`, features `[B, N, F]` -> the first layer's input `[B, N, d]`.

        from_target: the features are the target's hidden states (F = 3 * target d for EAGLE-3);
        otherwise they are the draft's own output at the parent node (F = d)."""
        if self.cfg.arch == "eagle3":
            return self.fc(features) if from_target else features
        return self.fc(torch.cat([embeds, features], -1))

    def forward(self, x, embeds, positions, past: list | None, mask):
        """x, embeds `[B, N, d]`, positions long `[B, N]`, past: per layer (k, v) or None,
        mask bool `[B, N, P + N]` or a `BlockSparseMask` (a tree level, `tree_attention.py`) ->
        (hidden `[B, N, d]`, per-layer new (k, v))."""
        cfg = self.cfg
        pos = positions[None].float() / cfg.rope_linear_factor  # [1, B, N]
        cos, sin = rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta, None, x.dtype)
        new_kv = []
        for i, layer in enumerate(self.blocks):
            x, kv = layer(x, embeds, cos, sin, None if past is None else past[i], mask)
            new_kv.append(kv)
        return x, new_kv

    def draft_logits(self, hidden, target_lm_head: torch.Tensor) -> torch.Tensor:
        """`[..., d]` -> `[..., V_draft]`: EAGLE-3's own norm and head, else the target's head."""
        if self.cfg.arch == "eagle3":
            return self.lm_head(self.norm(hidden))
        return F.linear(hidden, target_lm_head.to(hidden.dtype))

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> the target's ids (`d2t` holds the offsets)."""
        if hasattr(self, "d2t"):
            return draft_ids + self.d2t[draft_ids]
        return draft_ids
