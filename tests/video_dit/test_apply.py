import pytest
import torch

from mmspec.video_dit import DraftAttentionConfig, apply_draft_attention, remove_draft_attention

from .tiny import TINY_CALL, tiny_wan, tiny_wan_pipeline


def test_unsupported_model_class():
    with pytest.raises(TypeError, match=r"supports \[.*WanTransformer3DModel.*\], got Linear"):
        apply_draft_attention(torch.nn.Linear(2, 2), DraftAttentionConfig(dense_steps=0))


def test_dense_layers_that_leave_no_sparse_layer():
    # every call went to the dense processor and reported density 1.0, with no error
    with pytest.raises(ValueError, match=r"dense_layers=2 leaves no sparse layer: this "
                                         r"WanTransformer3DModel has 2 self-attention layers"):
        apply_draft_attention(tiny_wan(), DraftAttentionConfig(dense_steps=0, dense_layers=2))


def test_fractional_warmup_needs_a_pipeline():
    with pytest.raises(ValueError, match="fraction of the denoising steps"):
        apply_draft_attention(tiny_wan(), DraftAttentionConfig(dense_steps=0.3))


def test_apply_twice_and_remove_twice():
    model = tiny_wan()
    apply_draft_attention(model, DraftAttentionConfig(dense_steps=0))
    with pytest.raises(RuntimeError, match="already applied"):
        apply_draft_attention(model, DraftAttentionConfig(dense_steps=0))
    remove_draft_attention(model)
    with pytest.raises(RuntimeError, match="not applied"):
        remove_draft_attention(model)


@torch.no_grad()
def test_tile_larger_than_the_frame():
    model = tiny_wan()
    apply_draft_attention(model, DraftAttentionConfig(dense_steps=0))  # 8 x 16 tiles
    with pytest.raises(ValueError, match=r"tile \(8, 16\) is larger than the frame"):
        model(torch.randn(1, 4, 2, 8, 8), torch.tensor([900]), torch.randn(1, 3, 16))


@torch.no_grad()
def test_step_index_from_the_timestep_hook():
    model = tiny_wan(num_layers=1)
    seen = []
    state = apply_draft_attention(
        model, DraftAttentionConfig(sparsity=0.5, tile=(2, 2), dense_steps=2, dense_layers=0),
        on_density=lambda step, layer, density: seen.append((step, density)),
    )
    x, e = torch.randn(1, 4, 2, 8, 8), torch.randn(1, 3, 16)
    for t in (900, 900, 800, 700, 600, 900):  # CFG calls share a step; a rise starts a new run
        model(x, torch.tensor([t]), e)
    assert [s for s, _ in seen] == [0, 0, 1, 2, 3, 0]
    assert [d == 1.0 for _, d in seen] == [True, True, True, False, False, True]
    assert state.density_by_step()[2] == pytest.approx(0.5, abs=1 / 8)


@torch.no_grad()
def test_top_p_and_calibration_set_the_budget_from_the_map():
    model = tiny_wan(num_layers=3)
    x, e = torch.randn(1, 4, 2, 8, 8), torch.randn(1, 3, 16)
    # top_p: no fixed budget; mass 1.0 keeps every block up to the cap
    state = apply_draft_attention(model, DraftAttentionConfig(
        tile=(2, 2), dense_steps=0, mode="top_p", mass=1.0, max_density=0.375))
    model(x, torch.tensor([900]), e)
    assert [r.density for r in state.records[1:]] == [pytest.approx(0.375, abs=1 / 8)] * 2
    remove_draft_attention(model)
    # calibrate: step 0 (the last dense one) probes; steps 1-2 run each layer's own sparsity
    state = apply_draft_attention(model, DraftAttentionConfig(
        sparsity=0.9, tile=(2, 2), dense_steps=1, calibrate=True, mass=0.5, max_density=0.75))
    model(x, torch.tensor([900]), e)
    assert [r.sparse for r in state.records] == [False] * 3  # the probe counts as dense
    calibrated = state.layer_sparsity()
    assert list(calibrated) == [1, 2] and all(0.25 <= s < 0.9 for s in calibrated.values())
    for t in (800, 700):
        model(x, torch.tensor([t]), e)
    for r in state.records[3:]:
        if r.layer:
            assert r.density == pytest.approx(1 - calibrated[r.layer], abs=1 / 8)
    remove_draft_attention(model)


