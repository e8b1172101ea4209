"""The DFlash trainer's data and start: `--distill` trains on the target's own continuations,
`--init-from` starts from a committed entry's weights."""

import torch
from safetensors.torch import load_file

from mmspec.zoo.training import data, train_dflash
from mmspec.zoo.training.committed import committed_state

SHIPPED = "HEAD:assets/zoo/text-dflash"


def _shipped_shape():
    """(layers, MLP width) of the committed entry, which later stages may change."""
    state = committed_state(SHIPPED)
    layers = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("layers."))
    return layers, state["layers.0.mlp.up_proj.weight"].shape[0]


def test_distill_and_init_from(monkeypatch, tmp_path, heldout_stream):
    monkeypatch.setattr(data, "token_stream", lambda tok, split: heldout_stream[:20000])
    seen = []
    loss = train_dflash.training_loss
    monkeypatch.setattr(train_dflash, "training_loss",
                        lambda drafter, ids, *a: seen.append(ids) or loss(drafter, ids, *a))
    out = tmp_path / "run"
    layers, width = _shipped_shape()
    train_dflash.main(["--target", "text-target", "--out", str(out), "--steps", "2",
                       "--batch-size", "2", "--anchors", "2", "--lr", "0", "--warmup", "0",
                       "--layer-ids", "1", "3", "5", "--layers", str(layers),
                       "--intermediate-size", str(width), "--init-from", SHIPPED,
                       "--distill", "3",
                       "--distill-prefix", "12", "--distill-new", "10"])
    # lr 0: the weights are the committed ones, read back from the final folder
    final = load_file(str(out / "final" / "model.safetensors"))
    assert final.keys() == committed_state(SHIPPED).keys()
    assert all(torch.equal(final[k].half(), v.half()) for k, v in committed_state(SHIPPED).items())
    # the windows are the target's greedy continuations of 12 corpus tokens
    (cache,) = (out / "distill").glob("continuations-*.pt")
    rows = torch.load(cache, weights_only=True).long()
    assert rows.shape == (3, 22) and all(ids.shape == (2, 22) for ids in seen)
    assert all(any(torch.equal(r, row) for row in rows) for ids in seen for r in ids)
    target, _ = train_dflash.load_target("text-target")
    assert torch.equal(target.generate(rows[:1, :12], max_new_tokens=10, do_sample=False,
                                       eos_token_id=[]), rows[:1])


def test_init_from_an_entry_with_fewer_layers_grows_identity_layers(monkeypatch):
    # a 2-layer drafter started from a 1-layer entry (the shipped entry's first layer) drafts
    # exactly as that entry until training moves its new layer; a drafter with fewer layers
    # than the entry is refused
    import pytest

    from mmspec.diffusion.dflash_train import new_drafter, training_loss

    target, _ = train_dflash.load_target("text-target")
    shipped = committed_state(SHIPPED)
    layers, width = _shipped_shape()
    assert layers > 1  # the zoo's entry has more than one layer
    one = {k: v for k, v in shipped.items()
           if not k.startswith("layers.") or k.startswith("layers.0.")}

    def drafter(layers):
        return new_drafter(target, mask_token_id=1, layers=layers, block_size=8,
                           target_layer_ids=[1, 3, 5], intermediate_size=width).float()

    small, grown = drafter(1), drafter(2)
    with monkeypatch.context() as m:
        m.setattr(train_dflash, "committed_state", lambda ref: one)
        for d in (small, grown):
            train_dflash.init_from_committed(d.model, "REV:one-layer")
    assert float(grown.model.layers[1].mlp.down_proj.weight.abs().sum()) == 0.0
    ids = torch.randint(2, 4000, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = (training_loss(d, ids, 4, torch.Generator().manual_seed(1)) for d in (small, grown))
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match=f"it has {layers} layers, more than --layers 1"):
        train_dflash.init_from_committed(drafter(1).model, SHIPPED)


def test_init_from_a_wider_entry_keeps_each_mlps_most_important_neurons(monkeypatch):
    # a drafter with narrower MLPs (--intermediate-size) started from the shipped entry keeps,
    # per layer, the neurons that move the output most: where the dropped ones are dead (zero
    # output weights), it drafts exactly as the entry does; a wider drafter is refused
    import pytest

    from mmspec.diffusion.dflash_train import new_drafter, training_loss

    target, _ = train_dflash.load_target("text-target")
    shipped = committed_state(SHIPPED)
    layers, width = _shipped_shape()
    dead = {}
    for key, value in shipped.items():
        value = value.clone()
        if key.endswith("down_proj.weight"):  # every 4th neuron dead, the rest faint or strong
            value[:, ::4] = 0.0
            value[:, 1::4] *= 1e-3
        dead[key] = value
    keep = width - width // 4

    def drafter(intermediate):
        return new_drafter(target, mask_token_id=1, layers=layers, block_size=8,
                           target_layer_ids=[1, 3, 5], intermediate_size=intermediate).float()

    full, narrow = drafter(width), drafter(keep)
    monkeypatch.setattr(train_dflash, "committed_state", lambda ref: dead)
    for d in (full, narrow):
        train_dflash.init_from_committed(d.model, "REV:dead-neurons")
    alive = [j for j in range(width) if j % 4]
    torch.testing.assert_close(narrow.model.layers[1].mlp.up_proj.weight,
                               dead["layers.1.mlp.up_proj.weight"][alive])
    ids = torch.randint(2, 4000, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = (training_loss(d, ids, 4, torch.Generator().manual_seed(1)) for d in (full, narrow))
    torch.testing.assert_close(a, b)
    # cut further, the faint neurons go before the strong ones
    fainter = drafter(width // 2)
    train_dflash.init_from_committed(fainter.model, "REV:dead-neurons")
    strong = [j for j in range(width) if j % 4 in (2, 3)]
    torch.testing.assert_close(fainter.model.layers[0].mlp.down_proj.weight,
                               dead["layers.0.mlp.down_proj.weight"][:, strong])
    with pytest.raises(ValueError, match="narrower than --intermediate-size"):
        train_dflash.init_from_committed(drafter(width + 64).model, "REV:dead-neurons")
