"""`ViSpecDrafter`: ViSpec (Kang et al. 2025, arXiv 2509.15235) as an mmspec drafter.

EAGLE-2 draft head + vision adaptor + global image vector (`head.py`, `adaptor.py`,
`sequence.py`), drafting an EAGLE-2 dynamic tree (`mmspec.decoding.dynamic_tree`) that
`mmspec.generate` verifies losslessly. It works on unmodified transformers targets (`targets.py`), any batch size, several
images per prompt.

Round 0 the drafter reads the whole prompt: the target's hidden states (`DraftState.target_hidden`),
the image features (recomputed from `DraftState.extras` by the target's own vision tower), and
builds its KV cache over text tokens plus Q - 1 compressed tokens per image: its length does not
grow with the number of image tokens. Later rounds append the pairs committed in the previous round.
Tree nodes only live in a temporary KV list that is dropped after the round; each tree level
attends through the shared block-sparse layer where that is not slower (off a CPU;
`mmspec/eagle/tree_attention.py`).

Deliberate differences from the reference code: batch size > 1 (ragged rows, holes in the slot
layout are masked), M-RoPE positions in the drafter for Qwen2.5-VL, per-image spans for several
images, no forked modeling code.
"""

from __future__ import annotations

import dataclasses

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from mmspec.decoding.draft import Draft, Drafter, DraftState, VerifyResult
from mmspec.decoding.dynamic_tree import dynamic_tree
from mmspec.eagle.draft_kv import TreeKV, append_kv
from mmspec.eagle.tree_attention import level_mask
from mmspec.hub import resolve_model

from .adaptor import VisionAdaptor
from .config import ViSpecConfig
from .head import DraftHead
from .sequence import Entries, decode_entries, prompt_entries
from .targets import adapter_for, signature_mismatch, target_signature
from .vispec_official import OfficialViSpecDrafter

CONFIG_NAME = "vispec_config.json"
WEIGHTS_NAME = "model.safetensors"
OFFICIAL_CONFIG_NAME = "config.json"  # the ViSpec authors' layout (vispec_official.py)


@dataclass
class _DraftCache:
    """Per-`generate` state: the draft KV cache and what the next round needs."""

    kv: list  # per layer (k, v) `[B, H, P, Dh]`
    valid: torch.Tensor  # bool `[B, P]`
    num_slots: int  # DraftState.input_ids columns already turned into entries
    root_positions: torch.Tensor  # long `[A, B, 1]`
    global_vecs: torch.Tensor  # `[B, d]` each row's latest image vector (zeros: none)


