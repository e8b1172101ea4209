"""A few steps of each recipe on a tiny Qwen2 lower its loss; the noise follows the spec."""

import pytest
import torch

from mmspec.diffusion.bidirectional import make_bidirectional
from mmspec.zoo.training.objectives import causal_lm_loss, diffusion_noise, masked_diffusion_loss
from mmspec.zoo.training.specs import TextModelSpec
from mmspec.zoo.training.train_text import build_model

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
            steps=20, seq_len=64)


def _fit(spec, tokenizer, batch, loss_fn, steps=20):
    torch.manual_seed(0)
    model = build_model(spec, tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = loss_fn(model, torch.Generator().manual_seed(99)).item()
    for step in range(steps):
        loss = loss_fn(model, torch.Generator().manual_seed(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return before, loss_fn(model, torch.Generator().manual_seed(99)).item()


def test_causal_recipe_lowers_the_loss(tokenizer, heldout_windows):
    spec = TextModelSpec("tiny", "causal", **TINY)
    batch = heldout_windows[:4, :64]
    before, after = _fit(spec, tokenizer, batch, lambda m, g: causal_lm_loss(m, batch))
    assert after < before - 1.0


def test_diffusion_recipe_lowers_the_loss(tokenizer, heldout_windows):
    spec = TextModelSpec("tiny", "diffusion", **TINY)
    batch = heldout_windows[:4, :64]
    mask = tokenizer.mask_token_id
    before, after = _fit(spec, tokenizer, batch,
                         lambda m, g: masked_diffusion_loss(m, batch, mask, g))
    assert after < before - 1.0


def test_diffusion_noise_follows_the_spec():
    tokens = torch.randint(2, 100, (4000, 64))
    noisy, masked, t = diffusion_noise(tokens, 1, torch.Generator().manual_seed(0),
                                       prefix_fraction=0.0)
    assert torch.equal(noisy == 1, masked) and torch.equal(noisy[~masked], tokens[~masked])
    assert not masked[:, 0].any()  # token 0 has no logit to its left (shifted logits)
    assert 0 < t.min() and t.max() <= 1
    # the mask ratio of a row is t (binomial, 63 maskable tokens)
    assert (masked[:, 1:].float().mean(1) - t).abs().mean() < 0.06
    _, masked_p, _ = diffusion_noise(tokens, 1, torch.Generator().manual_seed(0),
                                     prefix_fraction=1.0)
    # with a clean prefix on every row, masking starts at a random cut, not at position 1
    first = torch.where(masked_p.any(1), masked_p.float().argmax(1), torch.tensor(64))
    assert first.float().mean() > 20


def test_bidirectional_switch_reaches_every_attention_layer(tokenizer):
    spec = TextModelSpec("tiny", "causal", **{**TINY, "num_layers": 2})
    model = make_bidirectional(build_model(spec, tokenizer))
    ids = torch.randint(2, 4096, (1, 12))
    edited = ids.clone()
    edited[0, -1] += 1
    with torch.no_grad():
        change = (model(ids).logits[0, 0] - model(edited).logits[0, 0]).abs().max()
    assert change > 0
    # every layer, not just one: position 0 attends to the last key in each of them
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(ids, output_attentions=True).attentions
    assert len(attentions) == 2 and all((a[0, :, 0, -1] > 0).all() for a in attentions)
    assert not any(getattr(m, "is_causal", False) for m in model.modules())


def test_init_from_a_missing_checkpoint_fails_loudly(tokenizer, tmp_path):
    spec = TextModelSpec("tiny", "diffusion", **TINY, init_from="tiny-ar")
    with pytest.raises(FileNotFoundError, match="train tiny-ar first"):
        build_model(spec, tokenizer, tmp_path)


def test_masked_prediction_block_must_leave_a_clean_token():
    from mmspec.zoo.training.objectives import masked_prediction_loss

    with pytest.raises(ValueError, match=r"block must be in \[1, 8\) for windows of 8 tokens, "
                                         r"got 8"):
        masked_prediction_loss(None, torch.zeros(2, 8, dtype=torch.long), 5, block=8)