@torch.no_grad()
def test_tiny_wan_pipeline_end_to_end():
    pipe = tiny_wan_pipeline()
    pipe.set_progress_bar_config(disable=True)
    call = {"prompt": "a red cat runs", **TINY_CALL}
    dense = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
    state = apply_draft_attention(pipe, DraftAttentionConfig(sparsity=0.5, tile=(2, 2),
                                                             dense_steps=0.3, dense_layers=1))
    frames = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
    assert frames.shape == dense.shape == (1, 5, 64, 64, 3)
    assert frames.min() >= 0 and frames.max() <= 1 and frames.std() > 0
    by_step = state.density_by_step()
    assert list(by_step) == [0, 1, 2] and by_step[0] == 1.0  # 30% of 3 steps: 1 dense step
    assert all(0.5 < by_step[s] < 1.0 for s in (1, 2))  # layer 0 dense, layer 1 at ~0.5
    assert len(state.records) == 3 * 2 * 2  # steps x (cond, uncond) x layers
    assert not (frames == dense).all()
    remove_draft_attention(pipe)
    again = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
    assert (again == dense).all()


def _dense_then_sparse(pipe, call, sparsity, **config):
    """The pipeline's frames dense, then under DraftAttention at sparsity 0 and at `sparsity`
    (applied and removed each time, the same seed): (dense, [at 0, at sparsity], last state)."""
    dense = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
    outs = []
    for s in (0.0, sparsity):
        state = apply_draft_attention(pipe, DraftAttentionConfig(sparsity=s, **config))
        outs.append(pipe(**call, generator=torch.Generator().manual_seed(0)).frames)
        remove_draft_attention(pipe)
    return dense, outs, state


@torch.no_grad()
def test_tiny_wan_vace_pipeline_end_to_end():
    # WanVACEPipeline: its VACE blocks attend over the control video's tokens (here the blank
    # video and mask it makes itself); prompt embeddings given instead of a prompt
    from diffusers import WanVACEPipeline

    from .tiny import tiny_wan_vace

    base = tiny_wan_pipeline()
    pipe = WanVACEPipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder,
                           vae=base.vae, scheduler=base.scheduler,
                           transformer=tiny_wan_vace(vace_in_channels=4 * 2 + 8 * 8))
    pipe.set_progress_bar_config(disable=True)
    g = torch.Generator().manual_seed(3)
    call = {"prompt_embeds": torch.randn(1, 8, 16, generator=g),
            "negative_prompt_embeds": torch.randn(1, 8, 16, generator=g), "height": 64,
            "width": 64, "num_frames": 5, "num_inference_steps": 3, "guidance_scale": 2.0,
            "output_type": "np"}
    # 4 x 4 tokens a frame: whole 2 x 2 tiles, one reorder
    dense, outs, state = _dense_then_sparse(pipe, call, 0.5, tile=(2, 2),
                                            dense_steps=1, dense_layers=0)
    assert outs[0].shape == (1, 5, 64, 64, 3)
    assert abs(outs[0] - dense).max() < 1e-5  # the control tokens follow the video's order
    assert state.density_by_step() == {0: 1.0, 1: 0.5, 2: 0.5}
    assert len(state.records) == 3 * 2 * (3 + 2)  # steps x (cond, uncond) x (blocks + VACE)
    assert abs(outs[1] - dense).max() > 1e-3


# synchronous: 3 steps; asynchronous (ar_step 1: the second frame block one step behind the
# first, 5 model calls for 4 steps) over a long video of two 13-frame chunks, the second chunk
# conditioned on 5 frames of the first (its first block is context only: 4 calls)
_DF_RUNS = {"sync": ({"num_frames": 13, "ar_step": 0}, [0, 1, 2]),
            "async, long video": ({"num_frames": 21, "base_num_frames": 13, "overlap_history": 5,
                                   "addnoise_condition": 20, "ar_step": 1},
                                  [0, 0, 1, 2, 3] + [0, 1, 2, 3])}


