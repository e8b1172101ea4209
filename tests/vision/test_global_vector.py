"""ViSpec's global image vector (`vispec.md` §1.3-1.4): the adaptor's last query over the image's
own tokens, fed to `img_fc` with every text feature after the image, in the prompt pass, the
decode pass and the tree steps alike.

A fresh drafter's `img_fc` is `[I | 0]`, so the vector has no effect on its drafts and every
`generate` test passes with it zeroed or dropped; these tests look at it directly.
"""

import pytest
import torch
from tiny_vlms import IMAGE, llava_prompt

from mmspec import generate
from mmspec.vision import ViSpecDrafter

TOKENS = 16  # image tokens per tiny LLaVA image


@pytest.fixture(scope="module")
def drafter(llava):
    torch.manual_seed(3)
    drafter = ViSpecDrafter.from_target(llava)
    with torch.no_grad():  # as if trained: img_fc reads the global half, the adaptor's
        drafter.head.img_fc.weight.normal_(0, 0.3)  # queries attend sharply (each its own
        drafter.adaptor.k_proj.weight.mul_(100)  # mix of tokens) and its outputs are O(1)
        drafter.adaptor.o_proj.weight.mul_(100)
    return drafter


def _image_embeds(target, ids, extras) -> list:
    """Each image's rows of the target's own `inputs_embeds` (what its language model sees)."""
    seen = {}

    def grab(_module, _args, kwargs):
        seen["embeds"] = kwargs["inputs_embeds"]

    hook = target.model.language_model.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            target(input_ids=ids, **extras)
    finally:
        hook.remove()
    rows = seen["embeds"][0, ids[0] == IMAGE]
    return list(rows.split(TOKENS))


def _by_hand(adaptor, tokens) -> torch.Tensor:
    """The adaptor's last query attending over `tokens` `[n, d]` (softmax by hand) -> `[d]`."""
    h, dh = adaptor.heads, adaptor.head_dim
    k = adaptor.k_proj(tokens).view(-1, h, dh)  # [n, H, Dh]
    v = adaptor.v_proj(tokens).view(-1, h, dh)
    q = adaptor.queries[-1]  # [H, Dh]
    weights = torch.softmax((k * q).sum(-1) / dh ** 0.5, dim=0)  # [n, H]
    return adaptor.o_proj((weights[..., None] * v).sum(0).reshape(-1))


def test_every_text_entry_after_an_image_gets_that_images_global_vector(llava, drafter):
    """The vector each head input receives: zeros before the first image, then the latest image's
    adaptor output (last query over that image's tokens), through the prompt pass and every
    later round (decode entries and tree steps)."""
    ids, extras = llava_prompt(images=2, seed=5)
    with torch.no_grad():
        expected = [_by_hand(drafter.adaptor, x) for x in _image_embeds(llava, ids, extras)]
    assert not torch.allclose(expected[0], expected[1], atol=1e-3)
    last_image = [int(s[-1]) for s in (ids[0] == IMAGE).nonzero()[:, 0].split(TOKENS)]
    calls = []
    inputs = drafter.head.inputs

    def recording(embeds, features, global_vecs, *rest):
        calls.append(global_vecs.detach().clone())
        return inputs(embeds, features, global_vecs, *rest)

    drafter.head.inputs = recording
    entries = []
    run = drafter.run
    drafter.run = lambda e, *a: entries.append(e) or run(e, *a)
    try:
        generate(llava, drafter, ids, max_new_tokens=8, **extras)
    finally:
        del drafter.head.inputs, drafter.run
    assert len(entries) > 1 and len(calls) > len(entries)  # rounds after the prompt, tree steps
    # the prompt pass: pair i holds token i + 1, so pairs i >= last slot of image k follow it
    prompt = entries[0]
    text = ~prompt.is_compressed[0] & prompt.valid[0]
    for j in text.nonzero()[:, 0].tolist():
        pair = int(prompt.pair_index[0, j])
        got = calls[0][0, j]
        if pair < last_image[0]:
            assert not got.any(), pair
        else:
            k = 1 if pair >= last_image[1] else 0
            assert torch.allclose(got, expected[k], atol=1e-5), pair
    for got in calls[1:]:  # later rounds and every tree step: the last image's vector
        assert torch.allclose(got, expected[1].expand_as(got), atol=1e-5)


def test_the_global_vector_changes_the_draft_of_text_after_the_image_only(llava, drafter):
    """`img_fc([feature ; global])` by hand, and the draft head's outputs: another global vector
    changes every text entry after the image (and nothing before it); the same one changes
    nothing."""
    ids, extras = llava_prompt(images=1, seed=6)
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        hidden = llava(input_ids=ids, output_hidden_states=True, **extras).hidden_states[-1]
        positions = drafter.adapter.prompt_positions(ids, torch.ones_like(ids), extras)
        entries = drafter.sequence_entries(ids, mask, hidden[:, :-1], positions[..., :-1], extras)
        head = drafter.head
        x = head.inputs(entries.embeds, entries.features, entries.global_vecs, entries.compressed,
                        entries.is_compressed)
        d = entries.features.shape[-1]
        w, b = head.img_fc.weight, head.img_fc.bias
        fused = entries.features @ w[:, :d].T + entries.global_vecs @ w[:, d:].T + b
        manual = head.fc(torch.cat([entries.embeds, fused], -1))
        text = ~entries.is_compressed[0]
        assert torch.allclose(x[0, text], manual[0, text], atol=1e-5)

        out, _ = drafter.run(entries)
        again, _ = drafter.run(entries)
        other = torch.randn(d, generator=torch.Generator().manual_seed(0))
        swapped = entries.global_vecs.clone()
        swapped[entries.global_vecs.abs().sum(-1) > 0] = other
        changed, _ = drafter.run(type(entries)(**{**vars(entries), "global_vecs": swapped}))
    after = text & (entries.pair_index[0] >= int((ids[0] == IMAGE).nonzero()[-1, 0]))
    before = text & ~after
    assert after.sum() >= 3 and before.sum() >= 3
    assert torch.equal(out, again)
    assert torch.allclose(changed[0, before], out[0, before], atol=1e-6)
    assert ((changed[0, after] - out[0, after]).abs().amax(-1) > 1e-3).all()
