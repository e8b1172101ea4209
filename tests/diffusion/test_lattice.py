import pytest
import torch

from mmspec.diffusion.lattice import (
    PrefixCache,
    bidirectional_attention_mask,
    build_lattice,
    build_lattice_cached,
    restrict_vocab,
)

from .models import MASK, VOCAB, tiny_qwen2


def full_forward(model, seq):
    """Logits `[L, V]` of one unpadded sequence with an all-visible mask."""
    valid = torch.ones(1, seq.numel(), dtype=torch.long)
    mask = bidirectional_attention_mask(valid, torch.float32)
    return model(input_ids=seq[None], attention_mask=mask).logits[0]


def left_padded(rows):
    width = max(r.numel() for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, width - r.numel():] = r
        attn[b, width - r.numel():] = 1
    return ids, attn


@pytest.mark.parametrize("shift", [True, False])
def test_lattice_shapes_and_shift(dlm, shift):
    torch.manual_seed(0)
    rows = [torch.randint(2, 60, (7,)), torch.randint(2, 60, (4,))]
    ks = [3, 5]
    ids, attn = left_padded(rows)
    lattice = build_lattice(dlm, ids, attn, ks, MASK, VOCAB, shift)
    assert lattice.logprobs.shape == (2, 5, VOCAB)
    assert lattice.lengths.tolist() == ks
    assert torch.isneginf(lattice.logprobs[0, 3:]).all()  # past row 0's block
    for b, (row, k) in enumerate(zip(rows, ks)):
        seq = torch.cat([row, torch.full((k,), MASK)])
        logits = full_forward(dlm, seq)  # [L + k, V]
        first = row.numel() - int(shift)  # Dream: the first mask reads the last prefix token
        expected = torch.log_softmax(logits[first:first + k].masked_fill(
            torch.arange(VOCAB) == MASK, float("-inf")), -1)
        torch.testing.assert_close(lattice.logprobs[b, :k], expected, atol=1e-4, rtol=1e-4)


def test_shift_moves_the_block_by_one(dlm):
    ids = torch.randint(2, 60, (1, 6))
    attn = torch.ones_like(ids)
    shifted = build_lattice(dlm, ids, attn, [4], MASK, VOCAB, shift=True).logprobs[0]
    unshifted = build_lattice(dlm, ids, attn, [4], MASK, VOCAB, shift=False).logprobs[0]
    torch.testing.assert_close(shifted[1:], unshifted[:-1])
    assert not torch.allclose(shifted[0], unshifted[0])


def test_attention_is_bidirectional(dlm):
    """Changing a later token changes an earlier position's logits, and the control run without the
    mask (stock causal attention) shows that it would not otherwise."""
    seq = torch.randint(2, 60, (10,))
    changed = seq.clone()
    changed[-1] = (seq[-1] + 1) % 60 + 2
    before, after = full_forward(dlm, seq), full_forward(dlm, changed)
    assert not torch.allclose(before[0], after[0], atol=1e-4)
    causal_before = dlm(input_ids=seq[None]).logits[0, :-1]
    causal_after = dlm(input_ids=changed[None]).logits[0, :-1]
    torch.testing.assert_close(causal_before, causal_after)


def test_block_length_changes_the_first_block_position(dlm):
    """Through `build_lattice` itself: more masks after position 0 change its distribution."""
    ids = torch.randint(2, 60, (1, 6))
    attn = torch.ones_like(ids)
    short = build_lattice(dlm, ids, attn, [2], MASK, VOCAB, shift=False).logprobs[0, 0]
    long = build_lattice(dlm, ids, attn, [6], MASK, VOCAB, shift=False).logprobs[0, 0]
    assert not torch.allclose(short, long, atol=1e-4)


def test_drafter_wider_than_target_is_cut_and_renormalised():
    wide = tiny_qwen2(2, vocab=72)
    ids = torch.randint(2, 60, (1, 5))
    lattice = build_lattice(wide, ids, torch.ones_like(ids), [3], 70, VOCAB, True,
                            torch.tensor([70, 7]))
    assert lattice.logprobs.shape == (1, 3, VOCAB)
    assert torch.isneginf(lattice.logprobs[0, :, 7]).all()  # a suppressed DLM-only id
    torch.testing.assert_close(lattice.logprobs.exp().sum(-1), torch.ones(1, 3))


def test_drafter_narrower_than_target_never_proposes_missing_ids():
    logits = torch.randn(2, 60)
    logprobs = restrict_vocab(logits, 64, torch.tensor([3]))
    assert logprobs.shape == (2, 64)
    assert torch.isneginf(logprobs[:, 60:]).all() and torch.isneginf(logprobs[:, 3]).all()
    torch.testing.assert_close(logprobs.exp().sum(-1), torch.ones(2))


def test_block_length_must_be_positive(dlm):
    ids = torch.randint(2, 60, (1, 5))
    with pytest.raises(ValueError, match="k must be > 0"):
        build_lattice(dlm, ids, torch.ones_like(ids), [0], MASK, VOCAB, True)


def _with_hole(rows):
    """Left-padded rows, then a hole (masked column) in row 0 before its last two tokens."""
    ids, attn = left_padded(rows)
    ids = torch.cat([ids[:, :-2], torch.zeros(len(rows), 1, dtype=torch.long), ids[:, -2:]], 1)
    attn = torch.cat([attn[:, :-2], torch.zeros(len(rows), 1, dtype=torch.long), attn[:, -2:]], 1)
    attn[1, -3] = 1  # row 1 has no hole: the column holds a token
    return ids, attn


