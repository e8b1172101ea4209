"""Install DraftAttention (arXiv 2505.14708) on a diffusers video pipeline or transformer.

`apply_draft_attention(pipe_or_transformer, config)` swaps the processors of the self-attention
layers only (cross-attention stays dense) and registers hooks:
- a stateful diffusers `ModelHook` in the transformer's `HookRegistry` (`HOOK_NAME`) reads the
  step index (from the pipeline's cache context where it sends one; else the position of
  `timestep` in the pipeline scheduler's timesteps, or a count of timestep changes for a bare
  transformer) and the latent shape (the token grid); the pipeline resets it when a call ends;
- hooks on the patch embedding, RoPE and `proj_out` put the video tokens and the RoPE tables in
  tile order once per forward and restore the order once before unpatchify (`reorder.py`), so no
  layer gathers or scatters (paper's code: 3 gathers and 1 scatter per layer). Where a model
  variant does not allow it (Wan 2.2 TI2V's timestep per token, SkyReels-V2 diffusion forcing)
  or with `permute_once=False`, or where frames are not whole tiles (padding slots would travel
  through every block), each sparse layer reads the tokens through the tile permutation
  (`sparse_attention.py`: no copy on the Triton kernel; the torch backend and compiled blocks
  copy them into tile order with cached index tensors).

diffusers' Ulysses context parallelism (`enable_parallelism`, before or after applying): the
sparse layers run as the attention op inside diffusers' all-to-all, on the whole sequence for the
rank's heads, reordering per layer (`ulysses.py`); the post-forward hook averages the densities
and calibrations over the ranks. Ring attention is refused.

Deliberate differences from the official code: no patched model code; the step comes from a hook,
not from a `current_timestep` argument threaded through the model; the achieved density is
recorded per step and layer (`DraftAttentionState.records`, or an `on_density` callback).

`torch.compile`: the pre-forward hook tells each processor whether its layer is sparse in this
forward (`processor.sparse`) and collects the densities the processors kept after the forward, so
code inside the blocks reads one bool and no step or layer number: diffusers' regional
compilation (`compile_repeated_blocks(fullgraph=True)`) builds a dense and a sparse graph per
block class instead of recompiling per layer and step (`tests/video_dit/test_compile.py`).
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass

import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.hooks.hooks import StateManager

from . import reorder
from .config import DraftAttentionConfig
from .processors import (
    CogVideoXDraftAttnProcessor,
    HunyuanVideo15DraftAttnProcessor,
    HunyuanVideoDraftAttnProcessor,
    SkyReelsV2DraftAttnProcessor,
    WanDraftAttnProcessor,
)
from .tiles import frame_causal_tiles, tile_layout
from .ulysses import check_context_parallel, ulysses_config

_ATTR = "_mmspec_draft_attention"
HOOK_NAME = "mmspec_draft_attention"  # in the transformer's diffusers HookRegistry


class _ContextReader(StateManager):
    """Receives the `CacheContext` a pipeline sets around each model call
    (`model.cache_context("cond", step_index=i, ...)`): diffusers hands it to every
    `StateManager` attribute of a stateful hook. It keeps no per-context state."""

    def __init__(self):
        super().__init__(None)

    @property
    def current(self):
        return self._context


class DraftAttentionHook(ModelHook):
    """The transformer's hook in diffusers' `HookRegistry` (`HOOK_NAME`): reads the step and grid
    before each forward and collects the densities after it. Stateful: the pipeline resets it
    when a call ends (`maybe_free_model_hooks` -> `_reset_stateful_cache`), so the next call
    counts its steps from 0 without `remove_draft_attention`."""

    _is_stateful = True

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.context = _ContextReader()

    def pre_forward(self, module, *args, **kwargs):
        changed = self.state.pre_forward(module, args, kwargs, self.context.current)
        return (args, kwargs) if changed is None else changed

    def post_forward(self, module, output):
        self.state.post_forward()
        return output

    def reset_state(self, module):
        self.state.end_call()
        return module


def _wan_grid(model, x):  # x: [B, C, F, H, W]
    pt, ph, pw = model.config.patch_size
    return (x.shape[2] // pt, x.shape[3] // ph, x.shape[4] // pw)


def _hunyuan_grid(model, x):  # x: [B, C, F, H, W]
    p, pt = model.config.patch_size, model.config.patch_size_t
    return (x.shape[2] // pt, x.shape[3] // p, x.shape[4] // p)


def _cogvideox_grid(model, x):  # x: [B, F, C, H, W]
    p, pt = model.config.patch_size, model.config.patch_size_t or 1
    return ((x.shape[1] + pt - 1) // pt, x.shape[3] // p, x.shape[4] // p)


def _wan_layers(model):
    return [block.attn1 for block in model.blocks]


def _wan_vace_layers(model):  # the main blocks first, as in Wan; then the VACE blocks
    return _wan_layers(model) + [block.attn1 for block in model.vace_blocks]


def _skyreels_allowed(model, layout):
    # diffusion forcing: blocks of frames attend causally (diffusers builds the token mask)
    per_block = model.config.num_frame_per_block
    return frame_causal_tiles(layout, per_block) if per_block > 1 else None


def _hunyuan_layers(model):
    return [b.attn for b in model.transformer_blocks] + [b.attn for b in model.single_transformer_blocks]


def _hunyuan15_layers(model):
    return [b.attn for b in model.transformer_blocks]


def _cogvideox_layers(model):
    return [block.attn1 for block in model.transformer_blocks]


@dataclass(frozen=True)
class _Family:
    processor: type
    layers: object  # model -> self-attention modules in forward order
    grid: object  # (model, latents) -> (T, H, W)
    install_reorder: object  # (state, model) -> hook handles for one reorder per forward
    can_reorder: object = None  # (model, forward arguments) -> bool; None = always
    tile_inputs: object = None  # (state, forward arguments) -> None, permutes tables passed in
    # (model, layout) -> (bool [nQ, nT], count) of the blocks the model's own mask allows, or None
    allowed: object = None


_FAMILIES = {
    "WanTransformer3DModel": _Family(WanDraftAttnProcessor, _wan_layers, _wan_grid,
                                     reorder.install_wan, reorder.wan_can_reorder),
    # Wan VACE: the control branch's blocks attend over the control video's tokens, same grid
    "WanVACETransformer3DModel": _Family(WanDraftAttnProcessor, _wan_vace_layers, _wan_grid,
                                         reorder.install_wan_vace, reorder.wan_vace_can_reorder),
    # SkyReels-V2: Wan's layout; diffusion forcing adds a frame-causal mask (processors.py)
    "SkyReelsV2Transformer3DModel": _Family(SkyReelsV2DraftAttnProcessor, _wan_layers, _wan_grid,
                                            reorder.install_wan, reorder.skyreels_can_reorder,
                                            allowed=_skyreels_allowed),
    # image-to-video "token_replace" models modulate the first frame's tokens, addressed by
    # count: tile order is frame-major and the frames whole tiles, so they stay the first ones
    "HunyuanVideoTransformer3DModel": _Family(HunyuanVideoDraftAttnProcessor, _hunyuan_layers,
                                              _hunyuan_grid, reorder.install_hunyuan),
    # HunyuanVideo 1.5: dual-stream blocks only, its RoPE, patch embedding and output as 1.0's
    "HunyuanVideo15Transformer3DModel": _Family(HunyuanVideo15DraftAttnProcessor,
                                                _hunyuan15_layers, _hunyuan_grid,
                                                reorder.install_hunyuan),
    "CogVideoXTransformer3DModel": _Family(CogVideoXDraftAttnProcessor, _cogvideox_layers,
                                           _cogvideox_grid, reorder.install_cogvideox,
                                           tile_inputs=reorder.tile_cogvideox_inputs),
}


@dataclass(frozen=True)
class DensityRecord:
    step: int
    layer: int
    # share of the call's attention blocks computed, 1.0 for dense layers and steps; with joint
    # attention the blocks include the text's dense rows and columns (on a tiny model with long
    # text, as CogVideoX's 226 tokens, these dominate), minus text blocks of padding only
    density: float
    sparse: bool = True  # False: a dense warm-up step or dense layer (density 1.0)


class _DensityReport:
    """Density read-outs over `self.records`."""

    records: list[DensityRecord]

    def density_by_step(self) -> dict[int, float]:
        """Mean density over the layers (and CFG calls) of each step, dense layers (1.0)
        included: with 2 layers and `dense_layers=1`, sparsity 0.9 reads about 0.55."""
        sums: dict[int, list[float]] = {}
        for r in self.records:
            sums.setdefault(r.step, []).append(r.density)
        return {s: sum(v) / len(v) for s, v in sums.items()}

    def sparse_density(self) -> float | None:
        """Mean density of the sparse calls only (dense warm-up steps and dense layers left
        out): what `sparsity` sets; None before any sparse call."""
        sparse = [r.density for r in self.records if r.sparse]
        return sum(sparse) / len(sparse) if sparse else None

    def mean_density(self) -> float:
        """Share of dense attention blocks computed over the whole run (1.0 = dense): the mean
        over every self-attention call, dense warm-up steps and dense layers included."""
        records = self.records
        return sum(r.density for r in records) / len(records) if records else 1.0


class DraftAttentionState(_DensityReport):
    """Per-transformer state shared by the processors and hooks; also the density report."""

    def __init__(self, transformer, config: DraftAttentionConfig, pipe=None, on_density=None,
                 on_draft_map=None):
        self.transformer = transformer
        self.config = config
        # the pipeline, not its scheduler: `pipe.scheduler = X.from_config(...)` after applying
        # is the usual way to change samplers, and the new one's timesteps are the ones that run
        self._pipe = weakref.ref(pipe) if pipe is not None else None
        self.on_density = on_density
        self.on_draft_map = on_draft_map
        self.family = _FAMILIES[type(transformer).__name__]
        self.num_layers = len(self.family.layers(transformer))
        self._signature = inspect.signature(transformer.forward)
        self.step = -1
        self.num_steps = None
        self.layout = None
        self.allowed = None  # (bool [nQ, nT], count) where the model masks blocks, else None
        self.tiled = False  # this forward runs in tile order (reset after it)
        self.tiled_forwards = 0  # forwards that ran in tile order so far: where the reorder was
        self.context_parallel = None  # diffusers' ContextParallelConfig, read per forward
        self._last_timestep = None
        self._call_ended = False
        self._pending = []  # (step, layer, 0-d tensor or None), turned into floats on read
        self.hooks = []
        self.originals = {}
        self.processors = []  # ours, in layer order

    # -------------------------------------------------------------------------------- decisions

    def sparse_step(self) -> bool:
        return (self.layout is not None
                and self.step >= self.config.dense_step_count(self.num_steps)
                and self.num_layers > self.config.dense_layers)

    def sparse_layer(self, layer: int) -> bool:
        return self.sparse_step() and layer >= self.config.dense_layers

    def probe_step(self) -> bool:
        """The calibration probe (`config.calibrate`): the last dense warm-up step."""
        return (self.config.calibrate and self.layout is not None
                and self.step == self.config.dense_step_count(self.num_steps) - 1
                and self.num_layers > self.config.dense_layers)

    # ------------------------------------------------------------------------------------ hooks

    def pre_forward(self, module, args, kwargs, context=None):
        # enabled after DraftAttention was applied, or changed since
        self.context_parallel = _check_context_parallel(module, self.processors)
        if self._call_ended:  # the last pipeline call's records stay readable until now
            self._pending.clear()
            self._call_ended = False
        bound = self._signature.bind_partial(*args, **kwargs)
        latents, timestep = bound.arguments["hidden_states"], bound.arguments["timestep"]
        if context is not None and context.step_index is not None:
            # the pipeline says where its loop is (diffusers' cache context: Wan, ...): its
            # index over the scheduler's timesteps, several per denoising step for a
            # higher-order scheduler (Heun: t0, t1, t1, t2, t2, ...)
            order = self._scheduler_order()
            self.step = (context.step_index + order - 1) // order
            calls = context.num_inference_steps
            self.num_steps = -(-calls // order) if calls is not None else self._scheduler_steps()
        else:
            self._update_step(timestep)
        self.layout = tile_layout(self.family.grid(module, latents), self.config.tile,
                                  latents.device, self.config.query_tile)
        family = self.family
        # built here, outside any compiled block: its count is a host int, the budget's base
        self.allowed = None if family.allowed is None else family.allowed(module, self.layout)
        # frames that are not whole tiles are read through the tile permutation in each sparse
        # layer instead (sparse_attention.py): padding slots carried through the blocks cost
        # every FFN and projection (Wan at 480x832: 31% more tokens; the note below
        # BENCHMARKS.md `draft_attention_gpu` measures both ways).
        # Dense warm-up steps run in tile order too (their attention goes to the model's own
        # processor, which does not mind the order): step caches (diffusers' FirstBlockCache,
        # PyramidAttentionBroadcast, ...) keep block residuals or attention outputs from one
        # step for the next, and these must be in the order the later step runs in.
        # Under context parallelism diffusers splits the tokens and RoPE tables inside the
        # modules' forward, before our reorder hooks could see them whole: the sparse layers
        # reorder the whole sequence after the Ulysses all-to-all instead (ulysses.py).
        self.tiled = (self.config.permute_once and self.context_parallel is None
                      and self.num_layers > self.config.dense_layers
                      and not self.layout.has_padding
                      and (family.can_reorder is None
                           or family.can_reorder(module, bound.arguments)))
        self.tiled_forwards += self.tiled
        probe = self.probe_step()
        for processor in self.processors:  # read inside the blocks (see processors.py)
            processor.probe = probe and processor.layer >= self.config.dense_layers
            processor.sparse = self.sparse_layer(processor.layer) or processor.probe
            processor.densities.clear()  # left by a forward that raised
            processor.calibrations.clear()
        if self.tiled and family.tile_inputs is not None:
            family.tile_inputs(self, bound.arguments)
            return bound.args, bound.kwargs
        return None

    def post_forward(self):
        self.tiled = False
        if self.context_parallel is not None:
            self._average_over_ranks()
        for processor in self.processors:  # this forward's calls, in layer order
            for density in processor.densities:
                self.record(processor.layer, density)
            processor.densities.clear()
            if processor.calibrations:  # one host read per layer and run
                processor.sparsity = float(torch.stack(processor.calibrations).mean())
                processor.calibrations.clear()

    def _average_over_ranks(self) -> None:
        """Under Ulysses each rank's densities and calibrations are over its share of the heads,
        the same number on every rank: their mean over the ranks is the whole model's. One
        all-reduce per forward; every rank ran the same sparse layers, so the lists match."""
        values = [(p.densities, i) for p in self.processors for i, d in enumerate(p.densities)
                  if d is not None]
        values += [(p.calibrations, i) for p in self.processors
                   for i in range(len(p.calibrations))]
        if not values:
            return
        cp = self.context_parallel
        stacked = torch.stack([where[i].float() for where, i in values])
        torch.distributed.all_reduce(stacked, group=cp._ulysses_mesh.get_group())
        stacked /= cp.ulysses_degree
        for (where, i), value in zip(values, stacked):
            where[i] = value

    def layer_sparsity(self) -> dict[int, float]:
        """The sparsity of each sparse layer: `config.sparsity`, or the calibrated one."""
        return {p.layer: p.sparsity for p in self.processors
                if p.layer >= self.config.dense_layers}

    def _scheduler_order(self) -> int:
        return max(1, int(getattr(self.scheduler, "order", 1) or 1))

    def _scheduler_steps(self):
        timesteps = getattr(self.scheduler, "timesteps", None)
        return None if timesteps is None else -(-len(timesteps) // self._scheduler_order())

    @property
    def scheduler(self):
        pipe = self._pipe() if self._pipe is not None else None
        return getattr(pipe, "scheduler", None)

    def _update_step(self, timestep):
        t = float(torch.as_tensor(timestep).float().max())
        scheduler = self.scheduler
        timesteps = getattr(scheduler, "timesteps", None) if scheduler is not None else None
        if timesteps is not None:
            # a denoising step may take several model calls (Heun: order 2, timesteps
            # t0, t1, t1, t2, t2, ...) and timesteps may repeat (UniPC at a large shift), so the
            # position comes from the scheduler's own index (calls so far), not from matching t
            order = max(1, int(getattr(scheduler, "order", 1) or 1))
            ts = timesteps.float().cpu()
            gap = (ts - t).abs()
            index = getattr(scheduler, "step_index", None)
            if index is None:  # before the run's first scheduler.step()
                index = getattr(scheduler, "begin_index", None) or 0
            if not 0 <= index < len(ts) or gap[index] > gap.min() + 1e-6:
                index = int(gap.argmin())  # a loop that calls the model but not step()
            self.step = (int(index) + order - 1) // order
            self.num_steps = -(-len(timesteps) // order)
        elif t != self._last_timestep:
            # timesteps fall during sampling; a rise means a new generation
            new_run = self._last_timestep is None or t > self._last_timestep
            self.step = 0 if new_run else self.step + 1
        self._last_timestep = t

    # ---------------------------------------------------------------------------------- report

    def record(self, layer: int, density) -> None:
        self._pending.append((self.step, layer, density))
        if self.on_density is not None:
            self.on_density(self.step, layer, 1.0 if density is None else float(density))

    @property
    def records(self) -> list[DensityRecord]:
        """Every self-attention call so far, in order: (step, layer, density)."""
        return [DensityRecord(s, l, 1.0 if d is None else float(d), d is not None)
                for s, l, d in self._pending]

    def reset(self) -> None:
        """Forget the records and the step counter (call between generations if you like)."""
        self._pending.clear()
        self.step, self._last_timestep = -1, None

    def end_call(self) -> None:
        """A pipeline call ended (the hook's reset): the next forward starts a new run at step 0
        and forgets these records, which stay readable until then (as `step` and `num_steps`)."""
        self._last_timestep = None
        self._call_ended = True


class DraftAttentionStates(_DensityReport):
    """The report of a pipeline with two transformers (Wan 2.2: `transformer` for the high-noise
    steps, `transformer_2` for the rest): both experts' records read as one run."""

    def __init__(self, states: list[DraftAttentionState]):
        self.states = list(states)
        self.config = self.states[0].config

    @property
    def records(self) -> list[DensityRecord]:
        """Every self-attention call of either transformer, by step (in call order per step)."""
        return sorted((r for state in self.states for r in state.records), key=lambda r: r.step)

    @property
    def layout(self):
        """The tile layout of the latest forward (both experts see the same grid)."""
        return next((s.layout for s in self.states if s.layout is not None), None)

    def reset(self) -> None:
        for state in self.states:
            state.reset()


def _check_context_parallel(transformer, processors):
    """The `ContextParallelConfig` of diffusers' context parallelism on `transformer`
    (`enable_parallelism`), or None; refused in one line where DraftAttention cannot follow it:
    ring attention, uneven Ulysses shards, or a family whose attention (`processors`, the
    originals' or ours) takes no `_parallel_config` (CogVideoX's in diffusers 0.42)."""
    cp = ulysses_config(getattr(transformer, "_parallel_config", None))
    name = type(transformer).__name__
    check_context_parallel(cp, name)
    if cp is not None and not all(hasattr(p, "_parallel_config") for p in processors):
        raise NotImplementedError(
            f"DraftAttention on a {name} with context parallelism: its attention processors "
            f"take no part in it (no _parallel_config in diffusers' own); split the prompts "
            f"across GPUs instead (accelerate launch -m mmspec.video_dit.generate ...)")
    return cp


def _unwrap(model):
    """The module under `torch.compile(model)` (its processors and hooks are the ones that run;
    dynamo recompiles after they change)."""
    from torch._dynamo.eval_frame import OptimizedModule

    return model._orig_mod if isinstance(model, OptimizedModule) else model


def _transformers(pipe_or_transformer):
    """(transformers, the pipeline) of a pipeline, or ([transformer], None); a transformer
    wrapped by `torch.compile` is unwrapped."""
    if hasattr(pipe_or_transformer, "components") and hasattr(pipe_or_transformer, "scheduler"):
        found = [getattr(pipe_or_transformer, n, None) for n in ("transformer", "transformer_2")]
        found = [_unwrap(t) for t in found if t is not None]
        if not found:
            raise TypeError(
                f"pipe_or_transformer: the pipeline {type(pipe_or_transformer).__name__} has no "
                f"'transformer' component"
            )
        return found, pipe_or_transformer
    return [_unwrap(pipe_or_transformer)], None


def apply_draft_attention(pipe_or_transformer, config: DraftAttentionConfig | None = None, *,
                          on_density=None, on_draft_map=None):
    """Run the self-attention of a diffusers video transformer (or pipeline) with DraftAttention.

    Args:
        pipe_or_transformer: a `WanPipeline`-like pipeline (its `transformer` and, for Wan 2.2,
            `transformer_2`), or a `WanTransformer3DModel`, `WanVACETransformer3DModel`,
            `SkyReelsV2Transformer3DModel`, `HunyuanVideoTransformer3DModel`,
            `HunyuanVideo15Transformer3DModel` or `CogVideoXTransformer3DModel`.
        config: `DraftAttentionConfig()` by default.
        on_density: optional `callback(step, layer, density)` for every self-attention call,
            made when the transformer forward that ran the call returns (in layer order, which
            is call order except for Wan VACE, whose VACE blocks run first but are numbered
            after the main blocks).
        on_draft_map: optional `callback(step, layer, probs)` with the draft map fp32
            `[B, H, nQueryTiles, nTiles]` (tile order, before block selection; square without
            `config.query_tile`) of every call that goes
            through DraftAttention (the sparse layers of sparse steps). Under Ulysses context
            parallelism each rank's map holds its own heads, `[B, H/N, ...]`.

    Returns:
        The `DraftAttentionState` of the transformer: `.records`, `.density_by_step()`,
        `.mean_density()`, `.reset()`; for a pipeline with two transformers (Wan 2.2) a
        `DraftAttentionStates` that reads both as one run (`.states` holds each). Undo with
        `remove_draft_attention`.
    """
    config = DraftAttentionConfig() if config is None else config
    if not isinstance(config, DraftAttentionConfig):
        raise TypeError(f"config must be a DraftAttentionConfig, got {type(config).__name__}")
    transformers, pipe = _transformers(pipe_or_transformer)
    for transformer in transformers:  # every check before any change: all or nothing
        name = type(transformer).__name__
        if name not in _FAMILIES:
            raise TypeError(
                f"pipe_or_transformer: DraftAttention supports {sorted(_FAMILIES)}, got {name}"
            )
        layers = len(_FAMILIES[name].layers(transformer))
        if config.dense_layers >= layers:  # DraftAttention would never engage, silently
            raise ValueError(
                f"config.dense_layers={config.dense_layers} leaves no sparse layer: this {name} "
                f"has {layers} self-attention layers"
            )
        if getattr(transformer, _ATTR, None) is not None:
            raise RuntimeError(
                f"DraftAttention is already applied to this {name}; call remove_draft_attention first"
            )
        _check_context_parallel(transformer, [m.processor for m in _FAMILIES[name].layers(
            transformer)])
    if pipe is None:
        config.dense_step_count(None)  # a fraction of steps needs a scheduler: fail now
    states = []
    for transformer in transformers:
        state = DraftAttentionState(transformer, config, pipe, on_density, on_draft_map)
        for layer, module in enumerate(state.family.layers(transformer)):
            state.originals[module] = module.processor
            state.processors.append(state.family.processor(state, layer, module.processor))
            module.set_processor(state.processors[-1])
        registry = HookRegistry.check_if_exists_or_initialize(transformer)
        registry.register_hook(DraftAttentionHook(state), HOOK_NAME)
        registry.invalidate_child_registries_cache()
        if config.permute_once:
            state.hooks += state.family.install_reorder(state, transformer)
        setattr(transformer, _ATTR, state)
        states.append(state)
    return states[0] if len(states) == 1 else DraftAttentionStates(states)


def remove_draft_attention(pipe_or_transformer) -> None:
    """Restore the original processors and remove the hooks set by `apply_draft_attention`.
    On a pipeline it removes DraftAttention from each transformer that has it (Wan 2.2: one
    expert may have been patched alone) and fails, changing nothing, if none has."""
    transformers, pipe = _transformers(pipe_or_transformer)
    patched = [t for t in transformers if getattr(t, _ATTR, None) is not None]
    if not patched:
        what = (f"the transformers of this {type(pipe).__name__}" if pipe is not None
                else f"this {type(transformers[0]).__name__}")
        raise RuntimeError(f"DraftAttention is not applied to {what}")
    for transformer in patched:
        state = getattr(transformer, _ATTR)
        for module, processor in state.originals.items():
            module.set_processor(processor)
        for hook in state.hooks:
            hook.remove()
        registry = HookRegistry.check_if_exists_or_initialize(transformer)
        registry.remove_hook(HOOK_NAME, recurse=False)
        registry.invalidate_child_registries_cache()
        delattr(transformer, _ATTR)
