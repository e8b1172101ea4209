"""Training DFlash drafters: their anchor-block mask, a loss that training lowers, and a drafter
that saves in their layout and loads back drafting the same tokens."""

import dataclasses

import pytest
import torch

from mmspec import DFlashDrafter, generate
from mmspec.diffusion.dflash_train import (anchored_loss, block_mask, draw_anchors, new_drafter,
                                           sample_loss, supervised_anchors, training_loss)

from .test_dflash import tiny_qwen3


def test_block_mask_is_theirs():
    # create_dflash_block_mask: a block sees the context strictly before its anchor and its own
    # block both ways, nothing of the other blocks
    anchors = torch.tensor([[2, 5]])
    mask = block_mask(anchors, seq_len=8, block_size=3)[0, 0]  # [6, 8 + 6]
    assert mask.shape == (6, 14)
    for row in range(6):
        block, anchor = row // 3, anchors[0, row // 3].item()
        for key in range(14):
            expected = key < anchor if key < 8 else (key - 8) // 3 == block
            assert bool(mask[row, key]) == expected, (row, key)


def test_anchors_are_distinct_and_leave_room_for_their_block():
    a = draw_anchors(4, seq_len=20, block_size=5, anchors=15, generator=torch.Generator())
    assert a.shape == (4, 15)
    assert bool((a >= 1).all() and (a <= 15).all())
    assert all(len(set(r.tolist())) == 15 for r in a)


def test_training_lowers_the_loss_and_the_drafter_round_trips(tmp_path):
    target = tiny_qwen3(0, vocab=32).requires_grad_(False)
    torch.manual_seed(0)
    drafter = new_drafter(target, mask_token_id=31, layers=1, block_size=4,
                          target_layer_ids=[0, 2]).float()
    ids = torch.randint(3, 31, (2, 24), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(drafter.model.parameters(), lr=3e-3)
    losses = []
    for step in range(30):
        loss = training_loss(drafter, ids, 6, torch.Generator().manual_seed(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5])
    drafter.eval().save_pretrained(tmp_path / "d")
    loaded = DFlashDrafter.from_pretrained(tmp_path / "d", target)
    drafts = []
    for d in (drafter, loaded):
        out = generate(target, d, ids[:1, :10], max_new_tokens=12, eos_token_id=[],
                       on_round=lambda draft, r, s: drafts.append(draft.tokens))
        assert torch.equal(out.sequences, target.generate(ids[:1, :10], max_new_tokens=12,
                                                          do_sample=False, eos_token_id=None))
    half = len(drafts) // 2
    assert torch.equal(torch.cat(drafts[:half], 1), torch.cat(drafts[half:], 1))


@pytest.mark.parametrize("causal, window", [((False, False), (None, None)),
                                            ((False, True), (4, 3)), ((True, False), (None, 5))])
def test_training_sees_each_block_as_drafting_does(causal, window):
    # the loss's logits for a block at anchor a are the logits the drafter drafts with when a is
    # the last committed token: training and drafting agree on context, positions and mask, also
    # for causal and sliding-window layers (the config's layer_types / sliding_window / is_causal)
    from mmspec.decoding.draft import DraftState

    target = tiny_qwen3(0, vocab=32).requires_grad_(False)
    torch.manual_seed(0)
    drafter = new_drafter(target, mask_token_id=31, layers=2, block_size=4,
                          target_layer_ids=[0, 2]).float().eval()
    drafter.model.dflash = dataclasses.replace(drafter.model.dflash, causal=causal, window=window)
    ids = torch.randint(3, 31, (1, 20), generator=torch.Generator().manual_seed(1))
    anchors = torch.tensor([[6, 13]])
    seen = []
    real = drafter.model.logits
    drafter.model.logits = lambda hidden, head: seen.append(real(hidden, head)) or seen[-1]
    with torch.no_grad():
        loss, _ = anchored_loss(drafter, ids, anchors, 4.0)
        trained = seen.pop().view(2, 4, -1)  # [blocks, rows, V]
        hidden = target(ids, output_hidden_states=True).hidden_states
        features = torch.cat([hidden[i] for i in drafter.target_hidden_layers], -1)
        for block, a in enumerate(anchors[0].tolist()):
            state = DraftState(input_ids=ids[:, :a + 1], attention_mask=torch.ones(1, a + 1),
                               max_tokens=3, round=0, target_hidden=features[:, :a])
            drafter.propose(state)
            torch.testing.assert_close(seen.pop()[0], trained[block, 1:], atol=1e-5, rtol=1e-5)
    drafter.end()
    assert torch.isfinite(loss)


def test_supervised_anchors_open_blocks_of_supervised_labels_only():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):  # answer from token 10 on: the first block may start at the prompt's end
        a = supervised_anchors(10, 30, 4, 6, g)
        assert len(a) == 6 and len(set(a.tolist())) == 6 and torch.equal(a, a.sort().values)
        assert int(a.min()) >= 9 and int(a.max()) <= 26
    seen = set()
    for _ in range(50):
        seen |= set(supervised_anchors(10, 30, 4, 6, g).tolist())
    assert seen == set(range(9, 27))  # every allowed anchor is drawn
    assert supervised_anchors(0, 12, 4, 50, g).tolist() == list(range(1, 9))  # all that fit
    assert supervised_anchors(10, 13, 4, 6, g).tolist() == [9]  # a 3-token answer: one block
    assert len(supervised_anchors(10, 12, 4, 6, g)) == 0  # a 2-token answer: none


