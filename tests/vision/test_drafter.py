"""ViSpecDrafter through `mmspec.generate`: exactly the target's greedy output on tiny LLaVA,
LLaVA-NeXT and Qwen2.5-VL, untrained / text-only / briefly trained, one or several images."""

import pytest
import torch
from tiny_vlms import (
    llava_prompt,
    no_eos,
    quick_train,
    qwen_prompt,
    reference,
    tiny_llava,
    tiny_llava_next,
    tiny_pixtral_llava,
)

from mmspec import generate
from mmspec.vision import ViSpecDrafter
from mmspec.vision import drafter as drafter_module

NEW = 24
# (images, seed) and (grids, seed): the trained drafters see these prompts, so their drafts are
# accepted often and the tests exercise long accepted paths
LLAVA_PROMPTS = [(1, 7), (2, 7), (1, 8)]
QWEN_PROMPTS = [(((1, 4, 8),), 7), (((1, 4, 4), (1, 8, 4)), 7), (((1, 4, 8),), 8)]


@pytest.fixture(scope="module")
def trained_llava(llava):
    torch.manual_seed(0)
    drafter = ViSpecDrafter.from_target(llava)
    quick_train(drafter, llava, [llava_prompt(images=n, seed=s) for n, s in LLAVA_PROMPTS])
    return drafter


@pytest.fixture(scope="module")
def trained_qwen(qwen):
    torch.manual_seed(0)
    drafter = ViSpecDrafter.from_target(qwen)
    quick_train(drafter, qwen, [qwen_prompt(grids=g, seed=s) for g, s in QWEN_PROMPTS])
    return drafter


def _drafter(kind, target, trained):
    torch.manual_seed(1)
    return {"untrained": lambda: ViSpecDrafter.from_target(target),
            "text_only": lambda: ViSpecDrafter.text_only(target),
            "trained": lambda: trained}[kind]()


@pytest.mark.parametrize("kind", ["untrained", "text_only", "trained"])
@pytest.mark.parametrize("images", [1, 2])
def test_llava_greedy_is_the_targets_output(llava, trained_llava, kind, images):
    ids, extras = llava_prompt(images=images, seed=LLAVA_PROMPTS[images - 1][1])
    ref = reference(llava, ids, extras, NEW)
    drafter = _drafter(kind, llava, trained_llava)
    out = generate(llava, drafter, ids, max_new_tokens=NEW, **extras)
    assert torch.equal(out.sequences, ref)
    if kind == "trained":  # the drafts were really used, not all rejected
        assert out.stats.accepted >= NEW // 4, out.stats


@pytest.mark.parametrize("kind", ["untrained", "trained"])
@pytest.mark.parametrize("grids", [QWEN_PROMPTS[0][0], QWEN_PROMPTS[1][0]])
def test_qwen2_5_vl_greedy_is_the_targets_output(qwen, trained_qwen, kind, grids):
    ids, extras = qwen_prompt(grids=grids, seed=7)
    ref = reference(qwen, ids, extras, NEW)
    drafter = _drafter(kind, qwen, trained_qwen)
    out = generate(qwen, drafter, ids, max_new_tokens=NEW, **extras)
    assert torch.equal(out.sequences, ref)
    if kind == "trained":
        assert out.stats.accepted >= NEW // 4, out.stats


@pytest.mark.parametrize("model", ["llava", "qwen"])
def test_a_repetition_penalty_keeps_the_targets_output(llava, trained_llava, qwen, trained_qwen,
                                                       model):
    # Qwen2.5-VL-Instruct ships repetition_penalty 1.05; image placeholder ids in the prompt are
    # penalised too, as in target.generate
    target, drafter = (llava, trained_llava) if model == "llava" else (qwen, trained_qwen)
    ids, extras = (llava_prompt(images=2, seed=7) if model == "llava"
                   else qwen_prompt(grids=QWEN_PROMPTS[1][0], seed=7))
    ref = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=NEW, repetition_penalty=1.3, **extras)
    assert not torch.equal(ref, reference(target, ids, extras, NEW))
    out = generate(target, drafter, ids, max_new_tokens=NEW, repetition_penalty=1.3, **extras)
    assert torch.equal(out.sequences, ref)