@pytest.mark.parametrize("run", list(_DF_RUNS))
@torch.no_grad()
def test_tiny_skyreels_diffusion_forcing_pipeline_end_to_end(run):
    # SkyReelsV2DiffusionForcingPipeline sets num_frame_per_block = causal_block_size, so its
    # transformer passes a frame-causal mask: the sparse layers must keep to it. Asynchronous
    # runs give each frame block its own timestep; the step is the noisiest frame's (dense
    # while any frame is in its warm-up), and each chunk of a long video starts over.
    from .tiny import tiny_skyreels_pipeline

    pipe = tiny_skyreels_pipeline(diffusion_forcing=True)
    g = torch.Generator().manual_seed(3)
    frames, steps = _DF_RUNS[run]
    call = {"prompt": None, "prompt_embeds": torch.randn(1, 8, 16, generator=g),
            "negative_prompt_embeds": torch.randn(1, 8, 16, generator=g), "height": 64,
            "width": 64, "num_inference_steps": len(set(steps)), "guidance_scale": 2.0,
            "causal_block_size": 2, "output_type": "np", **frames}
    dense, outs, state = _dense_then_sparse(pipe, call, 0.5, tile=(2, 2),
                                            dense_steps=1, dense_layers=0)
    assert pipe.transformer.config.num_frame_per_block == 2  # 4 latent frames, 2 blocks
    assert abs(outs[0] - dense).max() < 1e-5  # the causal mask at tile level is exact
    assert [r.step for r in state.records][::4] == steps  # 4 calls: (cond, uncond) x layers
    # of the allowed blocks
    assert [r.density for r in state.records] == [1.0 if s == 0 else 0.5 for s in steps
                                                  for _ in range(4)]
    assert abs(outs[1] - dense).max() > 1e-3


@pytest.mark.parametrize("image_to_video", [False, True])
@torch.no_grad()
def test_tiny_skyreels_pipeline_end_to_end(image_to_video):
    # SkyReelsV2Pipeline (no diffusion forcing): Wan's layout, no mask, CFG as two forwards;
    # SkyReelsV2ImageToVideoPipeline adds CLIP image tokens to the cross-attention
    from .tiny import tiny_skyreels_pipeline

    pipe = tiny_skyreels_pipeline(diffusion_forcing=False, image_to_video=image_to_video)
    call = {"prompt": "a red cat runs", **TINY_CALL}
    if image_to_video:
        import numpy as np
        import PIL.Image

        pixels = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
        call["image"] = PIL.Image.fromarray(pixels)
    dense, outs, state = _dense_then_sparse(pipe, call, 0.5, tile=(2, 2),
                                            dense_steps=1, dense_layers=0)
    assert outs[0].shape == dense.shape == (1, 5, 64, 64, 3)
    assert abs(outs[0] - dense).max() < 1e-5
    assert state.density_by_step() == {0: 1.0, 1: 0.5, 2: 0.5}
    assert len(state.records) == 3 * 2 * 2  # steps x (cond, uncond) x layers
    assert abs(outs[1] - dense).max() > 1e-3


@pytest.mark.parametrize("expand_timesteps", [False, True])
@torch.no_grad()
def test_tiny_wan_image_to_video_pipeline(expand_timesteps):
    # Wan 2.2 image-to-video: the first frame's latents concatenated as channels, or (TI2V-5B,
    # expand_timesteps) put in the first latent frame with a timestep per token
    import numpy as np
    import PIL.Image

    from .tiny import tiny_wan_i2v_pipeline

    pipe = tiny_wan_i2v_pipeline(expand_timesteps=expand_timesteps)
    pipe.set_progress_bar_config(disable=True)
    timesteps = []
    pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: timesteps.append(kwargs["timestep"].shape), with_kwargs=True)
    pixels = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    call = {"image": PIL.Image.fromarray(pixels), "prompt": "a red cat runs",
            "negative_prompt": "blue", "height": 64, "width": 64, "num_frames": 5,
            "num_inference_steps": 3, "guidance_scale": 2.0, "max_sequence_length": 8,
            "output_type": "np"}
    dense, outs, state = _dense_then_sparse(pipe, call, 0.5, tile=(2, 2),
                                            dense_steps=1, dense_layers=0)
    # 2 latent frames of 4 x 4 tokens: one timestep, or one per token
    assert timesteps[0] == ((1, 32) if expand_timesteps else (1,))
    assert outs[0].shape == dense.shape == (1, 5, 64, 64, 3)
    assert abs(outs[0] - dense).max() < 1e-5
    assert state.density_by_step() == {0: 1.0, 1: 0.5, 2: 0.5}
    assert abs(outs[1] - dense).max() > 1e-3


_SMALL_CALL = {"prompt": "a red cat", "height": 64, "width": 64, "num_frames": 5,
               "guidance_scale": 1.0, "max_sequence_length": 8, "output_type": "latent"}


