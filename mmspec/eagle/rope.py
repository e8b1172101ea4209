"""Rotary position embedding for the drafter, 1-D or multi-axis (Qwen2.5-VL's M-RoPE).

The drafter uses the target's own positions (`vispec.md` §6: "M-RoPE-consistent positions in the
drafter as well"), a deliberate difference from ViSpec's code, which runs 1-D RoPE on sequence
indices even for Qwen2.5-VL. With one axis this is plain RoPE. With three axes, frequency f takes
its angle from the axis whose `mrope_section` contains f, as in transformers'
`apply_multimodal_rotary_pos_emb`.
"""

from __future__ import annotations

import torch


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float,
                 sections: tuple | None, dtype: torch.dtype):
    """positions long `[A, B, N]` (A = 1, or 3 with `sections`) -> cos, sin `[B, 1, N, head_dim]`."""
    device = positions.device
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = positions[..., None].float() * inv_freq  # [A, B, N, D/2]
    if sections is None:
        angles = angles[0]
    else:
        axis = torch.repeat_interleave(torch.arange(len(sections), device=device),
                                       torch.tensor(sections, device=device))  # [D/2]
        angles = angles.gather(0, axis.view(1, 1, 1, -1).expand(1, *angles.shape[1:]))[0]
    emb = torch.cat([angles, angles], dim=-1)[:, None]  # [B, 1, N, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x `[B, H, N, D]` rotated by cos/sin `[B, 1, N, D]`."""
    return x * cos + _rotate_half(x) * sin
