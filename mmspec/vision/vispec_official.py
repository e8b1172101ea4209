"""Drafters trained by the ViSpec authors (github.com/KangJialiang/ViSpec), in their semantics.

    drafter = ViSpecDrafter.from_pretrained("ViSpec-Qwen2.5-VL-7B-Instruct", target)

`ViSpecDrafter.from_pretrained` returns an `OfficialViSpecDrafter` for a folder in the authors'
layout: their `config.json` (Llama-style fields, `qkv_bias` for Qwen2.5-VL, optional `bias`) and
`model.safetensors` or `pytorch_model.bin` with `fc`, `img_fc`, `imadpt.{q,k_proj,v_proj,o_proj}`,
`layers.0.*` and optionally `embed_tokens.weight`. Module names are the authors' except
`imadpt.q`, which is `VisionAdaptor.queries` here; `num_q` is the first dimension of `imadpt.q`
(the authors pass it by hand, 2 in every script).

What their forward (`vispec/model/cnets_ours.py`, `spec_model_ours.py`, `utils.py`) does, and so
what this drafter does, where it differs from mmspec's own `ViSpecDrafter`:
- positions: 1-D RoPE on slot indices (pair i at position i; a compressed token at the index of
  the pair it replaces), also for Qwen2.5-VL, whose target uses M-RoPE;
- attention: grouped-query heads when the config's `num_key_value_heads` says so; the
  layers are EAGLE-1/2 layers (`mmspec/eagle/head.py`: layer 0 without input norm);
- images: maximal runs of image tokens (back-to-back images are one run, one adaptor call, one
  compressed block and one global vector); a run's pairs are dropped, Q - 1 compressed tokens
  take the positions of its last Q - 1 pairs, and the pairs after a run (up to the next one) get
  its global vector through `img_fc`, earlier text zeros;
- embeddings: prompt pairs embed their tokens with the target's embedding (the target's
  `inputs_embeds` shifted by one), the root and every later token with the checkpoint's
  `embed_tokens` (the target's when the checkpoint has none; the authors' code would leave it
  random);
- the input shift, KV cache and tree are EAGLE's (`mmspec/eagle/drafter.py`): entry i pairs the
  target's last hidden state at slot i with the token at slot i + 1, later rounds feed the
  previous root and the accepted tokens with their target hidden states, tree nodes their
  parent's draft output, with the row's last global vector everywhere after the prompt.
The authors' `specgenerate` builds the image mask only for LLaVA-NeXT and Qwen2.5-VL, so a
LLaVA-1.5 prompt there runs the text path; their data generation (`ge_data_all_llava_*`) trains
every LLaVA drafter on the image path, which is what this drafter runs for LLaVA-1.5 too.
Batches of any size work (per-row masks and slot positions, as `EagleDrafter`); the authors' code
runs one row.
"""

from __future__ import annotations

import torch
from torch import nn

from mmspec.decoding.draft import DraftState
from mmspec.eagle.checkpoint import check_state, eagle_config, read_config, read_weights
from mmspec.eagle.drafter import EagleDrafter
from mmspec.eagle.head import EagleConfig
from mmspec.hub import resolve_model

from .adaptor import VisionAdaptor
from .config import ViSpecConfig
from .sequence import prompt_entries
from .targets import adapter_for

EMBED_KEY = "embed_tokens.weight"  # optional: the target's embedding when absent


def is_official_layout(state: dict) -> bool:
    return "imadpt.q" in state


def _module_key(key: str) -> str:
    """The authors' key -> this drafter's (`fc`, `layers` live in the EAGLE head)."""
    if key == "imadpt.q":
        return "imadpt.queries"
    return key if key.startswith(("img_fc.", "imadpt.")) else "head." + key