@torch.no_grad()
def test_steps_follow_the_scheduler_the_pipeline_has_at_call_time():
    # `pipe.scheduler = X` after applying is the usual way to change samplers; the old
    # scheduler's never-run 1000-step schedule labelled the steps 3, 250, 429, ...
    from diffusers import UniPCMultistepScheduler

    pipe = tiny_wan_pipeline()
    pipe.set_progress_bar_config(disable=True)
    state = apply_draft_attention(pipe, DraftAttentionConfig(sparsity=0.5, tile=(2, 2),
                                                             dense_steps=0.3, dense_layers=0))
    pipe.scheduler = UniPCMultistepScheduler(use_flow_sigmas=True, flow_shift=1.0,
                                             prediction_type="flow_prediction")
    pipe(**_SMALL_CALL, num_inference_steps=10, generator=torch.Generator().manual_seed(0))
    assert [r.step for r in state.records][::2] == list(range(10)) and state.num_steps == 10
    assert [d == 1.0 for d in state.density_by_step().values()] == [True] * 3 + [False] * 7


@torch.no_grad()
def test_a_second_order_scheduler_counts_denoising_steps():
    # Heun calls the model twice per step (timesteps t0, t1, t1, t2, t2, ...): matching t to
    # its first position labelled the calls 0, 1, 1, 3, 3, 5, 5 of "7" steps
    from diffusers import FlowMatchHeunDiscreteScheduler

    pipe = tiny_wan_pipeline()
    pipe.scheduler = FlowMatchHeunDiscreteScheduler(shift=3.0)
    pipe.set_progress_bar_config(disable=True)
    state = apply_draft_attention(pipe, DraftAttentionConfig(sparsity=0.5, tile=(2, 2),
                                                             dense_steps=0.5, dense_layers=0))
    pipe(**_SMALL_CALL, num_inference_steps=4, generator=torch.Generator().manual_seed(0))
    assert [r.step for r in state.records][::2] == [0, 1, 1, 2, 2, 3, 3]
    assert state.num_steps == 4
    assert [d == 1.0 for d in state.density_by_step().values()] == [True, True, False, False]


@torch.no_grad()
def test_wan22_two_experts_report_as_one_run():
    # Wan 2.2: `transformer` runs the high-noise steps, `transformer_2` the rest; the report
    # (and `generate`'s JSON, which reads it) must cover both and reset both
    from diffusers import WanPipeline

    from mmspec.video_dit import DraftAttentionStates

    base = tiny_wan_pipeline()
    pipe = WanPipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder, vae=base.vae,
                       scheduler=base.scheduler, transformer=base.transformer,
                       transformer_2=tiny_wan(seed=1), boundary_ratio=0.5)
    pipe.set_progress_bar_config(disable=True)
    call = {"prompt": "a red cat", "height": 64, "width": 64, "num_frames": 5,
            "num_inference_steps": 4, "guidance_scale": 1.0, "max_sequence_length": 8,
            "output_type": "np"}
    state = apply_draft_attention(pipe, DraftAttentionConfig(sparsity=0.5, tile=(2, 2),
                                                             dense_steps=1, dense_layers=0))
    assert isinstance(state, DraftAttentionStates) and len(state.states) == 2
    pipe(**call, generator=torch.Generator().manual_seed(0))
    first, second = ({r.step for r in s.records} for s in state.states)
    assert first and second and first.isdisjoint(second)  # each expert ran some of the steps
    assert sorted(state.density_by_step()) == [0, 1, 2, 3]
    assert len(state.records) == 4 * 2  # steps x layers, both experts
    assert state.mean_density() == pytest.approx((1.0 + 3 * 0.5) / 4, abs=0.1)
    state.reset()
    assert state.records == [] and all(s.records == [] for s in state.states)
    assert state.layout is not None
    remove_draft_attention(pipe)
    assert all(getattr(t, "_mmspec_draft_attention", None) is None
               for t in (pipe.transformer, pipe.transformer_2))


@torch.no_grad()
def test_tiny_cogvideox_pipeline_with_cfg_batch():
    from .tiny import tiny_cogvideox_pipeline

    pipe = tiny_cogvideox_pipeline()
    pipe.set_progress_bar_config(disable=True)
    calls = []
    state = apply_draft_attention(
        pipe, DraftAttentionConfig(sparsity=0.5, tile=(2, 2), dense_steps=1, dense_layers=0),
        on_density=lambda step, layer, density: calls.append(step),
    )
    frames = pipe(prompt="a red cat", negative_prompt="blue", height=64, width=64, num_frames=5,
                  num_inference_steps=3, guidance_scale=6.0, max_sequence_length=8,
                  output_type="np", generator=torch.Generator().manual_seed(0)).frames
    assert frames.shape[0] == 1 and frames.shape[2:] == (64, 64, 3) and frames.std() > 0
    # CFG runs uncond and cond as one batch of 2: one call per layer and step
    assert calls == [0, 0, 1, 1, 2, 2]
    by_step = state.density_by_step()
    # 8 video tiles at density 0.5 plus 2 dense text blocks: (32 + 100 - 64) / 100
    assert by_step[0] == 1.0 and by_step[1] == pytest.approx(0.68) and by_step[2] == pytest.approx(0.68)


