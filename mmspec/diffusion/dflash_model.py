"""The DFlash and DFlash2 draft networks (z-lab/dflash, `dflash/model.py`), from transformers'
Qwen3 modules, in the authors' parameter names so that their checkpoints load strictly.

A DFlash drafter is a few Qwen3 decoder layers that draft a whole block in one pass. The block's
rows are the last committed token (the *anchor*) and `block_size - 1` mask tokens, embedded with
the target's input embedding; row j's output, through the target's LM head, is the token at the
anchor's position + j (no shift). Every layer's keys and values are the block rows' own
concatenated after a *context*: the target's hidden states of the chosen layers
(`target_layer_ids`, entry id + 1 of transformers' `hidden_states`) at every committed slot before
the anchor, fused by `fc` and `hidden_norm` and then projected by that layer's `k_proj`/`k_norm`/
`v_proj`, roped at their own positions. The block attends to the whole context and to itself both
ways (their `is_causal=False`), unless the config makes a layer causal or sliding.

DFlash2 adds, per layer, a grouped dynamic causal convolution over the block rows before and after
the attention and the MLP (`attention_conv`, `mlp_conv`), and a candidate selector: the top-k
tokens of each position's logits, walked left to right with a low-rank predecessor-successor
score (`candidate_selector`).

Deliberate differences from the reference: any batch (left padding and holes are masked and
positions counted over each row's valid slots), the context keys are cached per slot instead of
cropping a `DynamicCache`, and the attention is one `scaled_dot_product_attention` with an explicit
mask built from positions (the reference builds it from cache indices, equal without holes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3Config,
    Qwen3DecoderLayer,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    rotate_half,
)


@dataclass(frozen=True)
class DFlashConfig:
    """What a DFlash checkpoint's config says beyond its Qwen3 layers (`dflash_config`, else the
    top-level key of the same name, as the reference's `_draft_value` reads it)."""

    kind: str  # "DFlashDraftModel" or "DFlash2DraftModel"
    target_layer_ids: tuple[int, ...]
    block_size: int  # reference default 16
    mask_token_id: int
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    causal: tuple[bool, ...] = ()  # per layer
    window: tuple[int | None, ...] = ()  # per layer: sliding window or None
    conv_kernel_size: int = 0  # DFlash2 only
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0

    @property
    def is_dflash2(self) -> bool:
        return self.kind == "DFlash2DraftModel"


class GroupedDynamicCausalConv(nn.Module):
    """DFlash2's convolution over the block rows: out[t] = sum_o (base[o] + dyn[t, o, group]) *
    x[t - o], causal along the block (zeros before row 0); one kernel before a sublayer
    (`prepare`) and one after it (`finish`), both predicted from the sublayer's input."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden_size))
        groups = hidden_size // group_size
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * groups, bias=False)

    def prepare(self, x: torch.Tensor):
        """x `[B, N, H]` -> (the pre-sublayer convolution of x, the post kernel `[B, N, K, G]`)."""
        groups = x.shape[-1] // self.group_size
        dynamic = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, groups)
        return self._convolve(x, dynamic[..., 0, :, :], self.base_kernel[0]), dynamic[..., 1, :, :]

    def finish(self, x: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        return self._convolve(x, dynamic, self.base_kernel[1])

    def _convolve(self, x, dynamic, base):
        b, n, h = x.shape
        grouped = x.view(b, n, h // self.group_size, self.group_size)  # [B, N, G, g]
        out = torch.zeros_like(grouped)
        for offset in range(self.kernel_size):
            shifted = F.pad(grouped[:, : n - offset], (0, 0, 0, 0, offset, 0))  # row t: x[t - o]
            weight = (base[offset].view(1, 1, -1, self.group_size).to(x.dtype)
                      + dynamic[:, :, offset, :, None])  # [B, N, G, g]
            out = out + weight * shifted
        return out.view(b, n, h)


class CandidateSelector(nn.Module):
    """DFlash2's proposal: the top-k of each position's logits, scored as unary logit +
    <predecessor_code[previous token] * hidden_projection(h), successor_code[candidate]>."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    def candidates(self, logits: torch.Tensor, hidden: torch.Tensor):
        """logits `[B, T, V]`, hidden `[B, T, H]` -> unary `[B, T, k]`, ids `[B, T, k]`,
        projected hidden `[B, T, r]`."""
        unary, ids = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1)
        return unary, ids, self.hidden_projection(hidden)

    def scores(self, unary, ids, projected, previous):
        """One position: unary/ids `[B, k]`, projected `[B, r]`, previous `[B]` -> `[B, k]`."""
        context = self.predecessor_codebook[previous] * projected  # [B, r]
        return unary + torch.einsum("br,bkr->bk", context, self.successor_codebook[ids])


def qwen3_config(raw: dict) -> Qwen3Config:
    """The Qwen3 config of the draft layers (the keys the reference's `Qwen3Config` reads)."""
    fields = {k: v for k, v in raw.items()
              if k not in ("architectures", "auto_map", "dflash_config", "dtype", "torch_dtype")}
    config = Qwen3Config(**fields)
    config._attn_implementation = "sdpa"
    return config