def test_llava_next_greedy_is_the_targets_output():
    target = no_eos(tiny_llava_next())
    g = torch.Generator().manual_seed(0)
    extras = {"pixel_values": torch.randn(2, 3, 3, 32, 32, generator=g),
              "image_sizes": torch.tensor([[32, 64], [32, 32]])}
    drafter = ViSpecDrafter.from_target(target)
    counts = [f.shape[0] for f in drafter.adapter.image_features(extras)]
    ids = torch.tensor([[1, 5] + [127] * counts[0] + [6, 7] + [127] * counts[1] + [8, 9]])
    ref = reference(target, ids, extras, NEW)
    out = generate(target, drafter, ids, max_new_tokens=NEW, **extras)
    assert torch.equal(out.sequences, ref)


def test_pixtral_llava_greedy_is_the_targets_output():
    # image_sizes was dropped: the Pixtral tower read both padded images as one of 32 tokens
    target = no_eos(tiny_pixtral_llava())
    g = torch.Generator().manual_seed(0)
    extras = {"pixel_values": torch.randn(2, 3, 32, 32, generator=g),  # padded to 32 x 32
              "image_sizes": torch.tensor([[16, 32], [32, 32]])}
    drafter = ViSpecDrafter.from_target(target)
    assert [f.shape[0] for f in drafter.adapter.image_features(extras)] == [8, 16]
    ids = torch.tensor([[1, 5] + [127] * 8 + [6, 7] + [127] * 16 + [8, 9]])
    ref = reference(target, ids, extras, NEW)
    out = generate(target, drafter, ids, max_new_tokens=NEW, **extras)
    assert torch.equal(out.sequences, ref)


def test_ragged_batch_matches_each_row(llava, trained_llava):
    """Two left-padded rows with 1 and 2 images: each row equals its own unbatched answer."""
    rows = [llava_prompt(images=1, seed=3), llava_prompt(images=2, seed=4, text=(8, 9))]
    length = max(ids.shape[1] for ids, _ in rows)
    ids = torch.zeros(2, length, dtype=torch.long)
    mask = torch.zeros(2, length, dtype=torch.long)
    for b, (row, _) in enumerate(rows):
        ids[b, length - row.shape[1]:] = row[0]
        mask[b, length - row.shape[1]:] = 1
    pixel_values = torch.cat([extras["pixel_values"] for _, extras in rows])
    out = generate(llava, trained_llava, ids, attention_mask=mask, max_new_tokens=NEW,
                   pad_token_id=0, pixel_values=pixel_values)
    for b, (row, extras) in enumerate(rows):
        ref = reference(llava, row, extras, NEW)
        assert torch.equal(out.sequences[b, length:], ref[0, row.shape[1]:]), b


def _kv_after_prompt(target, drafter, ids, extras):
    # the prefill commits 1 token, so exactly one round drafts (the next has no depth left)
    lengths = []
    generate(target, drafter, ids, max_new_tokens=3,
             on_round=lambda *_: lengths.append(drafter.kv_length), **extras)
    assert drafter.kv_length == 0  # dropped when the call is over
    return lengths[0]


def test_draft_kv_does_not_grow_with_image_tokens():
    small, large = no_eos(tiny_llava(image_size=32)), no_eos(tiny_llava(image_size=64))
    lengths = {}
    for name, target, tokens in [("small", small, 16), ("large", large, 64)]:
        ids, extras = llava_prompt(images=2, tokens_per_image=tokens,
                                   image_size=target.config.vision_config.image_size)
        vispec = ViSpecDrafter.from_target(target)
        text_only = ViSpecDrafter.text_only(target)
        lengths[name] = (_kv_after_prompt(target, vispec, ids, extras),
                         _kv_after_prompt(target, text_only, ids, extras), ids.shape[1])
    (vs_small, to_small, len_small), (vs_large, to_large, len_large) = lengths["small"], lengths["large"]
    # ViSpec: the prompt's text pairs + one compressed token per image, whatever the image size
    assert vs_small == vs_large == len_small - 2 * 16 + 2
    # the text-only baseline keeps every image token
    assert to_small == len_small and to_large == len_large == len_small + 2 * 48


