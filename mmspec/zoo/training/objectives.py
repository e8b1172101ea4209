"""The two training objectives of the text zoo.

`causal_lm_loss`: next-token cross-entropy.

`masked_diffusion_loss`: the absorbing-state masked diffusion objective of MDLM/LLaDA/Dream
(Sahoo et al. 2024, eq. 10; Nie et al. 2025, eq. 3): draw t ~ U(0, 1] per sequence, replace each
token by `<|mask|>` with probability t, and take the cross-entropy on masked tokens weighted by 1/t,
averaged over all tokens. Two Dream conventions:
- shifted logits: the output at position i predicts token i+1, so token i is scored by logits at
  i-1 and the first token of a window is never masked;
- a clean prefix (Dream's SFT rule that the prompt is never noised): for a `prefix_fraction` of the
  rows a random cut c is drawn and only tokens at positions >= c may be masked. This matches how the
  drafter is used: a clean prefix followed by a block of masks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_lm_loss(model, tokens: torch.Tensor) -> torch.Tensor:
    """tokens: long `[B, L]`. Mean next-token cross-entropy (nats)."""
    logits = model(input_ids=tokens).logits  # [B, L, V]
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def diffusion_noise(tokens: torch.Tensor, mask_token_id: int, generator: torch.Generator,
                    prefix_fraction: float = 0.5, t_min: float = 1e-3, cut: int | None = None,
                    block_share: float = 0.0):
    """Returns (noisy `[B, L]`, masked bool `[B, L]`, t `[B]`). Position 0 is never masked.
    `cut` fixes every row's first maskable position (a clean prefix of `cut` tokens in all rows).
    `block_share` of the rows (with `cut` only) instead mask *every* token from a random start in
    `[cut, L)` on, with t = 1: the drafting case, a clean prefix then a block of masks only."""
    b, n = tokens.shape
    if block_share > 0 and cut is None:  # every row drawing one cut is not a fixed prefix
        raise ValueError(f"block_share={block_share} needs a fixed cut (the clean prefix the "
                         f"blocks start after), got cut=None")
    t = t_min + (1 - t_min) * torch.rand(b, generator=generator)  # t ~ U(t_min, 1]
    masked = torch.rand(b, n, generator=generator) < t[:, None]
    if cut is not None:
        if not 1 <= cut < n:
            raise ValueError(f"cut must be in [1, {n}) for windows of {n} tokens, got {cut}")
        cut = torch.full((b,), cut)
    else:
        cut = torch.randint(1, n, (b,), generator=generator)  # first maskable position
        use_prefix = torch.rand(b, generator=generator) < prefix_fraction
        cut = torch.where(use_prefix, cut, torch.ones_like(cut))
    masked &= torch.arange(n)[None, :] >= cut[:, None]
    if block_share > 0:
        start = torch.randint(int(cut[0]), n, (b,), generator=generator)
        block = torch.rand(b, generator=generator) < block_share
        masked = torch.where(block[:, None], torch.arange(n)[None, :] >= start[:, None], masked)
        t = torch.where(block, torch.ones_like(t), t)
    noisy = torch.where(masked, torch.full_like(tokens, mask_token_id), tokens)
    return noisy, masked, t


def masked_diffusion_loss(model, tokens: torch.Tensor, mask_token_id: int,
                          generator: torch.Generator, prefix_fraction: float = 0.5,
                          cut: int | None = None, block_share: float = 0.0) -> torch.Tensor:
    """tokens: long `[B, L]`; `model` must be bidirectional. 1/t-weighted masked CE per token
    (per maskable token: with a fixed `cut`, averaged over the `L - cut` tokens after it)."""
    noisy, masked, t = diffusion_noise(tokens, mask_token_id, generator, prefix_fraction, cut=cut,
                                       block_share=block_share)
    logits = model(input_ids=noisy).logits[:, :-1]  # [B, L-1, V]; row i-1 predicts token i
    ce = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten(), reduction="none")
    weight = masked[:, 1:].float() / t[:, None]  # [B, L-1]
    maskable = weight.numel() if cut is None else tokens.shape[0] * (tokens.shape[1] - cut)
    return (ce.view_as(weight) * weight).sum() / maskable


@torch.no_grad()
def masked_prediction_loss(model, tokens: torch.Tensor, mask_token_id: int,
                           block: int) -> torch.Tensor:
    """Eval for the diffusion drafter in its drafting use: the last `block` tokens of every window
    are masked and the mean CE of predicting them (shifted logits) is returned (nats)."""
    if not 1 <= block < tokens.shape[1]:  # the shifted logits need one clean token before it
        raise ValueError(f"block must be in [1, {tokens.shape[1]}) for windows of "
                         f"{tokens.shape[1]} tokens, got {block}")
    noisy = tokens.clone()
    noisy[:, -block:] = mask_token_id
    logits = model(input_ids=noisy).logits[:, -block - 1:-1]  # [B, block, V]
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, -block:].flatten())