class OfficialViSpecDrafter(EagleDrafter):
    """An EAGLE-1/2 drafter with ViSpec's image compression and global vector, in the authors'
    semantics (module docstring)."""

    def __init__(self, config: EagleConfig, target, num_queries: int,
                 embed_weight: torch.Tensor | None = None):
        super().__init__(config, target, embed_weight)
        self.adapter = adapter_for(target)
        d = config.hidden_size
        self.img_fc = nn.Linear(2 * d, d, bias=config.fc_bias)  # cnets_ours: same `bias` as fc
        self.imadpt = VisionAdaptor(ViSpecConfig(
            hidden_size=d, num_heads=config.num_heads, head_dim=config.head_dim,
            intermediate_size=config.intermediate_size, vocab_size=config.vocab_size,
            num_queries=num_queries, attention_bias=config.qkv_bias))
        self.num_queries = num_queries
        self._globals: torch.Tensor | None = None  # [B, d] each row's last image vector

    @classmethod
    def from_pretrained(cls, path, target, *, depth: int = 4, top_k: int = 8,
                        total_tokens: int = 30) -> OfficialViSpecDrafter:
        """Load the authors' folder for `target`, in the target's dtype and device. Tree
        defaults: theirs (`top_k=8, depth=3, total_token=30`; depth here counts draft levels,
        their depth + 1)."""
        path = resolve_model(path, "path")
        fields, state = read_config(path), read_weights(path)
        if not is_official_layout(state):
            keys = sorted(state)
            raise ValueError(f"path: the weights in {path} are in no ViSpec layout: expected "
                             f"imadpt.q (the authors' layout) or a vispec_config.json (mmspec's), "
                             f"got keys {keys[:4]}{' ...' if len(keys) > 4 else ''}")
        adapter_for(target)  # TypeError for a class ViSpec does not support
        cfg = eagle_config(fields, state, target, path, depth=depth, top_k=top_k,
                           total_tokens=total_tokens)
        queries = state["imadpt.q"]
        if (queries.ndim != 3 or queries.shape[0] < 2
                or tuple(queries.shape[1:]) != (cfg.num_heads, cfg.head_dim)):
            raise ValueError(f"path: imadpt.q in {path} is {tuple(queries.shape)}, expected "
                             f"[num_q >= 2, num_attention_heads, head_dim] = "
                             f"[num_q, {cfg.num_heads}, {cfg.head_dim}]")
        embed = state.get(EMBED_KEY)
        if embed is not None and tuple(embed.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ValueError(f"path: {EMBED_KEY} in {path} is {tuple(embed.shape)}, expected "
                             f"[vocab_size, hidden_size] = {[cfg.vocab_size, cfg.hidden_size]}")
        drafter = cls(cfg, target, int(queries.shape[0]), embed)
        own = {**{k: v for k, v in drafter.head.state_dict().items()},
               **{f"img_fc.{k}": v for k, v in drafter.img_fc.state_dict().items()},
               **{f"imadpt.{'q' if k == 'queries' else k}": v
                  for k, v in drafter.imadpt.state_dict().items()}}
        weights = {k: v for k, v in state.items() if k != EMBED_KEY}
        check_state(own, weights, path)
        for name, module in (("head", drafter.head), ("img_fc", drafter.img_fc),
                             ("imadpt", drafter.imadpt)):
            module.load_state_dict({key.split(".", 1)[1]: v for key, v in
                                    ((_module_key(k), v) for k, v in weights.items())
                                    if key.split(".", 1)[0] == name})
        weight = target.get_input_embeddings().weight
        return drafter.to(device=weight.device, dtype=weight.dtype)

    def check_inputs(self, model_kwargs: dict) -> None:
        """ValueError naming a processor output the target's class needs with images."""
        self.adapter.check_inputs(model_kwargs)

    # --- the authors' inputs ---

    def _fuse(self, embeds, features, global_vecs):
        """`fc([embed ; img_fc([feature ; global vector])])`, all `[B, N, d]`."""
        hidden = self.img_fc(torch.cat([features, global_vecs], -1))
        return self.head.fc(torch.cat([embeds, hidden], -1))

    def _image_runs(self, input_ids, extras: dict):
        """(features of each run of image tokens `[n, d]`, its (row, slots)), in prompt order:
        the authors find images as runs of the image mask, so back-to-back images are one."""
        dtype = self.embed_weight.dtype
        images = [x.to(dtype) for x in self.adapter.image_features(extras)]
        runs, slots = [], []
        for image, (row, cols) in zip(images, self.adapter.image_slots(
                input_ids, [x.shape[0] for x in images])):
            if slots and slots[-1][0] == row and int(slots[-1][1][-1]) + 1 == int(cols[0]):
                runs[-1] = torch.cat([runs[-1], image])
                slots[-1] = (row, torch.cat([slots[-1][1], cols]))
            else:
                runs.append(image)
                slots.append((row, cols))
        return runs, slots

    def _entry_inputs(self, state: DraftState, valid: torch.Tensor, first: bool):
        if not first:
            tokens, features, entry_valid, positions, last = self._new_entries(state, valid, first)
            embeds = self.embed_weight[tokens]
            b, n = tokens.shape
            x = self._fuse(embeds, features.to(embeds.dtype),
                           self._globals[:, None].expand(b, n, -1))
            return x, embeds, entry_valid, positions, last
        ids = state.input_ids
        b, dtype = ids.shape[0], self.embed_weight.dtype
        positions = (valid.long().cumsum(-1) - 1).clamp_min(0)[:, :-1]  # [B, S-1] slot indices
        runs, slots = self._image_runs(ids, state.extras)
        adapted = self.imadpt(runs) if runs else None  # [K, Q, d]
        entries = prompt_entries(ids, valid, state.target_hidden.to(dtype), positions[None],
                                 self.adapter.embed_weight.to(dtype), runs, adapted, slots,
                                 self.num_queries - 1)
        rows = torch.arange(b, device=ids.device)
        last = entries.last_index
        embeds = entries.embeds.clone()
        embeds[rows, last] = self.embed_weight[ids[:, -1]]  # the root: the checkpoint's embedding
        self._globals = embeds.new_zeros(b, self.config.hidden_size)
        for k, (row, _) in enumerate(slots):
            self._globals[row] = adapted[k, -1]
        x = self._fuse(embeds, entries.features, entries.global_vecs)
        x = torch.where(entries.is_compressed[..., None], entries.compressed, x)
        return x, embeds, entries.valid, entries.positions[0], last

    def _node_inputs(self, tokens: torch.Tensor, features: torch.Tensor):
        embeds = self.embed_weight[tokens]
        b, k = tokens.shape
        return self._fuse(embeds, features, self._globals[:, None].expand(b, k, -1)), embeds

    def end(self) -> None:
        super().end()
        self._globals = None