class DFlashModel(nn.Module):
    """The draft network. It owns no embedding and no LM head: the target's are used."""

    def __init__(self, config: Qwen3Config, dflash: DFlashConfig):
        super().__init__()
        self.dflash = dflash
        self.layers = nn.ModuleList(Qwen3DecoderLayer(config, i)
                                    for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.fc = nn.Linear(len(dflash.target_layer_ids) * config.hidden_size, config.hidden_size,
                            bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.head_dim = self.layers[0].self_attn.head_dim
        if dflash.is_dflash2:
            for layer in self.layers:
                layer.attention_conv = GroupedDynamicCausalConv(
                    config.hidden_size, dflash.conv_kernel_size, dflash.conv_group_size)
                layer.mlp_conv = GroupedDynamicCausalConv(
                    config.hidden_size, dflash.conv_kernel_size, dflash.conv_group_size)
            self.candidate_selector = CandidateSelector(
                config.hidden_size, config.vocab_size, dflash.selector_rank, dflash.selector_top_k)

    def weights(self) -> dict:
        """The state dict as a checkpoint holds it: without the rotary tables, which are built."""
        return {k: v for k, v in self.state_dict().items() if "rotary_emb" not in k}

    def _rope(self, x, positions):
        cos, sin = self.rotary_emb(x, positions)  # [B, L, D]
        return cos[:, None], sin[:, None]

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list:
        """features `[B, C, len(ids) * H]` (the target's chosen layers), positions `[B, C]` ->
        per layer (k, v) `[B, Hkv, C, D]`, normed and roped: the context every block attends to."""
        ctx = self.hidden_norm(self.fc(features))  # [B, C, H]
        b, c, _ = ctx.shape
        cos, sin = self._rope(ctx, positions)
        out = []
        for layer in self.layers:
            attn = layer.self_attn
            k = attn.k_norm(attn.k_proj(ctx).view(b, c, -1, self.head_dim)).transpose(1, 2)
            v = attn.v_proj(ctx).view(b, c, -1, self.head_dim).transpose(1, 2)
            out.append((k * cos + rotate_half(k) * sin, v))
        return out

    def masks(self, block_pos, ctx_pos, ctx_valid) -> list:
        """Per layer bool `[B, 1, N, C + N]`: block row i sees key j (context, then block)."""
        key_pos = torch.cat([ctx_pos, block_pos], 1)  # [B, C + N]
        key_valid = torch.cat([ctx_valid, torch.ones_like(block_pos, dtype=torch.bool)], 1)
        delta = block_pos[:, :, None] - key_pos[:, None, :]  # [B, N, C + N] query - key
        out = []
        for causal, window in zip(self.dflash.causal, self.dflash.window):
            visible = key_valid[:, None, :].expand_as(delta)
            if causal:
                visible = visible & (delta >= 0)
            if window is not None:
                visible = visible & (delta < window)
                if not causal:
                    visible = visible & (-delta < window)
            out.append(visible[:, None])
        return out

    def forward(self, noise: torch.Tensor, block_pos: torch.Tensor, ctx_kv: list,
                masks: list) -> torch.Tensor:
        """noise `[B, N, H]` (the block's embeddings), block_pos `[B, N]`, ctx_kv from
        `context_kv`, masks from `masks` -> the final-normed hidden states `[B, N, H]`."""
        b, n, _ = noise.shape
        cos, sin = self._rope(noise, block_pos)
        h = noise
        for layer, (ck, cv), mask in zip(self.layers, ctx_kv, masks):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            x, post = layer.attention_conv.prepare(x) if self.dflash.is_dflash2 else (x, None)
            q = attn.q_norm(attn.q_proj(x).view(b, n, -1, self.head_dim)).transpose(1, 2)
            k = attn.k_norm(attn.k_proj(x).view(b, n, -1, self.head_dim)).transpose(1, 2)
            v = attn.v_proj(x).view(b, n, -1, self.head_dim).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            out = F.scaled_dot_product_attention(  # [B, Hq, N, D]
                q, torch.cat([ck, k], 2), torch.cat([cv, v], 2), attn_mask=mask,
                scale=attn.scaling, enable_gqa=True)
            x = attn.o_proj(out.transpose(1, 2).reshape(b, n, -1))
            h = h + (layer.attention_conv.finish(x, post) if post is not None else x)
            x = layer.post_attention_layernorm(h)
            x, post = layer.mlp_conv.prepare(x) if self.dflash.is_dflash2 else (x, None)
            x = layer.mlp(x)
            h = h + (layer.mlp_conv.finish(x, post) if post is not None else x)
        return self.norm(h)

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """The target's LM head, times `output_multiplier`, soft-capped when the config says so;
        `hidden` is cast to the head's dtype (fp32 master weights over a bf16 target)."""
        logits = lm_head(hidden.to(lm_head.weight.dtype)) * self.dflash.output_multiplier
        cap = self.dflash.final_logit_softcapping
        if cap is not None and cap > 0:
            logits = torch.tanh(logits / cap) * cap
        return logits