def _check_sampling(target, drafter, ids, batch_extras, extras, rows):
    """Joint law of the first two sampled tokens (top-k 3: 9 outcomes) over `rows` rows,
    chi-square against the target's exact probabilities. The second token comes from a verified
    draft (accepted, or resampled from the residual)."""
    top_k, length = 3, ids.shape[1]
    out = generate(target, drafter, ids.expand(rows, -1), max_new_tokens=4, do_sample=True,
                   top_k=top_k, pad_token_id=0, generator=torch.Generator().manual_seed(0),
                   **batch_extras)
    expected = {}
    with torch.no_grad():
        first = target(input_ids=ids, **extras).logits[0, -1].topk(top_k)
        for t1, p1 in zip(first.indices.tolist(), first.values.softmax(-1).tolist()):
            prefix = torch.cat([ids, torch.tensor([[t1]])], 1)
            more = {k: torch.cat([v, v.new_zeros(1, 1)], 1) if k == "mm_token_type_ids" else v
                    for k, v in extras.items()}
            second = target(input_ids=prefix, **more).logits[0, -1].topk(top_k)
            for t2, p2 in zip(second.indices.tolist(), second.values.softmax(-1).tolist()):
                expected[(t1, t2)] = p1 * p2
    pairs = list(zip(out.sequences[:, length].tolist(), out.sequences[:, length + 1].tolist()))
    assert set(pairs) <= set(expected)
    chi2 = sum((pairs.count(c) - rows * p) ** 2 / (rows * p) for c, p in expected.items())
    assert chi2 < 26.12, chi2  # chi-square, 8 degrees of freedom, p = 0.001
    return out.stats


def test_llava_sampling_has_the_targets_distribution(llava, trained_llava):
    ids, extras = llava_prompt(images=1, seed=LLAVA_PROMPTS[0][1])
    rows = 300
    batch = {"pixel_values": extras["pixel_values"].expand(rows, -1, -1, -1)}
    stats = _check_sampling(llava, trained_llava, ids, batch, extras, rows)
    assert stats.accepted > 0  # some second tokens came from accepted drafts


def test_qwen2_5_vl_sampling_has_the_targets_distribution(qwen, trained_qwen):
    # a trained drafter and 3,000 rows: with an untrained one almost every draft was rejected
    # outright, and a verifier that skipped the residual after a rejection still passed
    ids, extras = qwen_prompt(grids=QWEN_PROMPTS[0][0], seed=QWEN_PROMPTS[0][1])
    rows = 3000
    batch = {"pixel_values": extras["pixel_values"].repeat(rows, 1),
             "image_grid_thw": extras["image_grid_thw"].repeat(rows, 1),
             "mm_token_type_ids": extras["mm_token_type_ids"].expand(rows, -1)}
    torch.manual_seed(1)
    stats = _check_sampling(qwen, trained_qwen, ids, batch, extras, rows)
    assert stats.accepted > 0  # some second tokens came from accepted drafts


def test_save_and_load_round_trip(tmp_path, llava, trained_llava):
    trained_llava.save_pretrained(tmp_path)
    loaded = ViSpecDrafter.from_pretrained(tmp_path, llava)
    assert loaded.config == trained_llava.config
    saved, back = trained_llava.state_dict(), loaded.state_dict()
    assert saved.keys() == back.keys() and all(torch.equal(saved[k], back[k]) for k in saved)
    ids, extras = llava_prompt(images=2, seed=LLAVA_PROMPTS[1][1])
    a = generate(llava, trained_llava, ids, max_new_tokens=NEW, **extras)
    b = generate(llava, loaded, ids, max_new_tokens=NEW, **extras)
    assert torch.equal(a.sequences, b.sequences)
    assert (a.stats.accepted, a.stats.rounds) == (b.stats.accepted, b.stats.rounds)


