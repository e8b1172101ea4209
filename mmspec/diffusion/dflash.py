"""`DFlashDrafter`: DFlash / DFlash2 block-diffusion drafters (z-lab/dflash) on mmspec's engine.

    drafter = mmspec.DFlashDrafter.from_pretrained("Qwen3-8B-DFlash-b16", target)
    out = mmspec.generate(target, drafter, input_ids, max_new_tokens=256)

One draft pass per round (`dflash_model.py`): the block is the root (the last committed token)
and mask tokens after it; the context is the target's chosen hidden layers at every committed
slot before the root, which the engine hands over (`needs_target_hidden`, `target_hidden_layers`)
and which is projected once per slot into each layer's keys and values and kept for the call.
DFlash drafts the argmax of every block position (the reference `dflash_generate`'s greedy draft);
DFlash2 walks its candidate selector. Under a sampling call the drafts are sampled (DFlash: from
the call's warped distribution per position, as the reference's `_sampling_probs`; DFlash2: from
the selector's scores at temperature) and their probabilities go to the acceptance rule. The
block shrinks near `max_new_tokens` as the reference's `verify_size` does (the block's rows see
each other, so its length changes the draft).

Deliberate differences from `dflash_generate`: any batch (ragged rows, left padding, holes), the
engine's verification (trees, transformers' logits processors and stopping criteria), and the
top-p tie rule of transformers' `TopPLogitsWarper` (the target's own) under sampling.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from mmspec.decoding.draft import Draft, Drafter, DraftState, VerifyResult, require_bound_target
from mmspec.decoding.sampling import target_probs
from mmspec.hub import resolve_model

from .cps import CPSConfig, search
from .dflash_checkpoint import check_fits, dflash_config, load_weights, read_config, read_weights
from .dflash_model import DFlashConfig, DFlashModel, qwen3_config
from .dflash_speculators import is_speculators, read_speculators, write_speculators
from .ngram_proxy import NgramProxy
from .path_tree import paths_to_tree


@dataclass
class _Context:
    kv: list  # per layer (k, v) `[B, Hkv, C, D]`
    positions: torch.Tensor  # long `[B, C]`
    valid: torch.Tensor  # bool `[B, C]`

    @property
    def num_slots(self) -> int:
        return self.positions.shape[1]


class DFlashDrafter(nn.Module, Drafter):
    needs_target_hidden = True

    def __init__(self, model: DFlashModel, target, raw_config: dict,
                 path_search: CPSConfig | None = None):
        super().__init__()
        if path_search is not None and model.dflash.is_dflash2:
            raise ValueError("path_search: DFlash2 walks its own candidate selector; path search "
                             "applies to DFlash (DFlashDraftModel) blocks")
        self.model = model
        self.raw_config = raw_config  # config.json as read (or written by `save_pretrained`)
        self.path_search = path_search
        # not a submodule: the drafter's .to(), .train() and state_dict leave the target alone
        object.__setattr__(self, "target", target)
        self._context: _Context | None = None
        self._proxies: list = []

    @property
    def config(self) -> DFlashConfig:
        return self.model.dflash

    @property
    def target_hidden_layers(self) -> tuple:
        # entry 0 of transformers' hidden_states is the embedding output (the reference's offset)
        return tuple(i + 1 for i in self.config.target_layer_ids)

    @property
    def target_hidden_size(self) -> int:
        # each layer's share of the context projection `fc` (the target's hidden size)
        return self.model.fc.in_features // len(self.config.target_layer_ids)

    @classmethod
    def from_pretrained(cls, path, target, path_search: CPSConfig | None = None) -> DFlashDrafter:
        """Load a DFlash or DFlash2 checkpoint folder for `target`, in the target's dtype and
        device. The folder must have been made for this target (its layers and hidden size).
        `path`: a folder, a zoo entry name or a hub id (`mmspec.hub.resolve_model`).
        `path_search`: draft a tree instead of the chain (`_search_tree`). A folder in vLLM's
        speculators layout (`save_pretrained(format="speculators")`) is read as well."""
        path = resolve_model(path, "path")
        if is_speculators(path):
            state = read_weights(path)
            raw = read_speculators(path, state, target)
        else:
            raw, state = read_config(path), None
        cfg = dflash_config(raw, path)
        check_fits(raw, cfg, target, path)
        state = read_weights(path) if state is None else state
        model = DFlashModel(qwen3_config(raw), cfg)
        load_weights(model, state, path)
        weight = target.get_input_embeddings().weight
        return cls(model.eval(), target, raw, path_search).to(device=weight.device,
                                                              dtype=weight.dtype)

    def save_pretrained(self, path, dtype: torch.dtype | None = None, format: str = "dflash",
                        verifier: str | None = None) -> Path:
        """Write config.json and model.safetensors to the folder `path`, both of which
        `from_pretrained` reads back. format "dflash": the authors' layout (what their
        `DFlashDraftModel.from_pretrained` reads); "speculators": vLLM's speculators layout
        (`dflash_speculators`, speculators 0.9.0), with `verifier` (default: the target's
        `name_or_path`) recorded as the target `vllm serve` loads. dtype: the weights' dtype on
        disk (None: the drafter's)."""
        if format not in ("dflash", "speculators"):
            raise ValueError(f"format must be 'dflash' or 'speculators', got {format!r}")
        if format == "speculators":
            verifier = verifier or getattr(self.target.config, "name_or_path", "") or None
            return write_speculators(self, path, verifier, dtype)
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(dtype or v.dtype).contiguous().cpu()
                 for k, v in self.model.weights().items()}
        save_file(state, str(path / "model.safetensors"))
        raw = {**self.raw_config, "dtype": str(dtype or self.model.fc.weight.dtype)[6:]}
        (path / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
        return path

    def check_target(self, target) -> None:
        """ValueError unless `target` is the model this drafter was loaded for (its embedding,
        LM head and hidden layers are that model's)."""
        require_bound_target(self, target)

    # --- the drafter contract ---

    def propose(self, state: DraftState) -> Draft:
        if state.target_hidden is None:
            raise ValueError("state.target_hidden is None: DFlashDrafter needs the target's "
                             "hidden states (it sets needs_target_hidden = True)")
        with torch.no_grad():
            valid = state.attention_mask.bool()
            positions = (valid.long().cumsum(-1) - 1).clamp_min(0)  # [B, S]
            self._extend_context(state, valid, positions)
            # block rows: the reference's verify_size, whose last row is the last token the
            # row may emit (the engine drops it as a draft; the rows see each other, so it stays)
            n = 1 + min(self.config.block_size - 1, state.max_tokens + 1)
            hidden = self._block(state.input_ids[:, -1], positions[:, -1], n)  # [B, n, H]
            logits = self.model.logits(hidden[:, 1:], self.target.get_output_embeddings())
            if self.path_search is not None:
                return self._search_tree(logits, state)
            if self.config.is_dflash2:
                tokens, probs = self._select(logits, hidden[:, 1:], state)
            elif state.sampling is not None:
                probs = target_probs(logits, state.sampling)  # [B, T, V]
                tokens = torch.multinomial(probs.flatten(0, 1), 1, generator=state.generator)
                tokens = tokens.view(probs.shape[:2])
            else:
                tokens, probs = logits.argmax(-1), None
            return Draft.chain(tokens, probs)

    def update(self, result: VerifyResult) -> None:
        """Nothing to do: the next `DraftState` carries the committed slots and their features."""

    def end(self) -> None:
        """The `generate` call is over: drop its context keys and values and n-gram proxies."""
        self._context, self._proxies = None, []

    # --- the pieces ---

    def _extend_context(self, state: DraftState, valid, positions) -> None:
        """Project the features of the slots committed since the last round (all but the root)
        into the context: `state.target_hidden` `[B, S - 1 - C, F]` for slots [C, S - 1)."""
        s = state.input_ids.shape[1]
        if state.round == 0 or self._context is None:
            b = valid.shape[0]
            self._context = _Context([], positions.new_zeros(b, 0), valid.new_zeros(b, 0))
        ctx, features = self._context, state.target_hidden
        width = self.model.fc.in_features
        if features.dim() != 3 or features.shape[-1] != width:
            raise ValueError(f"state.target_hidden is {list(features.shape)}, expected [batch, "
                             f"slots, {width}]: the target's hidden states at layers "
                             f"{list(self.config.target_layer_ids)} are not [batch, slots, "
                             f"hidden_size] tensors ({type(self.target).__name__})")
        if features.shape[1] != s - 1 - ctx.num_slots:
            raise ValueError(f"state.target_hidden covers {features.shape[1]} slots, expected "
                             f"{s - 1 - ctx.num_slots} (the slots committed since the last round)")
        new_pos, new_valid = positions[:, ctx.num_slots: s - 1], valid[:, ctx.num_slots: s - 1]
        dtype = self.model.fc.weight.dtype
        kv = self.model.context_kv(features.to(dtype), new_pos)
        ctx.kv = kv if not ctx.kv else [(torch.cat([k0, k1], 2), torch.cat([v0, v1], 2))
                                        for (k0, v0), (k1, v1) in zip(ctx.kv, kv)]
        ctx.positions = torch.cat([ctx.positions, new_pos], 1)
        ctx.valid = torch.cat([ctx.valid, new_valid], 1)

    def _block(self, root: torch.Tensor, root_pos: torch.Tensor, n: int) -> torch.Tensor:
        """root `[B]`, root_pos `[B]` -> the draft's hidden states of the n block rows."""
        ids = torch.full((root.shape[0], n), self.config.mask_token_id, device=root.device)
        ids[:, 0] = root
        embed = self.target.get_input_embeddings().weight
        noise = F.embedding(ids, embed) * self.config.input_embedding_scale  # [B, n, H]
        block_pos = root_pos[:, None] + torch.arange(n, device=root.device)  # [B, n]
        ctx = self._context
        masks = self.model.masks(block_pos, ctx.positions, ctx.valid)
        return self.model(noise.to(self.model.fc.weight.dtype), block_pos, ctx.kv, masks)

    def _select(self, logits, hidden, state: DraftState):
        """DFlash2's candidate walk: tokens `[B, T]`, probs `[B, T, V]` when sampling."""
        selector = self.model.candidate_selector
        unary, ids, projected = selector.candidates(logits, hidden)  # [B, T, k] x2, [B, T, r]
        previous, tokens, probs = state.input_ids[:, -1], [], []
        for t in range(ids.shape[1]):
            scores = selector.scores(unary[:, t], ids[:, t], projected[:, t], previous)  # [B, k]
            if state.sampling is not None:
                q = (scores.float() / state.sampling.temperature).softmax(-1)
                pick = torch.multinomial(q, 1, generator=state.generator)[:, 0]
                full = torch.zeros_like(logits[:, t], dtype=q.dtype)  # [B, V]
                probs.append(full.scatter(-1, ids[:, t], q))
            else:
                pick = scores.argmax(-1)
            previous = ids[:, t].gather(1, pick[:, None])[:, 0]
            tokens.append(previous)
        return torch.stack(tokens, 1), (torch.stack(probs, 1) if probs else None)

    def _search_tree(self, logits: torch.Tensor, state: DraftState) -> Draft:
        """Beyond the reference: DiffuSpec's causal path search (`cps.py`) over the block's
        per-position distributions, scored with an n-gram proxy of each row's own text, its
        beams and the argmax chain merged into one tree (`path_tree.py`) that the engine
        verifies in one pass. Nodes are chosen, not sampled: a point-mass proposal."""
        logprobs = logits.float().log_softmax(-1).cpu()  # [B, T, V]
        b, _, vocab = logprobs.shape
        if state.round == 0 or len(self._proxies) != b:
            self._proxies = [NgramProxy(vocab, 3) for _ in range(b)]  # paper §3.3: a 3-gram
        eos = list(state.eos_token_id if state.eos_token_id is not None else
                   _eos_ids(self.target))
        valid = state.attention_mask.bool().cpu()
        trees = []
        for row in range(b):
            self._proxies[row].begin(state.input_ids[row].cpu()[valid[row]])
            beams = search(logprobs[row], self.path_search, eos, self._proxies[row])
            trees.append(paths_to_tree([logprobs[row].argmax(-1).tolist()]
                                       + [beam.tokens for beam in beams]))
        width = max(len(tokens) for tokens, _, _ in trees)
        tokens = torch.zeros(b, width, dtype=torch.long)
        parents = torch.full((b, width), -1, dtype=torch.long)
        for row, (tok, par, _) in enumerate(trees):
            tokens[row, :len(tok)], parents[row, :len(par)] = torch.tensor(tok), torch.tensor(par)
        counts = torch.tensor([len(tok) for tok, _, _ in trees])
        return Draft(tokens.to(logits.device), parents, None,
                     None if bool((counts == width).all()) else counts.to(logits.device))


def _eos_ids(target) -> list[int]:
    eos = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