class ViSpecDrafter(nn.Module, Drafter):
    needs_target_hidden = True

    def __init__(self, config: ViSpecConfig, target):
        super().__init__()
        self.config = config
        self.adapter = adapter_for(target)
        axes, section = self.adapter.position_axes, config.mrope_section
        if (section is not None) if axes == 1 else (section is None or len(section) != axes):
            has, takes = (("one position axis", "no mrope_section (1-D RoPE)") if axes == 1 else
                          (f"{axes} position axes (M-RoPE)", f"{axes} sections, one per axis"))
            raise ValueError(f"mrope_section: a {type(target).__name__} target has {has}, so its "
                             f"drafter takes {takes}, got {section!r}")
        layers = self.adapter.text_config.num_hidden_layers
        if any(i > layers for i in config.feature_layers):
            raise ValueError(f"feature_layers: a {type(target).__name__} target of {layers} "
                             f"layers has hidden_states ids 0..{layers}, got "
                             f"{list(config.feature_layers)}")
        self.head = DraftHead(config)
        self.adaptor = None if config.text_only else VisionAdaptor(config)
        # frozen, shared with the target (vispec.md §1.2); not saved with the drafter
        self.register_buffer("embed_weight", self.adapter.embed_weight.detach(), persistent=False)
        self.register_buffer("lm_head_weight", self.adapter.lm_head.weight.detach(), persistent=False)
        self._cache: _DraftCache | None = None

    # --- construction, saving, loading ---

    @classmethod
    def from_target(cls, target, **config) -> ViSpecDrafter:
        """An untrained drafter for `target`; `config` overrides `ViSpecConfig` fields."""
        adapter = adapter_for(target)
        text = adapter.text_config
        theta, section = adapter.rope()
        heads = text.num_attention_heads
        arch = {
            "hidden_size": text.hidden_size, "num_heads": heads,
            "head_dim": getattr(text, "head_dim", None) or text.hidden_size // heads,
            "intermediate_size": text.intermediate_size,
            "vocab_size": int(adapter.lm_head.weight.shape[0]),
            "rms_norm_eps": text.rms_norm_eps, "rope_theta": theta, "mrope_section": section,
            "attention_bias": adapter.qkv_bias, "target": target_signature(target)}
        for name in ("hidden_size", "vocab_size", "target"):  # the target's, not choices
            if name in config and config[name] != arch[name]:
                raise ValueError(f"{name}: a ViSpec drafter takes its target's {name} "
                                 f"({arch[name]!r}), got {config[name]!r}")
        drafter = cls(ViSpecConfig(**{**arch, **config}), target)
        return drafter.to(device=adapter.embed_weight.device, dtype=adapter.embed_weight.dtype)

    @classmethod
    def text_only(cls, target, **config) -> ViSpecDrafter:
        """The ablation baseline: the same head without adaptor and global vector."""
        return cls.from_target(target, text_only=True, **config)

    def save_pretrained(self, path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / CONFIG_NAME).write_text(json.dumps(asdict(self.config), indent=2))
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()},
                  str(path / WEIGHTS_NAME))

    @classmethod
    def from_pretrained(cls, path, target, *, dtype: torch.dtype | None = None,
                        **tree) -> ViSpecDrafter | OfficialViSpecDrafter:
        """Load a drafter saved by `save_pretrained`; `target` must be the one it was built for.

        A folder in the ViSpec authors' layout (their config.json and weights, no
        vispec_config.json) loads as an `OfficialViSpecDrafter` that follows their forward
        (`vispec_official.py`), in the target's dtype.

        dtype: of the loaded drafter; None means the target's (training keeps fp32 master
        weights whatever the target's dtype, so it passes `torch.float32`).

        tree: `depth`, `top_k`, `total_tokens` override the saved tree shape, a run-time choice:
        on a CPU, verifying many nodes is compute-bound, so smaller trees than ViSpec's GPU
        default (30 tokens) can be faster overall.
        """
        path = resolve_model(path, "path")
        unknown = set(tree) - {"depth", "top_k", "total_tokens"}
        if unknown:
            raise TypeError(f"tree overrides are depth, top_k and total_tokens, got {sorted(unknown)}")
        if not (path / CONFIG_NAME).is_file() and (path / OFFICIAL_CONFIG_NAME).is_file():
            if dtype is not None:
                raise ValueError(f"dtype: the ViSpec authors' drafter in {path} runs in its "
                                 f"target's dtype, got {dtype!r}")
            return OfficialViSpecDrafter.from_pretrained(path, target, **tree)
        if not (path / CONFIG_NAME).is_file():
            raise FileNotFoundError(f"path: no {CONFIG_NAME} in {path} (nor the ViSpec "
                                    f"authors' {OFFICIAL_CONFIG_NAME})")
        try:
            fields = json.loads((path / CONFIG_NAME).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"path: {path / CONFIG_NAME} is not JSON ({err})") from None
        if not isinstance(fields, dict):
            raise ValueError(f"path: {path / CONFIG_NAME} is not a ViSpec config (a JSON "
                             f"object of its fields)")
        extra = sorted(set(fields) - {f.name for f in dataclasses.fields(ViSpecConfig)})
        if extra:
            raise ValueError(f"path: {path / CONFIG_NAME} has fields a ViSpec config does not: "
                             f"{extra}")
        required = sorted(f.name for f in dataclasses.fields(ViSpecConfig)
                          if f.default is dataclasses.MISSING
                          and f.default_factory is dataclasses.MISSING and f.name not in fields)
        if required:
            raise ValueError(f"path: {path / CONFIG_NAME} lacks the fields {required}")
        if not isinstance(fields.get("target", {}), dict):
            raise ValueError(f"path: {path / CONFIG_NAME}: 'target' must be the target's "
                             f"signature (a JSON object), got {fields['target']!r}")
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype such as torch.float16, or None, got "
                            f"{dtype!r}")
        config = ViSpecConfig(**{**fields, **tree})
        why = signature_mismatch(config.target, target)
        if why:
            raise ValueError(f"target: the drafter in {path} was saved for a "
                             f"{config.target.get('class')} ({config.target.get('name_or_path')!r}) "
                             f"and does not match this target ({why})")
        drafter = cls(config, target)
        weights = path / WEIGHTS_NAME
        if not weights.is_file():
            raise FileNotFoundError(f"path: no {WEIGHTS_NAME} in {path}")
        try:
            state = load_file(str(weights))
        except Exception as err:  # noqa: BLE001 (safetensors raises its own error type)
            raise ValueError(f"path: {weights} is not a safetensors file ({err})") from None
        own = drafter.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        shapes = sorted(f"{k} {tuple(state[k].shape)} for {tuple(own[k].shape)}"
                        for k in set(own) & set(state) if state[k].shape != own[k].shape)
        if missing or unexpected or shapes:  # e.g. text_only=true over ViSpec weights
            parts = [f"{what} {keys[:4]}{' ...' if len(keys) > 4 else ''}"
                     for what, keys in (("missing", missing), ("unexpected", unexpected),
                                        ("other shapes", shapes)) if keys]
            raise ValueError(f"path: the weights in {weights} do not fit the drafter its "
                             f"{CONFIG_NAME} describes ({'; '.join(parts)})")
        drafter.load_state_dict(state)
        weight = drafter.adapter.embed_weight
        return drafter.to(device=weight.device, dtype=weight.dtype if dtype is None else dtype)

    @property
    def target_hidden_layers(self) -> tuple:
        """The target's `hidden_states` entries `generate` hands over (`Drafter`), side by side:
        the last one, or the config's `feature_layers` (EAGLE-3's multi-layer features)."""
        return self.config.feature_layers or (-1,)

    @property
    def target_hidden_size(self) -> int:
        """The width of each entry (`Drafter`): the target's hidden size."""
        return self.config.hidden_size

    def target_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's hidden states at `target_hidden_layers`, side by side `[..., k d]` ->
        the drafter's features `[..., d]` (fused where there are several layers)."""
        return self.head.target_features(hidden.to(self.embed_weight.dtype))

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def kv_length(self) -> int:
        """Entries in the draft KV cache (0 before the first round)."""
        return 0 if self._cache is None else self._cache.valid.shape[1]

    # --- building blocks shared with training ---

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Through the target's lm_head: `[..., d]` -> `[..., V]`."""
        return F.linear(hidden, self.lm_head_weight.to(hidden.dtype))

    def images(self, input_ids: torch.Tensor, extras: dict):
        """(image features K x `[n_k, d]`, adaptor outputs `[K, Q, d]` or None, image slots)."""
        dtype = self.embed_weight.dtype  # the drafter may run in another dtype than the target
        images = [x.to(dtype) for x in self.adapter.image_features(extras)]
        slots = self.adapter.image_slots(input_ids, [x.shape[0] for x in images])
        adapted = self.adaptor(images) if images and self.adaptor is not None else None
        return images, adapted, slots

    def sequence_entries(self, input_ids, valid, features, positions, extras) -> Entries:
        """Entries for whole sequences (`sequence.prompt_entries`), images compressed.
        features `[B, S-1, d]`: already through `target_features`."""
        images, adapted, slots = self.images(input_ids, extras)
        return prompt_entries(input_ids, valid, features.to(self.embed_weight.dtype), positions,
                              self.embed_weight, images, adapted, slots,
                              self.config.num_queries - 1)

    def run(self, entries: Entries, past: list | None = None,
            past_valid: torch.Tensor | None = None):
        """Causal pass over `entries` after an optional KV prefix.

        Returns (hidden `[B, N, d]`, per-layer new (k, v)). Padding entries attend only themselves.
        """
        b, n = entries.valid.shape
        device = entries.valid.device
        x = self.head.inputs(entries.embeds, entries.features, entries.global_vecs,
                             entries.compressed, entries.is_compressed)
        causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        mask = (causal & entries.valid[:, None, :]) | torch.eye(n, dtype=torch.bool, device=device)
        if past_valid is not None:
            mask = torch.cat([past_valid[:, None, :].expand(b, n, -1), mask], 2)
        return self.head(x, entries.positions, past, mask)

    # --- the drafter contract ---

    def check_target(self, target) -> None:
        """ValueError unless `target` is the model this drafter was built for (`generate` asks
        before it starts): the drafter runs its own target's vision tower and embeddings."""
        own = self.adapter.target
        if target is own or getattr(target, "_orig_mod", None) is own:  # torch.compile wraps
            return
        why = signature_mismatch(self.config.target, target)
        if why:
            raise ValueError(f"target: this ViSpecDrafter was built for another "
                             f"{self.config.target.get('class')} ({why}); build it with "
                             f"ViSpecDrafter.from_target(target) or from_pretrained(path, target)")

    def check_inputs(self, model_kwargs: dict) -> None:
        """ValueError naming a processor output the target's class needs with images
        (LLaVA-NeXT's image_sizes, Qwen2.5-VL's image_grid_thw): the target's own prefill
        failed on it first, deep inside transformers, with a bare TypeError."""
        self.adapter.check_inputs(model_kwargs)

    def propose(self, state: DraftState) -> Draft:
        if state.target_hidden is None:
            raise ValueError("state.target_hidden is None: ViSpecDrafter needs the target's last "
                             "hidden states (it sets needs_target_hidden = True)")
        with torch.no_grad():
            entries = self._new_entries(state)
            cache = self._cache
            hidden, new_kv = self.run(entries, cache.kv or None, cache.valid if cache.kv else None)
            cache.kv = append_kv(cache.kv, new_kv)
            cache.valid = torch.cat([cache.valid, entries.valid], 1)
            cache.num_slots = state.input_ids.shape[1]
            cache.root_positions = self.adapter.root_positions(state.position_ids)
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            root_feature = hidden[rows, entries.last_index]  # [B, d]
            levels = min(self.config.depth, state.max_tokens)
            return dynamic_tree(self._tree_step(), self.logits(root_feature), root_feature,
                                self.config.top_k, levels, self.config.draft_nodes)

    def update(self, result: VerifyResult) -> None:
        """Nothing to do: the next `DraftState` carries the committed tokens and their features."""

    def end(self) -> None:
        """The `generate` call is over: drop its draft KV cache (rebuilt at round 0 anyway)."""
        self._cache = None

    def _new_entries(self, state: DraftState) -> Entries:
        ids, mask = state.input_ids, state.attention_mask
        hidden = self.target_features(state.target_hidden)
        if state.round == 0 or self._cache is None:
            positions = self.adapter.prompt_positions(ids[:, :-1], mask[:, :-1], state.extras)
            images, adapted, slots = self.images(ids, state.extras)
            entries = prompt_entries(ids, mask.bool(), hidden, positions, self.embed_weight, images,
                                     adapted, slots, self.config.num_queries - 1)
            empty = torch.zeros(ids.shape[0], 0, dtype=torch.bool, device=ids.device)
            self._cache = _DraftCache([], empty, 0, self.adapter.root_positions(state.position_ids),
                                      self._row_globals(ids, adapted, slots))
            return entries
        start = self._cache.num_slots
        return decode_entries(ids[:, start:], mask[:, start:].bool(), hidden,
                              self._cache.root_positions, self.embed_weight, self._cache.global_vecs)

    def _row_globals(self, input_ids, adapted, slots) -> torch.Tensor:
        """`[B, d]`: the global vector of each row's last image, zeros for rows without one."""
        out = self.embed_weight.new_zeros(input_ids.shape[0], self.config.hidden_size)
        if adapted is not None:
            for k, (row, _) in enumerate(slots):
                out[row] = adapted[k, -1]
        return out

    def _tree_step(self):
        """The `step` of `dynamic_tree`: frontier entries over the draft cache + tree entries."""
        cache = self._cache
        tree_kv = TreeKV(cache.kv)

        def step(tokens, features, depth, ancestors):
            b, k = tokens.shape
            x = self.head.inputs(self.embed_weight[tokens], features,
                                 cache.global_vecs[:, None].expand(b, k, -1),
                                 torch.zeros_like(features),
                                 torch.zeros(b, k, dtype=torch.bool, device=tokens.device))
            eye = torch.eye(k, dtype=torch.bool, device=tokens.device).expand(b, k, k)
            attends = torch.cat([cache.valid[:, None, :].expand(b, k, -1), ancestors, eye], 2)
            mask = level_mask(attends)  # the shared block-sparse layer where not slower
            positions = (cache.root_positions + depth).expand(-1, -1, k)
            hidden, new_kv = self.head(x, positions, tree_kv.past(), mask)
            tree_kv.add(new_kv)
            return self.logits(hidden), hidden

        return step
