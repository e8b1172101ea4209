import pytest
import torch
from diffusers.models.embeddings import get_3d_rotary_pos_embed

from mmspec.video_dit import DraftAttentionConfig, apply_draft_attention, remove_draft_attention
from mmspec.video_dit.processors import (
    CogVideoXDraftAttnProcessor,
    HunyuanVideoDraftAttnProcessor,
    WanDraftAttnProcessor,
)

from .tiny import (
    tiny_cogvideox,
    tiny_hunyuan,
    tiny_hunyuan15,
    tiny_skyreels,
    tiny_wan,
    tiny_wan_vace,
)


def _cfg(sparsity, **kw):
    return DraftAttentionConfig(sparsity=sparsity, tile=(4, 4), dense_steps=0, dense_layers=0, **kw)


def _wan_inputs():
    g = torch.Generator().manual_seed(1)
    # 3 latent frames of 6 x 10 tokens: 4 x 4 tiles need padding
    return (torch.randn(2, 4, 3, 12, 20, generator=g), torch.tensor([900, 900]),
            torch.randn(2, 5, 16, generator=g))


def _wan_vace_inputs():
    latents, t, text = _wan_inputs()
    control = torch.randn(2, 6, 3, 12, 20, generator=torch.Generator().manual_seed(5))
    return (latents, t, text), {"control_hidden_states": control}


def _skyreels_df_inputs():
    # diffusion forcing: a timestep per latent frame, 4 frames in blocks of 2 -> frame-causal mask
    g = torch.Generator().manual_seed(6)
    return (torch.randn(2, 4, 4, 12, 20, generator=g),
            torch.tensor([[900, 900, 700, 700], [800, 800, 600, 600]]),
            torch.randn(2, 5, 16, generator=g)), {"enable_diffusion_forcing": True}


def _hunyuan_inputs():
    g = torch.Generator().manual_seed(2)
    # 20 text tokens: 2 blocks of 4 x 4 tiles; sample 0 has 7 valid (its second block is all
    # padding, skipped), sample 1 has 18
    text_mask = torch.ones(2, 20, dtype=torch.bool)
    text_mask[0, 7:] = False
    text_mask[1, 18:] = False
    return (torch.randn(2, 4, 2, 6, 10, generator=g), torch.tensor([900, 900]),
            torch.randn(2, 20, 16, generator=g), text_mask, torch.randn(2, 8, generator=g),
            torch.tensor([3000.0, 3000.0]))


def _hunyuan15_inputs():
    g = torch.Generator().manual_seed(4)
    # 20 + 3 text and 4 image tokens, the valid ones first (5 + 2 and 12 + 3): 2 blocks of 4 x 4
    # tiles, the second all padding in both samples (skipped)
    mask = torch.zeros(2, 20, dtype=torch.long)
    mask[0, :5] = mask[1, :12] = 1
    mask_2 = torch.ones(2, 3, dtype=torch.long)
    mask_2[0, 2:] = 0
    return (torch.randn(2, 4, 2, 6, 10, generator=g), torch.tensor([900.0, 900.0]),
            torch.randn(2, 20, 16, generator=g), mask), {
        "encoder_hidden_states_2": torch.randn(2, 3, 12, generator=g),
        "encoder_attention_mask_2": mask_2,
        "image_embeds": torch.zeros(2, 4, 8)}  # text to video: image tokens masked


def _cog_inputs():
    g = torch.Generator().manual_seed(3)
    rope = get_3d_rotary_pos_embed(embed_dim=16, crops_coords=((0, 0), (6, 10)),
                                   grid_size=(6, 10), temporal_size=3, device="cpu")
    return (torch.randn(2, 3, 4, 12, 20, generator=g), torch.randn(2, 7, 16, generator=g),
            torch.tensor([900, 900])), {"image_rotary_emb": rope}