@torch.no_grad()
def test_tiny_hunyuan_video_pipeline_with_true_cfg():
    # HunyuanVideoPipeline: embedded guidance, plus true CFG as a second forward per step (the
    # same timestep twice); text tokens after the video in joint attention, kept dense, except
    # text blocks of padding only, which are skipped in double- and single-stream blocks alike
    from .tiny import tiny_hunyuan_pipeline

    pipe = tiny_hunyuan_pipeline()
    pipe.set_progress_bar_config(disable=True)
    prompt = "a red cat runs on the beach in the snow at night a blue dog in the city at night"
    call = {"prompt": prompt, "negative_prompt": "a dog", "true_cfg_scale": 2.0,
            "height": 64, "width": 128, "num_frames": 5, "num_inference_steps": 3,
            "prompt_template": {"template": "{}", "crop_start": 0}, "max_sequence_length": 40,
            "output_type": "np"}
    dense, outs, state = _dense_then_sparse(pipe, call, 0.75, tile=(4, 4),
                                            dense_steps=1, dense_layers=1)
    assert dense.shape == (1, 5, 64, 128, 3)
    assert abs(outs[0] - dense).max() < 1e-5
    assert abs(outs[1] - dense).max() > 1e-3
    # steps x (cond, uncond) x (2 double- + 2 single-stream blocks), the step shared by both
    assert [r.step for r in state.records] == [s for s in range(3) for _ in range(8)]
    # 2 frames x 8 x 16 latents = 16 tiles of 4 x 4 (64 of 256 blocks kept), then 40 text
    # tokens in 3 blocks: the prompt's 20 tokens fill 2, the negative prompt's 2 tokens 1; a
    # block with a valid token keeps a dense row and column, the others are skipped
    live = {"cond": 2, "uncond": 1}
    expected = {k: (64 + 2 * n * 16 + n * n) / 19**2 for k, n in live.items()}
    sparse = [r.density for r in state.records if r.step > 0 and r.layer > 0]
    assert sparse == pytest.approx(([expected["cond"]] * 3 + [expected["uncond"]] * 3) * 2)
    assert all(r.density == 1.0 for r in state.records if r.step == 0 or r.layer == 0)
    assert (pipe(**call, generator=torch.Generator().manual_seed(0)).frames == dense).all()


@pytest.mark.parametrize("image_condition_type", ["token_replace", "latent_concat"])
@torch.no_grad()
def test_tiny_hunyuan_video_image_to_video_pipeline_with_true_cfg(image_condition_type):
    # HunyuanVideoImageToVideoPipeline (HunyuanVideo-I2V): a Llava text encoder whose image
    # tokens lead the text, all valid; true CFG as a second forward per step, whose text can be
    # longer: of the 16 image tokens the pipeline keeps every 4th (token_replace) or 2nd
    # (latent_concat) for the prompt, but every 2nd for the negative prompt (a black image).
    # token_replace: the first latent frame is the image's, its tokens modulated apart and
    # addressed by count (frame-major tile order keeps them first); latent_concat
    # (HunyuanVideo-I2V-33ch): the image latents and their mask as channels
    import numpy as np
    import PIL.Image

    from mmspec.video_dit.draft_map import block_budget

    from .tiny import HUNYUAN_I2V_TEMPLATE, tiny_hunyuan_i2v_pipeline

    pipe = tiny_hunyuan_i2v_pipeline(image_condition_type=image_condition_type)
    text_lengths = []
    pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: text_lengths.append(kwargs["encoder_hidden_states"].shape[1]),
        with_kwargs=True)
    token_replace = image_condition_type == "token_replace"
    pixels = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    call = {"image": PIL.Image.fromarray(pixels),
            "prompt": "a red cat runs on the beach in the snow at night a blue dog",  # 15 words
            "negative_prompt": "a dog", "true_cfg_scale": 2.0, "height": 64, "width": 64,
            # latent_concat decodes 4 frames more than it returns: 3 latent frames for 5
            "num_frames": 5 if token_replace else 9, "num_inference_steps": 3,
            "prompt_template": HUNYUAN_I2V_TEMPLATE, "max_sequence_length": 36,
            "output_type": "np"}
    dense, outs, state = _dense_then_sparse(pipe, call, 0.5, tile=(4, 4),
                                            dense_steps=1, dense_layers=1)
    assert dense.shape == (1, 5, 64, 64, 3) and dense.std() > 0
    # image tokens, then the prompt's 32 slots (36 minus the 4 that end the user turn)
    assert text_lengths[:2] == ([4 + 32, 8 + 32] if token_replace else [8 + 32, 8 + 32])
    assert abs(outs[0] - dense).max() < 2e-5  # 6e-6 and 3e-6 seen
    assert abs(outs[1] - dense).max() > 1e-3
    # steps x (cond, uncond) x (2 double- + 2 single-stream blocks), the step shared by both
    assert [r.step for r in state.records] == [s for s in range(3) for _ in range(8)]
    # 2 (token_replace) or 3 latent frames of 8 x 8: 8 or 12 tiles of 4 x 4, then 3 text blocks:
    # the image and prompt tokens (19 or 23) fill 2, the black image's and negative prompt's
    # (8 + 2) 1; a block with a valid token keeps a dense row and column, the others are skipped
    nt = state.layout.num_tiles
    assert nt == (8 if token_replace else 12)
    expected = {n: (block_budget(nt, 0.5) + 2 * n * nt + n * n) / (nt + 3) ** 2 for n in (2, 1)}
    sparse = [r.density for r in state.records if r.step > 0 and r.layer > 0]
    assert sparse == pytest.approx(([expected[2]] * 3 + [expected[1]] * 3) * 2)
    assert all(r.density == 1.0 for r in state.records if r.step == 0 or r.layer == 0)
    assert (pipe(**call, generator=torch.Generator().manual_seed(0)).frames == dense).all()


