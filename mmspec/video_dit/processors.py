"""diffusers attention processors that run DraftAttention (arXiv 2505.14708) in self-attention.

One processor per model family, each a copy of the model's own processor in diffusers 0.42
(`WanAttnProcessor`, `HunyuanVideoAttnProcessor2_0` (and HunyuanVideo 1.5's, which differs only in
its mask), `CogVideoXAttnProcessor2_0`) with the attention
call replaced by `draft_attention`. Cross-attention and dense layers/steps go to the original
processor untouched (tokens reordered once per forward are whole tiles, with no padding slots for
it to see, and RoPE permuted alike). They read the step, the video grid and the tile layout from a
shared `DraftAttentionState` (see `apply.py`) and report the density of every call to it.

Deliberate differences from the official code: processors instead of patched model code; text
tokens of joint attention (HunyuanVideo after the video, CogVideoX before it) keep dense rows and
columns and their padding is masked, and text blocks that hold only padding are skipped; CogVideoX,
which the official code does not support.
"""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_wan import _get_qkv_projections
from einops import rearrange

from .draft_map import calibrated_sparsity
from .sparse_attention import draft_attention
from .ulysses import ulysses_config, ulysses_draft_attention


def _wan_rope(x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    # the nested `apply_rotary_emb` of diffusers' WanAttnProcessor, verbatim
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


class _DraftProcessor:
    """Shared by every family's processor. What a call needs to decide is set on the processor by
    the state before each transformer forward (`sparse`), and what it reports goes to the
    processor's own list (`densities`), which the state collects after the forward: so no step
    number or layer index is read inside a block, and `torch.compile` of the blocks (diffusers'
    `compile_repeated_blocks`) guards on one bool instead of recompiling for every layer and
    step."""

    def __init__(self, state, layer: int, original):
        self.state = state
        self.layer = layer  # index among the model's self-attention layers
        self.original = original
        self.sparse = False  # this layer runs DraftAttention in the current forward
        self.densities = []  # this forward's calls: 0-d tensor, or None for a dense call
        self.sparsity = state.config.sparsity  # set per layer by calibration
        # the calibration probe: this forward drafts the map, keeps every block and reports the
        # sparsity that keeps `config.mass` of the map (`calibrations`, 0-d tensors)
        self.probe = False
        self.calibrations = []

    # diffusers' `set_attention_backend` sets `_attention_backend` on every processor that has
    # one (`enable_parallelism` sets `_parallel_config`): both live on the original processor,
    # which runs the dense layers and steps, so set before or after applying they choose its
    # backend. A family whose original has none (CogVideoX's) has none here either.
    def _original_attribute(name):
        def get(self):
            if not hasattr(self.original, name):
                raise AttributeError(f"{type(self.original).__name__} has no {name}")
            return getattr(self.original, name)

        def set(self, value):
            get(self)  # an AttributeError where the original has none
            setattr(self.original, name, value)

        return property(get, set)

    _attention_backend = _original_attribute("_attention_backend")
    _parallel_config = _original_attribute("_parallel_config")
    del _original_attribute

    def _attend(self, q, k, v, **kwargs):
        """q, k, v `[B, H, L, D]` -> `[B, H, L, D]`, recording the density. Under diffusers'
        Ulysses context parallelism L is this rank's share of the tokens, and the call drafts
        and selects for this rank's H/N heads on the whole sequence (`ulysses.py`)."""
        parallel = getattr(self.original, "_parallel_config", None)
        if ulysses_config(parallel) is None:
            return self._draft(q, k, v, **kwargs)
        return ulysses_draft_attention(self._draft, q, k, v, parallel, **kwargs)

    def _draft(self, q, k, v, **kwargs):
        state, cfg = self.state, self.state.config
        on_draft_map = None
        if self.probe:
            allowed = kwargs.get("allowed")  # (mask, count) or None
            on_draft_map = lambda probs: self.calibrations.append(calibrated_sparsity(
                probs, cfg.mass, cfg.max_density, None if allowed is None else allowed[1]))
        elif state.on_draft_map is not None:  # a callback with the step: one graph per layer
            step, layer = state.step, self.layer
            on_draft_map = lambda probs: state.on_draft_map(step, layer, probs)
        out, density = draft_attention(
            q, k, v, state.layout, cfg, sparsity=0.0 if self.probe else self.sparsity,
            tiled=state.tiled, on_draft_map=on_draft_map, **kwargs)
        self.densities.append(None if self.probe else density)  # the probe computes every block
        return out


class WanDraftAttnProcessor(_DraftProcessor):
    """Self-attention (`attn1`) of `WanTransformer3DModel`; RoPE is applied in here, as in diffusers."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 rotary_emb=None):
        if encoder_hidden_states is not None or not self.sparse:
            if encoder_hidden_states is None:
                self.densities.append(None)
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask,
                                 rotary_emb)
        if attention_mask is not None:
            raise ValueError(
                "WanDraftAttnProcessor: attention_mask must be None in self-attention (diffusers' "
                f"Wan passes none), got a tensor of shape {tuple(attention_mask.shape)}"
            )
        return self._sparse(attn, hidden_states, rotary_emb)

    def _sparse(self, attn, hidden_states, rotary_emb, **kwargs):
        query, key, value = _get_qkv_projections(attn, hidden_states, None)
        query = attn.norm_q(query).unflatten(2, (attn.heads, -1))  # [B, L, H, D]
        key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            query = _wan_rope(query, *rotary_emb)
            key = _wan_rope(key, *rotary_emb)
        out = self._attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                           **kwargs)
        hidden_states = rearrange(out, "b h l d -> b l (h d)").type_as(query)
        hidden_states = attn.to_out[0](hidden_states)
        return attn.to_out[1](hidden_states)


class SkyReelsV2DraftAttnProcessor(WanDraftAttnProcessor):
    """Self-attention of `SkyReelsV2Transformer3DModel` (Wan's, verbatim in diffusers). Diffusion
    forcing models (`num_frame_per_block` > 1) pass a frame-causal token mask: it becomes the
    tile-level `allowed` mask (`tiles.frame_causal_tiles`, exact, built by the state's pre-forward
    hook), inside which the draft map and the
    budget stay. Which earlier blocks a frame keeps is chosen with the other rows (one budget per
    head), so it can depend on later frames' draft rows; their values never enter. With per-frame
    timesteps (asynchronous diffusion forcing, `ar_step` > 0) the step is the noisiest frame's
    (`DraftAttentionState._update_step` reads the largest timestep)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 rotary_emb=None):
        if attention_mask is None or encoder_hidden_states is not None or not self.sparse:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    rotary_emb)
        state = self.state
        n = hidden_states.shape[1]
        if attention_mask.dtype != torch.bool or tuple(attention_mask.shape[-2:]) != (n, n):
            raise ValueError(
                f"SkyReelsV2DraftAttnProcessor: attention_mask must be the model's bool "
                f"frame-causal mask [1, 1, {n}, {n}], got {attention_mask.dtype} "
                f"{list(attention_mask.shape)}")
        if state.allowed is None:
            raise ValueError("SkyReelsV2DraftAttnProcessor: an attention_mask came with "
                             "num_frame_per_block=1, where diffusers' SkyReels-V2 passes none")
        # (mask, count), built by the pre-forward hook (apply.py)
        return self._sparse(attn, hidden_states, rotary_emb, allowed=state.allowed)