MODELS = {
    "wan": (tiny_wan, lambda: (_wan_inputs(), {})),
    "wan_vace": (tiny_wan_vace, _wan_vace_inputs),
    "skyreels": (tiny_skyreels, lambda: (_wan_inputs(), {})),
    "skyreels_df": (lambda: tiny_skyreels(frames_per_block=2), _skyreels_df_inputs),
    "hunyuan": (tiny_hunyuan, lambda: (_hunyuan_inputs(), {})),
    # HunyuanVideo-I2V: the first frame's tokens get their own modulation, addressed by count
    # (the first H x W tokens: still frame 0's in the frame-major tile order)
    "hunyuan_i2v": (lambda: tiny_hunyuan(image_condition_type="token_replace"),
                    lambda: (_hunyuan_inputs(), {})),
    "hunyuan15": (tiny_hunyuan15, _hunyuan15_inputs),
    "cogvideox": (tiny_cogvideox, _cog_inputs),
}


@pytest.mark.parametrize("name", list(MODELS))
@torch.no_grad()
def test_sparsity_zero_equals_dense(name):
    build, inputs = MODELS[name]
    model = build()
    args, kwargs = inputs()
    dense = model(*args, **kwargs).sample
    state = apply_draft_attention(model, _cfg(0.0))
    out = model(*args, **kwargs).sample
    torch.testing.assert_close(out, dense, atol=1e-5, rtol=1e-5)
    assert [r.layer for r in state.records] == list(range(state.num_layers))
    # 12 video tiles; HunyuanVideo's text blocks that hold only padding are skipped (14 x 14
    # blocks: 13 x 13 computed where one of the two text blocks is live)
    hunyuan = (13**2 + 14**2) / (2 * 14**2)
    expected = {"hunyuan": hunyuan, "hunyuan_i2v": hunyuan, "hunyuan15": 13**2 / 14**2}
    assert all(r.density == pytest.approx(expected.get(name, 1.0)) for r in state.records)
    # sparsity really acts: a sparse run differs from dense and reports density < 1
    remove_draft_attention(model)
    state = apply_draft_attention(model, _cfg(0.6))
    sparse = model(*args, **kwargs).sample
    assert torch.isfinite(sparse).all() and not torch.allclose(sparse, dense, atol=1e-4)
    assert all(r.density < 1.0 for r in state.records)


FIRST_ATTENTION = {
    "wan": lambda m: m.blocks[0].attn1,
    "wan_vace": lambda m: m.vace_blocks[0].attn1,  # the VACE blocks run first
    "skyreels": lambda m: m.blocks[0].attn1,
    "skyreels_df": lambda m: m.blocks[0].attn1,
    "hunyuan": lambda m: m.transformer_blocks[0].attn,
    "hunyuan_i2v": lambda m: m.transformer_blocks[0].attn,
    "hunyuan15": lambda m: m.transformer_blocks[0].attn,
    "cogvideox": lambda m: m.transformer_blocks[0].attn1,
}


@pytest.mark.parametrize("name", list(MODELS))
@torch.no_grad()
def test_permute_once_matches_per_layer_permutation(name):
    build, inputs = MODELS[name]
    model = build()
    args, kwargs = inputs()
    dense = model(*args, **kwargs).sample
    # 6 x 10 tokens per frame: whole 2 x 2 tiles, padded 4 x 4 tiles
    for tile, reordered_once in (((2, 2), True), ((4, 4), False)):
        seen, outs = [], []  # whether tokens reaching the first self-attention are in tile order
        for once in (True, False):
            state = apply_draft_attention(model, DraftAttentionConfig(
                sparsity=0.6, tile=tile, dense_steps=0, dense_layers=0, permute_once=once))
            hook = FIRST_ATTENTION[name](model).register_forward_pre_hook(
                lambda *_, state=state: seen.append(state.tiled))
            outs.append(model(*args, **kwargs).sample)
            hook.remove()
            remove_draft_attention(model)
            assert state.tiled_forwards == seen[-1]  # the count benchmarks read, after the fact
        # padded frames reorder in each layer: padding slots would pass through every FFN; so
        # does diffusion forcing, whose per-frame modulation and causal mask are in token order
        assert seen == [reordered_once and name != "skyreels_df", False]
        torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    # a dense first layer runs the model's own processor on the reordered tokens and RoPE
    apply_draft_attention(model, DraftAttentionConfig(sparsity=0.0, tile=(2, 2), dense_steps=0,
                                                      dense_layers=1))
    torch.testing.assert_close(model(*args, **kwargs).sample, dense, atol=1e-5, rtol=1e-5)
    remove_draft_attention(model)


