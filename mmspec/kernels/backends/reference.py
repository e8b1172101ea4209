"""Reference backend: dense masked attention, for tests and as the readable definition.

The block mask is expanded to tokens and the math is done in fp32. Fully masked rows return 0 with
lse = -inf (the convention of flash-attention's and Block-Sparse-Attention's references).
"""

import torch

from ..mask import BlockSparseMask
from .registry import register_backend


@register_backend("reference")
def reference_attention(q, k, v, mask: BlockSparseMask, scale: float, softcap: float = 0.0):
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)  # [B, Hq, Nk, D]
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.matmul(q.float(), kf.transpose(-1, -2)) * scale  # [B, Hq, Nq, Nk]
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~mask.to_dense(), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, Hq, Nq], -inf on empty rows
    probs = torch.exp(scores - lse.nan_to_num(neginf=0.0).unsqueeze(-1))
    out = torch.matmul(probs, vf)
    return out.to(q.dtype), lse