@pytest.mark.parametrize("image_to_video", [False, True])
@torch.no_grad()
def test_tiny_hunyuan_video15_pipeline_with_padded_text(image_to_video):
    # HunyuanVideo15Pipeline: CFG through diffusers' guider (one forward per branch), text
    # masks padded differently in the two branches, image tokens masked out (text-to-video) or
    # the SigLIP tokens of the first frame (HunyuanVideo15ImageToVideoPipeline)
    import numpy as np
    import PIL.Image

    from mmspec.video_dit.draft_map import block_budget

    from .tiny import tiny_hunyuan15_pipeline

    pipe = tiny_hunyuan15_pipeline(image_to_video=image_to_video)
    pipe.set_progress_bar_config(disable=True)
    g = torch.Generator().manual_seed(1)

    def text(valid, length, dim):
        mask = torch.zeros(1, length)
        mask[:, :valid] = 1
        return torch.randn(1, length, dim, generator=g), mask

    (pe, pm), (ne, nm), (glyph, glyph_mask) = text(5, 8, 16), text(2, 8, 16), text(0, 6, 12)
    call = {"prompt_embeds": pe, "prompt_embeds_mask": pm, "negative_prompt_embeds": ne,
            "negative_prompt_embeds_mask": nm, "prompt_embeds_2": glyph,
            "prompt_embeds_mask_2": glyph_mask, "negative_prompt_embeds_2": glyph,
            "negative_prompt_embeds_mask_2": glyph_mask, "num_frames": 5,
            "num_inference_steps": 3, "output_type": "np"}
    if image_to_video:  # the size follows the image: 80 x 160, a bucket of 128 (padded tiles)
        pixels = np.random.default_rng(0).integers(0, 255, (64, 128, 3), dtype=np.uint8)
        call["image"] = PIL.Image.fromarray(pixels)
    else:
        call.update(height=128, width=256)
    dense, outs, state = _dense_then_sparse(pipe, call, 0.75, tile=(4, 4),
                                            dense_steps=1, dense_layers=0)
    assert dense.shape == ((1, 5, 80, 160, 3) if image_to_video else (1, 5, 128, 256, 3))
    assert abs(outs[0] - dense).max() < 1e-5  # a mask that ignored the padding fails here
    assert abs(outs[1] - dense).max() > 1e-3
    assert [r.step for r in state.records] == [s for s in range(3) for _ in range(4)]
    # image tokens (729 masked, or 16 valid), 6 glyph and 8 prompt tokens, the valid ones first:
    # 5 (cond) or 2 (uncond) prompt tokens valid. Text blocks with a valid token keep a dense row
    # and column (T2V: 1 of 47 blocks, I2V: both of 2), the others are skipped
    nt, live, m = (state.layout.num_tiles, 2, state.layout.num_tiles + 2) if image_to_video \
        else (16, 1, 63)
    expected = (block_budget(nt, 0.75) + 2 * live * nt + live * live) / m**2
    assert state.density_by_step() == pytest.approx({0: 1.0, 1: expected, 2: expected})


