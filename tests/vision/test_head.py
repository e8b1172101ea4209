"""The draft head's layers: torch's RMSNorm under the old `weight` key, an attention class of its
own name (not video_dit's DraftAttention)."""

import torch
from torch import nn

from mmspec.vision import head
from mmspec.vision.config import ViSpecConfig


def _hand_written_rms_norm(x, weight, eps):  # the head's own norm before torch.nn.RMSNorm
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight


def test_the_head_norms_are_torch_rmsnorm_with_the_same_outputs_and_keys():
    torch.manual_seed(0)
    cfg = ViSpecConfig(hidden_size=32, num_heads=2, head_dim=16, intermediate_size=48,
                       vocab_size=64, num_layers=2)
    draft = head.DraftHead(cfg)
    norms = {name: m for name, m in draft.named_modules() if "norm" in name.rsplit(".", 1)[-1]
             and not isinstance(m, nn.Identity)}
    assert sorted(norms) == ["layers.0.post_norm", "layers.1.input_norm", "layers.1.post_norm"]
    assert all(type(m) is nn.RMSNorm for m in norms.values())
    # checkpoints saved before keep loading: one `weight` per norm, nothing else
    assert {k for k in draft.state_dict() if "norm" in k} == {f"{n}.weight" for n in norms}
    x = torch.randn(3, 5, 32)
    for m in norms.values():
        with torch.no_grad():
            m.weight.uniform_(0.5, 1.5)
        assert torch.equal(m(x), _hand_written_rms_norm(x, m.weight, cfg.rms_norm_eps))


def test_the_head_attention_is_not_named_after_video_dits_draft_attention():
    assert not hasattr(head, "DraftAttention")
    cfg = ViSpecConfig(hidden_size=32, num_heads=2, head_dim=16, intermediate_size=48,
                       vocab_size=64)
    assert type(head.DraftLayer(cfg, first=True).attn) is head.HeadAttention