class Widths:
    """Records the width of every forward of a model."""

    def __init__(self, model):
        self.seen = []
        model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        self.seen.append(kwargs["input_ids"].shape[1])


@pytest.mark.parametrize("shift", [True, False])
def test_a_fresh_prefix_cache_gives_the_full_lattice(dlm, shift):
    """Left padding, a hole and ragged blocks: the cached layout keeps them in place and must give
    what `build_lattice` gives on compacted rows."""
    torch.manual_seed(1)
    ids, attn = _with_hole([torch.randint(2, 60, (7,)), torch.randint(2, 60, (4,))])
    ks = [3, 5]
    full = build_lattice(dlm, ids, attn, ks, MASK, VOCAB, shift)
    cached = build_lattice_cached(dlm, PrefixCache(), ids, attn, ks, MASK, VOCAB, shift)
    torch.testing.assert_close(cached.logprobs, full.logprobs, atol=1e-4, rtol=1e-4)
    assert cached.lengths.tolist() == ks


def test_the_prefix_cache_runs_only_the_new_columns_and_the_block():
    dlm = tiny_qwen2(1)
    widths = Widths(dlm)
    cache = PrefixCache()
    ids = torch.randint(2, 60, (2, 9))
    attn = torch.ones_like(ids)
    build_lattice_cached(dlm, cache, ids, attn, [4, 6], MASK, VOCAB, True)
    longer = torch.cat([ids, torch.randint(2, 60, (2, 3))], 1)
    reused = build_lattice_cached(dlm, cache, longer, torch.ones_like(longer), [5, 5], MASK,
                                  VOCAB, True)
    assert widths.seen == [9 + 6, 3 + 5]
    assert cache.kv.get_seq_length() == 12 and torch.equal(cache.columns, longer)
    assert torch.isfinite(reused.logprobs.max(-1).values).all()
    # approximate, not arbitrary: the argmax agrees with a fresh forward almost everywhere
    fresh = build_lattice(dlm, longer, torch.ones_like(longer), [5, 5], MASK, VOCAB, True)
    agree = (reused.argmax() == fresh.argmax()).float().mean()
    assert agree >= 0.5, agree


def test_a_changed_prefix_is_not_served_from_the_cache(dlm):
    cache = PrefixCache()
    ids = torch.randint(2, 60, (1, 9))
    attn = torch.ones_like(ids)
    build_lattice_cached(dlm, cache, ids, attn, [4], MASK, VOCAB, True)
    edited = torch.cat([ids, torch.randint(2, 60, (1, 2))], 1)
    edited[0, 3] = (edited[0, 3] + 1) % 60 + 2  # an earlier token changed: the cache is stale
    got = build_lattice_cached(dlm, cache, edited, torch.ones_like(edited), [4], MASK, VOCAB,
                               True)
    fresh = build_lattice(dlm, edited, torch.ones_like(edited), [4], MASK, VOCAB, True)
    torch.testing.assert_close(got.logprobs, fresh.logprobs, atol=1e-4, rtol=1e-4)


def test_a_finished_row_does_not_stop_the_others_reading_the_cache():
    """The engine leaves a finished row holes only; with shift its last column is a hole. The
    cache used to be dropped for the whole batch from then on (a full forward every round)."""
    dlm = tiny_qwen2(1)
    widths = Widths(dlm)
    torch.manual_seed(2)
    ids = torch.randint(2, 60, (2, 8))
    cache = PrefixCache()
    build_lattice_cached(dlm, cache, ids, torch.ones_like(ids), [4, 4], MASK, VOCAB, True)
    longer = torch.cat([ids, torch.randint(2, 60, (2, 3))], 1)
    attn = torch.ones_like(longer)
    attn[1, 8:] = 0  # row 1 finished: holes only
    got = build_lattice_cached(dlm, cache, longer, attn, [4, 4], MASK, VOCAB, True)
    assert widths.seen == [8 + 4, 3 + 4]
    alone = PrefixCache()  # row 0 on its own, through the same two rounds
    build_lattice_cached(dlm, alone, ids[:1], torch.ones_like(ids[:1]), [4], MASK, VOCAB, True)
    expected = build_lattice_cached(dlm, alone, longer[:1], attn[:1], [4], MASK, VOCAB, True)
    torch.testing.assert_close(got.logprobs[:1], expected.logprobs, atol=1e-4, rtol=1e-4)
    assert not got.logprobs.isnan().any()


def test_a_model_that_ignores_logits_to_keep_gives_the_same_lattice(dlm):
    # older and remote-code DLMs (written against num_logits_to_keep) return every position:
    # the lattice is their last positions, not an error
    class EveryPosition(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model, self.config = model, model.config

        def forward(self, logits_to_keep=None, **kwargs):
            return self.model(**kwargs)

    ids = torch.randint(2, 60, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ref = build_lattice(dlm, ids, mask, [6, 6], MASK, VOCAB, True)
    got = build_lattice(EveryPosition(dlm), ids, mask, [6, 6], MASK, VOCAB, True)
    torch.testing.assert_close(got.logprobs, ref.logprobs)