def test_a_sample_without_a_block_trains_nothing():
    target = tiny_qwen3(0, vocab=32).requires_grad_(False)
    drafter = new_drafter(target, mask_token_id=31, layers=1, block_size=4).float()
    ids = torch.randint(3, 31, (1, 12), generator=torch.Generator().manual_seed(1))
    loss, parts = sample_loss(drafter, ids, 10, 8, torch.Generator(), 4.0)
    assert parts == {"blocks": 0} and float(loss.detach()) == 0.0 and loss.requires_grad
    loss, parts = sample_loss(drafter, ids, 6, 8, torch.Generator(), 4.0)
    assert parts["blocks"] == 4 and float(loss) > 0  # anchors 5..8


def test_soft_labels_are_the_targets_next_token_distribution():
    # a drafter whose rows put out exactly the target's logits for the token each row labels
    # (the target's logits one position earlier) scores the target's entropy, its least; the
    # same drafter one position off scores more
    target = tiny_qwen3(0, vocab=32).requires_grad_(False)
    drafter = new_drafter(target, mask_token_id=31, layers=1, block_size=4).float()
    ids = torch.randint(3, 31, (2, 20), generator=torch.Generator().manual_seed(2))
    anchors = torch.tensor([[3, 9], [5, 14]])
    with torch.no_grad():
        logits = target(ids).logits  # [B, S, V]: position p predicts token p + 1
    rows = (anchors[..., None] + torch.arange(4)).flatten(1)  # [B, A * 4]
    k = torch.arange(4).repeat(2)
    weight = (k > 0).float() * torch.exp(-(k - 1).clamp_min(0) / 4.0)
    probs = logits.gather(1, (rows - 1)[..., None].expand(-1, -1, 32)).softmax(-1)
    entropy = -(probs * probs.log()).sum(-1)  # [B, A * 4]
    expected = (entropy * weight).sum() / (weight.sum() * 2)
    for shift, exact in ((1, True), (0, False)):
        at = logits.gather(1, (rows - shift).clamp_max(19)[..., None].expand(-1, -1, 32))
        drafter.model.logits = lambda hidden, head, at=at: at + 0 * hidden.sum()
        soft, _ = anchored_loss(drafter, ids, anchors, 4.0, soft_labels=True)
        assert torch.isclose(soft, expected, atol=1e-5) == exact
        assert float(soft) >= float(expected) - 1e-5
        hard, _ = anchored_loss(drafter, ids, anchors, 4.0)
        assert not torch.isclose(hard, soft)  # the token's cross entropy is another loss