def test_text_only_round_trip_keeps_the_variant(tmp_path, llava):
    drafter = ViSpecDrafter.text_only(llava)
    drafter.save_pretrained(tmp_path)
    loaded = ViSpecDrafter.from_pretrained(tmp_path, llava)
    assert loaded.config.text_only and loaded.adaptor is None and loaded.head.img_fc is None


@pytest.mark.parametrize("model", ["llava", "qwen"])
def test_cached_drafting_matches_a_full_teacher_forced_pass(request, monkeypatch, model):
    """Every round's root prediction (draft KV cache, compressed images, pairs appended round by
    round) equals the training-time pass over the whole final sequence at the same pair."""
    target = request.getfixturevalue(model)
    drafter = request.getfixturevalue(f"trained_{model}")
    ids, extras = (llava_prompt(images=2, seed=LLAVA_PROMPTS[1][1]) if model == "llava"
                   else qwen_prompt(grids=QWEN_PROMPTS[1][0], seed=QWEN_PROMPTS[1][1]))
    roots = []  # (root slot, root logits) per round
    original = drafter_module.dynamic_tree
    propose = drafter.propose

    def recording_propose(state):
        roots.append([state.input_ids.shape[1] - 1])
        return propose(state)

    def recording_tree(step, root_logits, *args):
        roots[-1].append(root_logits[0])
        return original(step, root_logits, *args)

    monkeypatch.setattr(drafter_module, "dynamic_tree", recording_tree)
    monkeypatch.setattr(drafter, "propose", recording_propose)
    out = generate(target, drafter, ids, max_new_tokens=NEW, **extras)
    assert out.stats.accepted > 0 and len(roots) > 3
    full = out.sequences
    more = {k: torch.cat([v, v.new_zeros(1, full.shape[1] - v.shape[1])], 1)
            if k == "mm_token_type_ids" else v for k, v in extras.items()}
    with torch.no_grad():
        hidden = target(input_ids=full, output_hidden_states=True, **more).hidden_states[-1]
        positions = drafter.adapter.prompt_positions(full, torch.ones_like(full), more)
        entries = drafter.sequence_entries(full, torch.ones_like(full, dtype=torch.bool),
                                           hidden[:, :-1], positions[..., :-1], more)
        pred, _ = drafter.run(entries)
    for slot, logits in roots:  # the pair (feature of slot - 1, root token) predicts the children
        j = int((entries.pair_index[0] == slot - 1).nonzero())
        assert torch.allclose(drafter.logits(pred[0, j]), logits, atol=1e-4), slot


@pytest.mark.parametrize("model", ["llava", "qwen"])
def test_prompt_without_images(request, model):
    target = request.getfixturevalue(model)
    ids = torch.tensor([[1, 5, 6, 7, 8, 9, 10]])
    ref = reference(target, ids, {}, NEW)
    drafter = request.getfixturevalue(f"trained_{model}")
    global_vecs = []
    out = generate(target, drafter, ids, max_new_tokens=NEW,
                   on_round=lambda *_: global_vecs.append(drafter._cache.global_vecs))
    assert torch.equal(out.sequences, ref)
    assert global_vecs and not any(g.any() for g in global_vecs)  # no image: no global vector


def test_llava_feature_overrides_passed_to_generate_reach_the_drafter(llava):
    # "full" keeps the CLS token: 17 features per image, where the config's "default" gives 16;
    # the drafter read the config and refused the prompt target.generate accepts
    ids, extras = llava_prompt(tokens_per_image=17)
    extras["vision_feature_select_strategy"] = "full"
    ref = reference(llava, ids, extras, NEW)
    out = generate(llava, ViSpecDrafter.from_target(llava), ids, max_new_tokens=NEW, **extras)
    assert torch.equal(out.sequences, ref)