class HunyuanVideoDraftAttnProcessor(_DraftProcessor):
    """Joint attention of `HunyuanVideoTransformer3DModel` (double and single stream blocks)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        if not self.sparse:  # a dense layer or step
            self.densities.append(None)
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask,
                                 image_rotary_emb)
        from diffusers.models.embeddings import apply_rotary_emb

        text_len = 0 if encoder_hidden_states is None else encoder_hidden_states.shape[1]
        if attn.add_q_proj is None and encoder_hidden_states is not None:
            hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)
        query = attn.to_q(hidden_states).unflatten(2, (attn.heads, -1))  # [B, L, H, D]
        key = attn.to_k(hidden_states).unflatten(2, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if image_rotary_emb is not None:
            # RoPE on the video tokens only; in single-stream blocks the text is already appended
            video = query.shape[1] - (text_len if attn.add_q_proj is None else 0)
            query = torch.cat([apply_rotary_emb(query[:, :video], image_rotary_emb, sequence_dim=1),
                               query[:, video:]], dim=1)
            key = torch.cat([apply_rotary_emb(key[:, :video], image_rotary_emb, sequence_dim=1),
                             key[:, video:]], dim=1)
        if attn.add_q_proj is not None and encoder_hidden_states is not None:
            enc_q = attn.add_q_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            enc_k = attn.add_k_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            enc_v = attn.add_v_proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
            if attn.norm_added_q is not None:
                enc_q = attn.norm_added_q(enc_q)
            if attn.norm_added_k is not None:
                enc_k = attn.norm_added_k(enc_k)
            query = torch.cat([query, enc_q], dim=1)
            key = torch.cat([key, enc_k], dim=1)
            value = torch.cat([value, enc_v], dim=1)

        key_valid = None if attention_mask is None else self._key_valid(attention_mask,
                                                                         query.shape[1])
        out = self._attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                           text_len=text_len, key_valid=key_valid)
        hidden_states = rearrange(out, "b h l d -> b l (h d)").to(query.dtype)

        if encoder_hidden_states is not None:
            hidden_states, encoder_hidden_states = (hidden_states[:, :-text_len],
                                                    hidden_states[:, -text_len:])
            if getattr(attn, "to_out", None) is not None:
                hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
            if getattr(attn, "to_add_out", None) is not None:
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states


    @staticmethod
    def _key_valid(attention_mask: torch.Tensor, length: int) -> torch.Tensor:
        """bool `[B, L]`, False on text padding, from diffusers' bool `[B, 1, 1, L]` (or an
        additive mask, 0 where kept)."""
        key_valid = attention_mask.reshape(attention_mask.shape[0], -1)
        return key_valid if key_valid.dtype == torch.bool else key_valid == 0


class HunyuanVideo15DraftAttnProcessor(HunyuanVideoDraftAttnProcessor):
    """Joint attention of `HunyuanVideo15Transformer3DModel` (HunyuanVideo 1.5, dual-stream
    blocks only): the computation of diffusers' `HunyuanVideo15AttnProcessor2_0` is the one above;
    only its mask differs, `[B, text]` with True on valid text tokens, which the video keys in
    front of the text extend as valid."""

    @staticmethod
    def _key_valid(attention_mask: torch.Tensor, length: int) -> torch.Tensor:
        mask = attention_mask.bool()
        return torch.nn.functional.pad(mask, (length - mask.shape[1], 0), value=True)


class CogVideoXDraftAttnProcessor(_DraftProcessor):
    """Joint attention (`attn1`) of `CogVideoXTransformer3DModel`; the text comes first."""

    def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask=None,
                 image_rotary_emb=None):
        if not self.sparse:  # a dense layer or step
            self.densities.append(None)
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask,
                                 image_rotary_emb)
        if attention_mask is not None:
            raise ValueError(
                "CogVideoXDraftAttnProcessor: attention_mask must be None (diffusers' CogVideoX "
                f"passes none), got a tensor of shape {tuple(attention_mask.shape)}"
            )
        from diffusers.models.embeddings import apply_rotary_emb

        text_len = encoder_hidden_states.size(1)
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        b = hidden_states.shape[0]
        query = attn.to_q(hidden_states).view(b, -1, attn.heads, attn.to_q.out_features // attn.heads)
        key = attn.to_k(hidden_states).view(b, -1, attn.heads, attn.to_k.out_features // attn.heads)
        value = attn.to_v(hidden_states).view(b, -1, attn.heads, attn.to_v.out_features // attn.heads)
        query, key, value = (x.transpose(1, 2) for x in (query, key, value))  # [B, H, L, D]
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if image_rotary_emb is not None:
            query[:, :, text_len:] = apply_rotary_emb(query[:, :, text_len:], image_rotary_emb)
            key[:, :, text_len:] = apply_rotary_emb(key[:, :, text_len:], image_rotary_emb)
        out = self._attend(query, key, value, text_len=text_len, text_first=True)
        hidden_states = out.transpose(1, 2).reshape(b, -1, out.shape[1] * out.shape[3])
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        encoder_hidden_states, hidden_states = hidden_states.split(
            [text_len, hidden_states.size(1) - text_len], dim=1
        )
        return hidden_states, encoder_hidden_states
