"""Hybrid linear-attention targets (issue 29, item 4): chains exact, the recurrent state rolled
back by a replay of the committed tokens; batches commit their rows alike, trees are verified
along their main path."""

import pytest
import torch

import arch_sweep

import mmspec
from mmspec.decoding import ModelDrafter


@pytest.fixture(scope="module")
def qwen3_next():
    return arch_sweep.build("qwen3_next")  # linear attention beside full attention


def _reference(model, b=1):
    ids, mask = arch_sweep.PROMPTS[:b], arch_sweep.MASK[:b]
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=arch_sweep.NEW_TOKENS,
                             do_sample=False, pad_token_id=0)
    return ids, mask, ref


def test_a_chain_with_rejections_is_exact_and_replays_the_committed_tokens(qwen3_next):
    ids, mask, ref = _reference(qwen3_next)
    out = mmspec.generate(qwen3_next, arch_sweep.OracleChain(ref, mask), ids,
                          attention_mask=mask, max_new_tokens=arch_sweep.NEW_TOKENS,
                          do_sample=False, pad_token_id=0)
    assert torch.equal(out.sequences, ref)
    assert out.stats.replays >= 1 and out.stats.accepted >= 4  # rejections and acceptances


def test_a_batch_commits_rows_alike_and_replays_them(qwen3_next):
    """Rows that accept different numbers of drafts would leave holes, which a recurrence cannot
    skip: every row commits as many tokens as the row that accepted fewest, and the replay feeds
    all rows the same count."""
    ids, mask, ref = _reference(qwen3_next, b=2)
    out = mmspec.generate(qwen3_next, arch_sweep.OracleChain(ref, mask, stagger=True), ids,
                          attention_mask=mask, max_new_tokens=arch_sweep.NEW_TOKENS,
                          do_sample=False, pad_token_id=0)
    assert torch.equal(out.sequences, ref)
    assert out.stats.replays >= 1


def test_a_tree_drafter_is_verified_along_its_main_path(qwen3_next):
    """A tree's siblings would mix in the recurrent state: the engine verifies each draft's main
    path, and a `ModelDrafter` on a recurrent model drafts chains; both say so."""
    ids, mask, ref = _reference(qwen3_next, b=2)
    with pytest.warns(UserWarning) as seen:
        out = mmspec.generate(qwen3_next, ModelDrafter(qwen3_next, num_tokens=4, top_k=2), ids,
                              attention_mask=mask, max_new_tokens=arch_sweep.NEW_TOKENS,
                              do_sample=False, pad_token_id=0)
    assert torch.equal(out.sequences, ref)
    said = " ".join(str(w.message) for w in seen)
    assert "main path" in said and "drafting chains" in said


@pytest.mark.parametrize("model_type", ["qwen3_next", "jamba", "falcon_h1"])
def test_restore_and_replay_give_the_state_of_the_committed_tokens(model_type):
    """Prefill, feed three drafts, keep one: the next logits equal a plain forward of the
    committed sequence (mamba, gated delta rule and hybrid-layer caches)."""
    from transformers import DynamicCache

    from mmspec.decoding import recurrent

    model = arch_sweep.build(model_type)
    ids = torch.arange(20, 35)[None]  # prompt 0..9, drafts 10..12, the next token 13
    with torch.no_grad():
        want = model(torch.cat([ids[:, :11], ids[:, 13:14]], 1)).logits[0, -1]
        cache = DynamicCache(config=model.config)
        model(ids[:, :10], cache=cache, use_cache=True)
        layers = recurrent.recurrent_layers(cache)
        saved = recurrent.snapshot(layers)
        model(ids[:, 10:13], cache=cache, use_cache=True)  # the verification forward
        recurrent.crop_attention(cache, 10)
        recurrent.restore(layers, saved)
        recurrent.replay(model, ids[:, 10:11], torch.tensor([[10]]),
                         torch.ones(1, 11, dtype=torch.long), {"cache": cache})
        got = model(ids[:, 13:14], cache=cache, use_cache=True,
                    position_ids=torch.tensor([[11]])).logits[0, -1]
    assert layers
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
