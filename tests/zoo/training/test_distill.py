"""Distillation data: the target's greedy tokens, resumable; losses on the continuation only."""

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen2Config, Qwen2ForCausalLM

from mmspec.zoo.training import distill
from mmspec.zoo.training.objectives import diffusion_noise


@pytest.fixture(scope="module")
def tiny_target():
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)
    return Qwen2ForCausalLM(config).eval()


def _greedy_without_cache(model, prefixes, n):
    ids = prefixes
    for _ in range(n):
        ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


def test_continuations_are_the_targets_greedy_tokens(tiny_target):
    prefixes = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = _greedy_without_cache(tiny_target, prefixes, 5)
    assert torch.equal(distill.greedy_continuations(tiny_target, prefixes, 5), expected)


def test_a_killed_run_resumes_to_the_same_data(tiny_target, tmp_path, monkeypatch,
                                                interrupt_on_call):
    stream = torch.randint(0, 50, (500,), generator=torch.Generator().manual_seed(2))
    straight = distill.target_continuations(tiny_target, stream, 10, 6, 4, tmp_path / "a",
                                            batch=4)
    assert straight.shape == (10, 10)
    real = interrupt_on_call(distill, "greedy_continuations", 3)  # dies on the third batch
    with pytest.raises(KeyboardInterrupt):
        distill.target_continuations(tiny_target, stream, 10, 6, 4, tmp_path / "b", batch=4,
                                     save_every_s=0)
    saved = torch.load(next((tmp_path / "b").glob("continuations-*.pt")))
    assert len(saved) == 8  # two batches were saved before the kill
    monkeypatch.setattr(distill, "greedy_continuations", real)
    resumed = distill.target_continuations(tiny_target, stream, 10, 6, 4, tmp_path / "b", batch=4)
    assert torch.equal(straight, resumed)
    with pytest.raises(ValueError, match="new_tokens must be > 0, got 0"):
        distill.target_continuations(tiny_target, stream, 10, 6, 0, tmp_path / "c")


def test_the_losses_score_the_continuation_only(tiny_target):
    tokens = torch.randint(0, 50, (4, 12), generator=torch.Generator().manual_seed(3))
    logits = tiny_target(input_ids=tokens).logits
    expected = F.cross_entropy(logits[:, 8:-1].flatten(0, 1), tokens[:, 9:].flatten())
    got = distill.continuation_loss("causal", tiny_target, tokens, 9, 49, None)
    torch.testing.assert_close(got, expected)
    noisy, masked, _ = diffusion_noise(tokens, 49, torch.Generator().manual_seed(4), cut=9)
    assert not masked[:, :9].any() and masked[:, 9:].any()
    assert torch.equal(noisy[:, :9], tokens[:, :9])
    with pytest.raises(ValueError, match=r"cut must be in \[1, 12\)"):
        diffusion_noise(tokens, 49, torch.Generator(), cut=12)


def test_block_rows_mask_a_whole_suffix_like_a_draft_block():
    tokens = torch.randint(0, 50, (64, 12), generator=torch.Generator().manual_seed(5))
    noisy, masked, t = diffusion_noise(tokens, 49, torch.Generator().manual_seed(6), cut=9,
                                       block_share=1.0)
    starts = masked.int().argmax(-1)
    assert (starts >= 9).all() and torch.equal(t, torch.ones(64))
    assert torch.equal(masked, torch.arange(12)[None, :] >= starts[:, None])  # suffix, no holes
    assert len(starts.unique()) == 3  # starts 9, 10 and 11 all drawn
    _, _, t_half = diffusion_noise(tokens, 49, torch.Generator().manual_seed(6), cut=9,
                                   block_share=0.5)
    assert 0 < int((t_half == 1).sum()) < 64
    with pytest.raises(ValueError, match="block_share=0.5 needs a fixed cut"):
        diffusion_noise(tokens, 49, torch.Generator(), block_share=0.5)
    # a batch of 1 (or prefix_fraction=0) draws one cut for every row: it passed as "fixed"
    for rows, fraction in ((tokens[:1], 0.5), (tokens, 0.0)):
        with pytest.raises(ValueError, match="needs a fixed cut .*got cut=None"):
            diffusion_noise(rows, 49, torch.Generator(), prefix_fraction=fraction,
                            block_share=0.5)
