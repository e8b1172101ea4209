"""Training losses (`vispec.md` §1.6), on the positions where the drafter must predict.

- feature regression, EAGLE stage 1: SmoothL1(predicted feature, target feature);
- token distribution, ViSpec stage 2: total variation sum |p_draft - p_target| over the vocabulary,
  plus a ListMLE (Plackett-Luce) term on the target's top-10 order; optional soft-label CE (EAGLE);
- the anti-shortcut pass reuses these on a second forward fed with the drafter's own predictions
  (`train.py`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def feature_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """pred, target `[N, d]` -> scalar."""
    return F.smooth_l1_loss(pred.float(), target.float())


def total_variation(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """`[N, V]` each -> mean over N of sum_v |p_draft - p_target|."""
    p_draft = draft_logits.float().softmax(-1)
    p_target = target_logits.float().softmax(-1)
    return (p_draft - p_target).abs().sum(-1).mean()


def soft_cross_entropy(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    p_target = target_logits.float().softmax(-1)
    return -(p_target * draft_logits.float().log_softmax(-1)).sum(-1).mean()


def list_mle(draft_logits: torch.Tensor, target_logits: torch.Tensor, top: int) -> torch.Tensor:
    """Negative Plackett-Luce log-likelihood of the target's top-`top` order under the draft."""
    order = target_logits.topk(min(top, target_logits.shape[-1]), -1).indices  # [N, k]
    s = draft_logits.float().gather(-1, order)  # [N, k] in the target's order
    # log P = sum_r s_r - logsumexp(s_r, ..., s_k): a reversed cumulative logsumexp
    tail = torch.logcumsumexp(s.flip(-1), -1).flip(-1)
    return (tail - s).sum(-1).mean()
