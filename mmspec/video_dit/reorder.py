"""Tile order once per transformer forward (DraftAttention, arXiv 2505.14708, §3.1 reorder).

Every op of a Wan, HunyuanVideo or CogVideoX block except attention (and RoPE) is token-wise, so
the video tokens can be put in tile order (`tiles.py`) right after patch embedding, with the RoPE
tables permuted alike, and restored once before unpatchify. The official code gathers q, k and v
and scatters the output around every attention layer instead. Only frames of whole tiles are
reordered here: padding slots would travel through every block's FFN and projections (at Wan's
480x832, 31% more tokens, which cost more than reordering in each layer; `apply.py`).

Each `install_*` registers forward hooks on the model's own submodules (no patched model code) that
act only while `state.tiled` is True: in every forward of a model with sparse layers whose frames
are whole tiles, dense warm-up steps included, so that a step cache (diffusers' FirstBlockCache,
PyramidAttentionBroadcast) never mixes the orders of two steps.
"""

from __future__ import annotations

import torch


def _restore(state):
    def hook(module, args):  # proj_out: [B, Np, C] -> [B, N, C] in the original order
        if state.tiled:
            return (state.layout.from_tiles(args[0], dim=1), *args[1:])
        return None

    return hook


def _wan_patch(state):
    def hook(module, args, output):  # [B, C, T, H, W] -> [B, C, Np, 1, 1]; the model flattens next
        if state.tiled:
            return state.layout.to_tiles(output.flatten(2), dim=2)[..., None, None]
        return None

    return hook


def install_wan(state, model) -> list:
    def rope(module, args, output):  # (cos, sin), each [1, N, 1, D]
        if state.tiled:
            return tuple(state.layout.to_tiles(x, dim=1) for x in output)
        return None

    return [model.rope.register_forward_hook(rope),
            model.patch_embedding.register_forward_hook(_wan_patch(state)),
            model.proj_out.register_forward_pre_hook(_restore(state))]


def install_wan_vace(state, model) -> list:
    """Wan VACE: as Wan, and the control video's tokens (`vace_patch_embedding`, the same grid)
    in tile order too, so the VACE blocks' hints add to the tokens they were computed for."""
    return install_wan(state, model) + [
        model.vace_patch_embedding.register_forward_hook(_wan_patch(state))]


def install_hunyuan(state, model) -> list:
    def rope(module, args, output):  # (cos, sin), each [N, D]
        if state.tiled:
            return tuple(state.layout.to_tiles(x, dim=0) for x in output)
        return None

    def patch(module, args, output):  # [B, N, C] -> [B, Np, C]
        if state.tiled:
            return state.layout.to_tiles(output, dim=1)
        return None

    return [model.rope.register_forward_hook(rope),
            model.x_embedder.register_forward_hook(patch),
            model.proj_out.register_forward_pre_hook(_restore(state))]


def install_cogvideox(state, model) -> list:
    def patch(module, args, output):  # [B, text + N, C] -> [B, text + Np, C]
        if state.tiled:
            text = args[0].shape[1]
            return torch.cat([output[:, :text], state.layout.to_tiles(output[:, text:], dim=1)], 1)
        return None

    return [model.patch_embed.register_forward_hook(patch),
            model.proj_out.register_forward_pre_hook(_restore(state))]


def tile_cogvideox_inputs(state, arguments: dict) -> None:
    """CogVideoX receives its RoPE tables from the pipeline: permute them with the tokens."""
    rope = arguments.get("image_rotary_emb")
    if rope is not None:  # (cos, sin), each [N, D]
        arguments["image_rotary_emb"] = tuple(state.layout.to_tiles(x, dim=0) for x in rope)


def wan_can_reorder(model, arguments: dict) -> bool:
    # Wan 2.2 TI2V passes a timestep per token, which the output norm applies token by token
    return torch.as_tensor(arguments["timestep"]).ndim <= 1


def wan_vace_can_reorder(model, arguments: dict) -> bool:
    # a control video shorter than the latents is zero-padded by diffusers after its patch
    # embedding, in token order: reorder in each layer then (found in review)
    control = arguments.get("control_hidden_states")
    latents = arguments["hidden_states"]
    same = control is None or tuple(control.shape[2:]) == tuple(latents.shape[2:])
    return wan_can_reorder(model, arguments) and same


def skyreels_can_reorder(model, arguments: dict) -> bool:
    # diffusion forcing: per-frame timesteps (modulation token by token) and a frame-causal
    # token mask in the original order, which the dense layers' own processor applies
    return wan_can_reorder(model, arguments) and model.config.num_frame_per_block == 1
