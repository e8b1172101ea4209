"""`EagleDrafter`: SafeAILab EAGLE-1/2 and EAGLE-3 checkpoints as mmspec drafters.

    drafter = EagleDrafter.from_pretrained("EAGLE3-LLaMA3.1-Instruct-8B", target, top_k=8)
    out = mmspec.generate(target, drafter, input_ids, max_new_tokens=256)

The head (`head.py`) follows the reference forward (SafeAILab/EAGLE `cnets1.py`,
`cnets.py`, `ea_model.py`, `utils.py`):
- input shift: draft entry i pairs the target's feature at slot i with the token at slot i + 1 and
  sits at position i (the reference's `input_ids[:, 1:]` against `hidden_states`); its output
  predicts the token at i + 2;
- round 0 feeds the prompt, later rounds the previous root and the accepted tokens with the
  target's features of those slots; the draft KV cache keeps only committed entries (the
  reference's `stable_kv`), tree nodes live in a temporary list dropped after the round;
- a tree node feeds its parent's draft output `h` (not the target's feature) with its own token,
  at position root + depth: EAGLE-1/2 through `fc` with the embedding, EAGLE-3 straight into
  `midlayer` (no `fc`);
- EAGLE-3 features: the target's `hidden_states` entries 2, L // 2, L - 3 (`checkpoint.py`),
  the draft vocabulary mapped back with `d2t`.
The tree is EAGLE-2's dynamic tree (`mmspec.decoding.dynamic_tree`, shared with ViSpec and
`ModelDrafter`), verified by `mmspec.generate`; each tree level attends through the shared
block-sparse layer where that is not slower (off a CPU; `tree_attention.py`).

Deliberate differences from the reference: any batch size (ragged rows, holes of rejected tokens
masked, positions counted over each row's valid slots), ties in the final node pick broken toward
the parent (`dynamic_tree.py`), `depth` counts draft levels (the reference's `depth` + 1, as
everywhere in mmspec), and the checks of `checkpoint.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from mmspec.decoding.draft import Draft, Drafter, DraftState, VerifyResult, require_bound_target
from mmspec.decoding.dynamic_tree import dynamic_tree
from mmspec.hub import resolve_model

from .checkpoint import OPTIONAL_KEYS, check_state, eagle_config, read_config, read_weights
from .draft_kv import TreeKV, append_kv
from .head import EagleConfig, EagleHead
from .speculators import is_speculators, read_speculators, write_speculators
from .tree_attention import level_mask


@dataclass
class _DraftCache:
    kv: list  # per layer (k, v) `[B, Hkv, P, Dh]`
    valid: torch.Tensor  # bool `[B, P]`
    num_slots: int  # DraftState.input_ids columns already paired into entries (+ the root)


class EagleDrafter(nn.Module, Drafter):
    needs_target_hidden = True

    def __init__(self, config: EagleConfig, target, embed_weight: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        # not a submodule: the drafter's .float(), .train() and state_dict leave the target alone
        object.__setattr__(self, "target", target)
        self.head = EagleHead(config)
        embed = target.get_input_embeddings().weight if embed_weight is None else embed_weight
        # frozen, the target's unless the checkpoint has its own; not part of the head's weights
        self.register_buffer("embed_weight", embed.detach(), persistent=False)
        self.register_buffer("lm_head_weight", target.get_output_embeddings().weight.detach(),
                             persistent=False)
        self._cache: _DraftCache | None = None

    @property
    def target_hidden_layers(self) -> tuple:
        return self.config.feature_layers

    @property
    def target_hidden_size(self) -> int:
        return self.config.target_hidden_size

    @classmethod
    def from_pretrained(cls, path, target, *, depth: int = 8, top_k: int = 10,
                        total_tokens: int = 60) -> EagleDrafter:
        """Load a SafeAILab EAGLE-1/2 or EAGLE-3 folder (config.json + model.safetensors or
        pytorch_model.bin), or an EAGLE-3 folder in the speculators format (its config.json has
        `speculators_model_type`; `speculators.py`), for `target`, in the target's dtype
        and device.

        depth: draft levels (the reference's `depth` + 1); top_k: children per frontier node and
        frontier width; total_tokens: tree nodes counting the root. Defaults: ea_model.py's
        (total_token=60, depth=7, top_k=10), sized for a GPU; on a CPU smaller trees are faster.
        """
        path = resolve_model(path, "path")
        fields, state = read_config(path), read_weights(path)
        feature_layers = None
        if is_speculators(fields):
            fields, state, feature_layers = read_speculators(fields, state, path)
        cfg = eagle_config(fields, state, target, path, feature_layers, depth=depth, top_k=top_k,
                           total_tokens=total_tokens)
        embed = state.get("embed_tokens.weight")
        if embed is not None and tuple(embed.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ValueError(f"path: embed_tokens.weight in {path} is {tuple(embed.shape)}, "
                             f"expected [vocab_size, hidden_size] = "
                             f"{[cfg.vocab_size, cfg.hidden_size]}")
        drafter = cls(cfg, target, embed)
        own = drafter.head.state_dict()
        # the reference drops d2t/t2d when the vocabularies are equal; they are identities then
        weights = {k: v for k, v in state.items()
                   if k not in OPTIONAL_KEYS and (k in own or k != "d2t")}
        check_state(own, weights, path)
        drafter.head.load_state_dict(weights)
        if hasattr(drafter.head, "d2t"):
            ids = torch.arange(cfg.draft_vocab_size) + drafter.head.d2t
            vocab = drafter.lm_head_weight.shape[0]
            if bool(((ids < 0) | (ids >= vocab)).any()):
                raise ValueError(f"path: d2t in {path} maps draft ids to "
                                 f"[{int(ids.min())}, {int(ids.max())}], outside the target's "
                                 f"vocabulary [0, {vocab})")
        weight = target.get_input_embeddings().weight
        return drafter.to(device=weight.device, dtype=weight.dtype)

    def save_pretrained(self, path, format: str = "speculators", *,
                        verifier: str | None = None, embedding: bool = True,
                        dtype: torch.dtype | None = None) -> Path:
        """Write this EAGLE-3 drafter to the folder `path` in the speculators format, which
        `vllm serve PATH` serves and `EagleDrafter.from_pretrained` loads back.

        verifier: the target's Hugging Face id or path, recorded as the verifier vLLM loads;
        default the target's `name_or_path` (None when it has none).
        embedding: write `embed_tokens.weight` (the target's, frozen). False leaves it out, as
        SafeAILab's EAGLE-3 checkpoints do (their loader takes the target's), for a smaller
        folder that `from_pretrained` binds to the target's embedding (the zoo's entries).
        dtype: the weights' dtype on disk (default: the drafter's)."""
        if format != "speculators":
            raise ValueError(f"format must be 'speculators', got {format!r}")
        if verifier is None:
            verifier = getattr(self.target.config, "name_or_path", "") or None
        return write_speculators(self, path, verifier, embedding=embedding, dtype=dtype)

    # --- the drafter contract ---

    def check_target(self, target) -> None:
        """ValueError unless `target` is the model this drafter was loaded for (its embeddings,
        lm_head and feature layers are that model's)."""
        require_bound_target(self, target)

    def propose(self, state: DraftState) -> Draft:
        if state.target_hidden is None:
            raise ValueError("state.target_hidden is None: EagleDrafter needs the target's hidden "
                             "states (it sets needs_target_hidden = True)")
        with torch.no_grad():
            valid = state.attention_mask.bool()
            root_pos = valid.long().sum(-1) - 1  # [B] the root's position
            first = state.round == 0 or self._cache is None
            if first:
                empty = torch.zeros(valid.shape[0], 0, dtype=torch.bool, device=valid.device)
                self._cache = _DraftCache([], empty, 0)
            x, embeds, entry_valid, positions, last = self._entry_inputs(state, valid, first)
            b, n = entry_valid.shape
            eye = torch.eye(n, dtype=torch.bool, device=x.device)
            mask = (torch.ones_like(eye).tril() & entry_valid[:, None, :]) | eye
            cache = self._cache
            if cache.kv:
                mask = torch.cat([cache.valid[:, None, :].expand(b, n, -1), mask], 2)
            hidden, new_kv = self.head(x, embeds, positions, cache.kv or None, mask)
            cache.kv = append_kv(cache.kv, new_kv)
            cache.valid = torch.cat([cache.valid, entry_valid], 1)
            cache.num_slots = state.input_ids.shape[1]
            root_feature = hidden[torch.arange(b, device=x.device), last]  # [B, d]
            levels = min(self.config.depth, state.max_tokens)
            draft = dynamic_tree(self._tree_step(root_pos),
                                 self.head.draft_logits(root_feature, self.lm_head_weight),
                                 root_feature, self.config.top_k, levels, self.config.draft_nodes)
            return Draft(self.head.target_ids(draft.tokens), draft.parents)

    def update(self, result: VerifyResult) -> None:
        """Nothing to do: the next `DraftState` carries the committed tokens and their features."""

    def end(self) -> None:
        """The `generate` call is over: drop its draft KV cache."""
        self._cache = None

    def _entry_inputs(self, state: DraftState, valid: torch.Tensor, first: bool):
        """The first layer's input for the entries committed since the last round (the prompt
        when `first`): x and embeds `[B, N, d]`, valid bool `[B, N]`, positions long `[B, N]`,
        each row's last entry `[B]`."""
        tokens, features, entry_valid, positions, last = self._new_entries(state, valid, first)
        embeds = self.embed_weight[tokens]
        x = self.head.layer_input(embeds, features.to(embeds.dtype), from_target=True)
        return x, embeds, entry_valid, positions, last

    def _node_inputs(self, tokens: torch.Tensor, features: torch.Tensor):
        """A tree level's input: tokens `[B, K]` (draft ids), features `[B, K, d]` (the parents'
        draft outputs) -> x and embeds `[B, K, d]`."""
        embeds = self.embed_weight[self.head.target_ids(tokens)]
        return self.head.layer_input(embeds, features, from_target=False), embeds

    def _new_entries(self, state: DraftState, valid: torch.Tensor, first: bool):
        """The entries committed since the last round: tokens long `[B, N]`, target features
        `[B, N, F]`, valid bool `[B, N]`, positions long `[B, N]`, each row's last entry `[B]`."""
        ids, hidden = state.input_ids, state.target_hidden
        b, s = ids.shape
        if first:
            # slot layout: entry i = (feature of slot i, token of slot i + 1), at slot i's position
            positions = (valid.long().cumsum(-1) - 1).clamp_min(0)[:, :-1]
            last = torch.full((b,), s - 2, dtype=torch.long, device=ids.device)
            return ids[:, 1:], hidden, valid[:, :-1] & valid[:, 1:], positions, last
        start = self._cache.num_slots
        new_ids, new_valid = ids[:, start:], valid[:, start:]  # [B, K]: accepted (holes), bonus
        k = new_ids.shape[1]
        # hidden: the previous root and the accepted tokens, right-padded; pair them with the
        # committed tokens after each, compacted the same way
        order = torch.argsort((~new_valid).to(torch.int8), dim=1, stable=True)
        count = new_valid.sum(1)  # [B]
        steps = torch.arange(k, device=ids.device)
        prev_root = valid[:, :start].long().sum(-1, keepdim=True) - 1  # [B, 1]
        return (new_ids.gather(1, order), hidden, steps < count[:, None], prev_root + steps,
                (count - 1).clamp_min(0))

    def _tree_step(self, root_pos: torch.Tensor):
        """The `step` of `dynamic_tree`: frontier nodes over the draft cache + tree nodes."""
        cache = self._cache
        tree_kv = TreeKV(cache.kv)

        def step(tokens, features, depth, ancestors):
            b, k = tokens.shape
            x, embeds = self._node_inputs(tokens, features)
            eye = torch.eye(k, dtype=torch.bool, device=tokens.device).expand(b, k, k)
            attends = torch.cat([cache.valid[:, None, :].expand(b, k, -1), ancestors, eye], 2)
            mask = level_mask(attends)  # the shared block-sparse layer where not slower
            positions = (root_pos[:, None] + depth).expand(b, k)
            hidden, new_kv = self.head(x, embeds, positions, tree_kv.past(), mask)
            tree_kv.add(new_kv)
            return self.head.draft_logits(hidden, self.lm_head_weight), hidden

        return step
