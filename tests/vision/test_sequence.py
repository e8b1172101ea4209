"""The draft sequence: images compressed to trailing positions, global vectors after each image."""

import torch

from mmspec.vision.sequence import decode_entries, prompt_entries

I = 99  # image token id
D = 4


def _case():
    ids = torch.tensor([[1, 5, I, I, I, 6, 7, I, I, 8, 9]])  # images at slots 2-4 and 7-8
    features = torch.arange(10.0)[None, :, None].expand(1, 10, D).clone()  # pair i -> value i
    positions = torch.arange(10)[None, None]  # [1, 1, 10]
    embed = torch.arange(100.0)[:, None].expand(100, D) * 100  # token t -> 100 t
    images = [torch.full((3, D), -1.0), torch.full((2, D), -2.0)]
    adapted = torch.tensor([[10.0, 11.0], [20.0, 21.0]])[..., None].expand(2, 2, D)  # [K, Q, D]
    slots = [(0, torch.tensor([2, 3, 4])), (0, torch.tensor([7, 8]))]
    return ids, features, positions, embed, images, adapted, slots


def test_images_become_one_token_at_the_span_end_with_global_vectors_after():
    ids, features, positions, embed, images, adapted, slots = _case()
    e = prompt_entries(ids, torch.ones_like(ids, dtype=torch.bool), features, positions, embed,
                       images, adapted, slots, num_compressed=1)
    # pairs 1-3 and 6-7 carry image tokens and are replaced by one compressed token each,
    # at the position of the span's last pair (3 and 7)
    assert e.pair_index[0].tolist() == [0, -1, 4, 5, -1, 8, 9]
    assert e.positions[0, 0].tolist() == [0, 3, 4, 5, 7, 8, 9]
    assert e.is_compressed[0].tolist() == [False, True, False, False, True, False, False]
    assert e.compressed[0, [1, 4], 0].tolist() == [10.0, 20.0]  # the adaptor's first outputs
    # global vectors: none before the first image, then the latest image's last output
    assert e.global_vecs[0, :, 0].tolist() == [0, 0, 11, 11, 0, 21, 21]
    assert e.features[0, [0, 2, 3, 5, 6], 0].tolist() == [0, 4, 5, 8, 9]
    assert e.embeds[0, [0, 2, 3, 5, 6], 0].tolist() == [500, 600, 700, 800, 900]  # token i + 1
    assert e.valid.all()


def test_text_only_keeps_every_pair_with_image_features_as_embeddings():
    ids, features, positions, embed, images, _, slots = _case()
    e = prompt_entries(ids, torch.ones_like(ids, dtype=torch.bool), features, positions, embed,
                       images, None, slots, num_compressed=1)
    assert e.pair_index[0].tolist() == list(range(10))
    assert e.embeds[0, :, 0].tolist() == [500, -1, -1, -1, 600, 700, -2, -2, 800, 900]
    assert not e.is_compressed.any() and not e.global_vecs.any()


def test_rows_are_padded_and_left_padding_is_skipped():
    ids, features, positions, embed, images, adapted, slots = _case()
    ids2 = torch.cat([ids, torch.tensor([[0, 0, 0, 0, 1, 5, I, I, I, 6, 7]])])
    valid = ids2 != 0
    features2 = features.expand(2, -1, -1)
    positions2 = torch.stack([positions[0, 0], (valid.long().cumsum(1) - 1).clamp(min=0)[1, :-1]])[None]
    images2 = images + [torch.full((3, D), -3.0)]
    adapted2 = torch.cat([adapted, torch.tensor([[30.0, 31.0]])[..., None].expand(1, 2, D)])
    slots2 = slots + [(1, torch.tensor([6, 7, 8]))]
    e = prompt_entries(ids2, valid, features2, positions2, embed, images2, adapted2, slots2, 1)
    assert e.valid.sum(1).tolist() == [7, 4]
    assert e.pair_index[1].tolist() == [4, -1, 8, 9, -1, -1, -1]  # pair 3 is left padding
    assert e.positions[0, 1, :4].tolist() == [0, 3, 4, 5]
    assert e.global_vecs[1, :4, 0].tolist() == [0, 0, 31, 31]


def test_decode_entries_compact_each_rows_new_tokens():
    new_ids = torch.tensor([[11, 12, 13], [21, 0, 23]])  # row 1: one draft accepted of two slots
    new_valid = torch.tensor([[True, True, True], [True, False, True]])
    features = torch.randn(2, 3, D)
    embed = torch.arange(100.0)[:, None].expand(100, D)
    roots = torch.tensor([[[40], [50]]])
    e = decode_entries(new_ids, new_valid, features, roots, embed, torch.ones(2, D))
    assert e.embeds[:, :, 0].tolist() == [[11, 12, 13], [21, 23, 0]]
    assert e.valid.tolist() == [[True, True, True], [True, True, False]]
    assert e.positions[0].tolist() == [[40, 41, 42], [50, 51, 52]]
    assert torch.equal(e.features, features)