@torch.no_grad()
def test_tiny_cogvideox_image_to_video_pipeline():
    # CogVideoXImageToVideoPipeline: the image latents concatenated as channels, CFG as one
    # batch of 2, text before the video in joint attention
    import numpy as np
    import PIL.Image

    from .tiny import tiny_cogvideox_pipeline

    pipe = tiny_cogvideox_pipeline(image_to_video=True)
    pipe.set_progress_bar_config(disable=True)
    pixels = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    call = {**TINY_CALL, "image": PIL.Image.fromarray(pixels), "prompt": "a red cat",
            "guidance_scale": 6.0}
    dense, outs, state = _dense_then_sparse(pipe, call, 0.5, tile=(2, 2),
                                            dense_steps=1, dense_layers=0)
    assert outs[0].shape == dense.shape and dense.std() > 0
    assert abs(outs[0] - dense).max() < 1e-4
    assert abs(outs[1] - dense).max() > 1e-3
    # 8 video tiles at density 0.5 plus 2 dense text blocks: (32 + 100 - 64) / 100
    assert state.density_by_step() == pytest.approx({0: 1.0, 1: 0.68, 2: 0.68})


@torch.no_grad()
def test_on_draft_map_hands_over_the_map_that_chose_the_blocks():
    from mmspec.video_dit.draft_map import select_blocks

    model = tiny_wan(num_layers=2)
    maps, densities = [], []
    apply_draft_attention(
        model, DraftAttentionConfig(sparsity=0.5, tile=(2, 2), dense_steps=1, dense_layers=1),
        on_density=lambda step, layer, density: densities.append((step, layer, density)),
        on_draft_map=lambda step, layer, probs: maps.append((step, layer, probs)),
    )
    x, e = torch.randn(1, 4, 2, 8, 8), torch.randn(1, 3, 16)
    for t in (900, 800, 700):
        model(x, torch.tensor([t]), e)
    assert [(s, l) for s, l, _ in maps] == [(1, 1), (2, 1)]  # sparse steps and layers only
    sparse = {(s, l): d for s, l, d in densities if (s, l) in {(1, 1), (2, 1)}}
    for step, layer, probs in maps:
        assert probs.shape == (1, 2, 8, 8)  # 2 frames x (4 x 4 tokens / 2 x 2 tiles) = 8 tiles
        assert torch.allclose(probs.sum(-1), torch.ones(1, 2, 8))
        kept = select_blocks(probs, 0.5, "global")
        assert float(kept.float().mean()) == pytest.approx(sparse[(step, layer)])


def test_remove_from_a_pipeline_with_one_patched_expert():
    # Wan 2.2 with only transformer_2 patched: removing through the pipeline failed on the
    # unpatched transformer and left transformer_2 patched
    from diffusers import WanPipeline

    base = tiny_wan_pipeline()
    pipe = WanPipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder, vae=base.vae,
                       scheduler=base.scheduler, transformer=base.transformer,
                       transformer_2=tiny_wan(seed=1), boundary_ratio=0.5)
    before = dict(pipe.transformer_2.attn_processors)
    apply_draft_attention(pipe.transformer_2, DraftAttentionConfig(dense_steps=0))
    remove_draft_attention(pipe)
    assert pipe.transformer_2.attn_processors == before
    with pytest.raises(RuntimeError, match="not applied to the transformers of this WanPipeline"):
        remove_draft_attention(pipe)


def test_a_refused_apply_changes_nothing():
    # Wan 2.2 with its second expert already patched: the first one was left patched too
    from diffusers import WanPipeline

    base = tiny_wan_pipeline()
    pipe = WanPipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder, vae=base.vae,
                       scheduler=base.scheduler, transformer=base.transformer,
                       transformer_2=tiny_wan(seed=1), boundary_ratio=0.5)
    apply_draft_attention(pipe.transformer_2, DraftAttentionConfig(dense_steps=0))
    before = dict(pipe.transformer.attn_processors)
    with pytest.raises(RuntimeError, match="already applied"):
        apply_draft_attention(pipe, DraftAttentionConfig())
    assert pipe.transformer.attn_processors == before
    assert getattr(pipe.transformer, "_mmspec_draft_attention", None) is None


@pytest.mark.parametrize("model, cache", [("wan", "first_block"), ("wan", "pyramid_broadcast"),
                                          ("cogvideox", "first_block")])