def test_only_self_attention_is_replaced_and_remove_restores():
    wan, hunyuan, cog = tiny_wan(), tiny_hunyuan(), tiny_cogvideox()
    before = {m: dict(m.attn_processors) for m in (wan, hunyuan, cog)}
    for m in (wan, hunyuan, cog):
        apply_draft_attention(m, _cfg(0.5))
    assert all(isinstance(b.attn1.processor, WanDraftAttnProcessor) for b in wan.blocks)
    assert not any(isinstance(b.attn2.processor, WanDraftAttnProcessor) for b in wan.blocks)
    hy = [n for n, p in hunyuan.attn_processors.items()
          if isinstance(p, HunyuanVideoDraftAttnProcessor)]
    assert len(hy) == 2 and not any(n.startswith("context_embedder") for n in hy)
    assert all(isinstance(b.attn1.processor, CogVideoXDraftAttnProcessor)
               for b in cog.transformer_blocks)
    for m in (wan, hunyuan, cog):
        remove_draft_attention(m)
        assert {n: p for n, p in m.attn_processors.items()} == before[m]
        assert not m._forward_pre_hooks and not m._forward_hooks


@torch.no_grad()
def test_wan_vace_with_a_control_video_shorter_than_the_latents():
    # diffusers zero-pads the control tokens after their patch embedding, in token order: the
    # model reorders in each layer then instead of once (the once-hook indexed past its end)
    model = tiny_wan_vace()
    (latents, t, text), _ = _wan_vace_inputs()
    control = torch.randn(2, 6, 2, 12, 20, generator=torch.Generator().manual_seed(7))
    dense = model(latents, t, text, control_hidden_states=control).sample
    state = apply_draft_attention(model, DraftAttentionConfig(
        sparsity=0.0, tile=(2, 2), dense_steps=0, dense_layers=0))
    out = model(latents, t, text, control_hidden_states=control).sample
    torch.testing.assert_close(out, dense, atol=1e-5, rtol=1e-5)
    assert len(state.records) == 5 and not state.tiled and state.tiled_forwards == 0


@pytest.mark.parametrize("name", ["hunyuan", "cogvideox"])
@torch.no_grad()
def test_padded_frames_and_text_padding_are_read_through_the_tile_order(name, monkeypatch):
    """Frames of 6 x 10 tokens in 4 x 4 tiles (padded), text last with padding (HunyuanVideo)
    or first (CogVideoX): under the Triton kernel (its interpreter here) no sparse layer copies
    its tokens into tile order, with the densities and the output of the path that does."""
    pytest.importorskip("triton")
    from mmspec.video_dit import sparse_attention

    build, inputs = MODELS[name]
    model = build()
    args, kwargs = inputs()
    copied, tiled_call = [], sparse_attention._attend_tiled
    monkeypatch.setattr(sparse_attention, "_attend_tiled",
                        lambda *a: copied.append(a[-1]) or tiled_call(*a))
    runs = []
    for through_order in (True, False):
        if not through_order:  # today's path: q, k, v copied into tile order in every layer
            monkeypatch.setattr(sparse_attention, "reads_through_order", lambda *a: False)
        state = apply_draft_attention(model, _cfg(0.6, backend="triton", draft_kernel="triton"))
        runs.append((model(*args, **kwargs).sample, [float(r.density) for r in state.records]))
        remove_draft_attention(model)
        assert len(copied) == (0 if through_order else state.num_layers)
    assert runs[0][1] == runs[1][1] and all(d < 1 for d in runs[0][1])
    torch.testing.assert_close(runs[0][0], runs[1][0], atol=1e-5, rtol=1e-5)