@torch.no_grad()
def test_step_caches_see_one_token_order_over_the_run(model, cache):
    # tokens put in tile order from the first sparse step on: a cache holding a dense step's
    # block residual (FirstBlockCache) or attention output (PyramidAttentionBroadcast) added it
    # to tile-ordered tokens; at sparsity 0 the output was off by 0.21 (FBC) and 0.06 (PAB)
    from diffusers import FirstBlockCacheConfig, PyramidAttentionBroadcastConfig

    from .tiny import tiny_cogvideox_pipeline

    if model == "wan":
        pipe = tiny_wan_pipeline()
        pipe.transformer = tiny_wan(num_layers=3)
        call = {**_SMALL_CALL, "num_inference_steps": 4}
    else:  # CFG as one batch of 2, text tokens first, RoPE tables from the pipeline
        pipe = tiny_cogvideox_pipeline()
        call = {**_SMALL_CALL, "num_inference_steps": 4, "negative_prompt": "blue",
                "guidance_scale": 6.0}
    pipe.set_progress_bar_config(disable=True)
    plain = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
    if cache == "first_block":
        pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=10.0))  # reuse every step
    else:
        pipe.transformer.enable_cache(PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(-1, 1001),
            current_timestep_callback=lambda: pipe.current_timestep))
    cached = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
    assert (cached - plain).abs().max() > 1e-3  # the cache did skip work
    apply_draft_attention(pipe, DraftAttentionConfig(sparsity=0.0, tile=(2, 2), dense_steps=1,
                                                     dense_layers=0))
    out = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
    torch.testing.assert_close(out, cached, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_the_state_is_a_diffusers_hook_reset_between_pipeline_calls():
    from diffusers.hooks import HookRegistry

    from mmspec.video_dit.apply import HOOK_NAME

    pipe = tiny_wan_pipeline()
    pipe.set_progress_bar_config(disable=True)
    state = apply_draft_attention(pipe, DraftAttentionConfig(sparsity=0.5, tile=(2, 2),
                                                             dense_steps=1))
    registry = HookRegistry.check_if_exists_or_initialize(pipe.transformer)
    assert registry.get_hook(HOOK_NAME).state is state
    # Wan's pipeline sends the step in its cache context: the scheduler is not read
    state._update_step = lambda timestep: pytest.fail("stepped by the scheduler fallback")
    call = {"prompt": "a red cat runs", **TINY_CALL}
    for _ in range(2):
        pipe(**call, generator=torch.Generator().manual_seed(0))
        # the pipeline's end resets the hook: the second call's records only, from step 0
        assert len(state.records) == 3 * 2 * 2  # steps x (cond, uncond) x layers
        assert list(state.density_by_step()) == [0, 1, 2]
    remove_draft_attention(pipe)
    assert registry.get_hook(HOOK_NAME) is None


@pytest.mark.parametrize("before", [True, False])
@torch.no_grad()
def test_set_attention_backend_chooses_the_dense_layers_backend(before, monkeypatch):
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    math = AttentionBackendName._NATIVE_MATH
    self_attention_calls = []
    real = _AttentionBackendRegistry._backends[math]

    def spy(query, key, value, **kwargs):  # [B, L, H, D]
        if query.shape[1] == key.shape[1]:
            self_attention_calls.append(query.shape[1])
        return real(query=query, key=key, value=value, **kwargs)

    monkeypatch.setitem(_AttentionBackendRegistry._backends, math, spy)
    monkeypatch.setattr(_AttentionBackendRegistry, "_active_backend",
                        _AttentionBackendRegistry._active_backend)
    model = tiny_wan(num_layers=2)
    config = DraftAttentionConfig(sparsity=0.5, tile=(2, 2), dense_steps=1, dense_layers=1)
    if before:
        model.set_attention_backend("_native_math")
    state = apply_draft_attention(model, config)
    if not before:
        model.set_attention_backend("_native_math")
    assert [p._attention_backend for p in state.processors] == [math, math]
    # another model's choice moves the global default: this one keeps its own
    _AttentionBackendRegistry.set_active_backend(AttentionBackendName.NATIVE)
    x, e = torch.randn(1, 4, 2, 8, 8), torch.randn(1, 3, 16)
    model(x, torch.tensor([900]), e)  # dense step: both layers on the chosen backend
    assert self_attention_calls == [32, 32]
    model(x, torch.tensor([800]), e)  # sparse step: layer 0 dense, layer 1 DraftAttention
    assert self_attention_calls == [32, 32, 32]
    remove_draft_attention(model)
