"""DiffuSpec's drafter: a diffusion LM drafts a whole block in one pass (Li et al., arXiv 2510.02358,
Findings of ACL 2026). Round t (paper Alg. 1):

1. one bidirectional DLM forward over `[prefix, MASK x k_t]` gives the lattice (`lattice.py`);
2. CPS picks a left-to-right path through it (`cps.py`), scored with a causal proxy
   (`ngram_proxy.py` by default, `lm_proxy.py` for a small causal LM);
3. the engine verifies the path; 4. ADL sets k_{t+1} from the raw draft and the accepted length
   (`adl.py`).

Deliberate differences from the paper:
- Sampling is exact: the path is proposed as a point mass (`probs=None`), i.e. the engine accepts y
  with probability p(y) (reference notes §1.6). The paper's q^L2R rule (Eq. 6: the all-mask lattice
  marginal as q) is `proposal="approximate_l2r"` and is *not* lossless, because CPS picks tokens by
  search rather than sampling them from q (ACL version, App. H.3).
- `return_tree=True` hands all B beams to the engine as one tree.
- Batches: every row has its own ADL controller and n-gram proxy; rows may draft different lengths.
- By default the prompt's KV is not reused: Dream/LLaDA attend bidirectionally to the prefix, so
  its KV changes with the block. `prefix_cache=True` reuses it anyway (Fast-dLLM's approximate
  prefix cache, `lattice.PrefixCache`): each round the DLM runs over the newly committed tokens
  and the block only. Still lossless; the lattice, and so the acceptance rate, can differ slightly.
"""

from __future__ import annotations

import dataclasses

import numbers
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from mmspec.decoding.draft import Draft, Drafter, DraftState, VerifyResult
from mmspec.hub import resolve_model
from .adl import (AdaptiveDraftLength, ADLConfig, FixedDraftLength, generated_length,
                  require_ints, require_types)
from .cps import CausalProxy, CPSConfig, search
from .lattice import Lattice, PrefixCache, build_lattice, build_lattice_cached
from .ngram_proxy import NgramProxy
from .path_tree import paths_to_tree
from .vocab import (check_dlm_width, check_mask_token, drafter_only_ids, logits_width,
                    suppressed_ids, target_width)

PROPOSALS = ("point_mass", "approximate_l2r")


@dataclass(frozen=True)
class DiffusionDrafterConfig:
    shift: bool = True  # Dream's shift prediction (DreamLM/Dream#31); False for LLaDA-style DLMs
    fixed_k: int | None = None  # None: ADL (paper §3.4); an int: fixed-k mode (paper App. C)
    adl: ADLConfig = field(default_factory=ADLConfig)
    cps: CPSConfig | None = field(default_factory=CPSConfig)  # None: the argmax path (naive)
    ngram_order: int = 3  # paper §3.3: a 3-gram proxy
    return_tree: bool = False  # beyond the paper: verify the B beams as one tree
    proposal: str = "point_mass"  # exact; "approximate_l2r" is the paper's rule, approximate
    max_context: int | None = None  # most tokens the DLM sees, block included (Dream: 2048)
    # beyond the paper: reuse the prefix KV between rounds (approximate for a bidirectional DLM,
    # lossless all the same). Rounds whose prefix + block exceed max_context run uncached.
    prefix_cache: bool = False

    def __post_init__(self):
        require_ints(self, "fixed_k", "ngram_order", "max_context")
        require_types(self, shift=bool, return_tree=bool, prefix_cache=bool, proposal=str,
                      adl=ADLConfig, cps=(CPSConfig, type(None)))
        if self.ngram_order < 1:
            raise ValueError(f"ngram_order must be >= 1, got {self.ngram_order}")
        if self.fixed_k is not None and self.fixed_k <= 0:
            raise ValueError(f"draft length k must be > 0, got fixed_k={self.fixed_k}")
        if self.proposal not in PROPOSALS:
            raise ValueError(f"proposal must be one of {PROPOSALS}, got {self.proposal!r}")
        if self.return_tree and self.cps is None:
            raise ValueError("return_tree=True needs CPS (cps=None drafts one argmax path)")
        k_max = self.fixed_k or self.adl.k_max
        if self.max_context is not None and self.max_context <= k_max:
            raise ValueError(f"max_context {self.max_context} must exceed the largest block {k_max}")


def _is_id(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _eos_ids(eos_token_id, target) -> list[int]:
    for source in (getattr(target, "generation_config", None), getattr(target, "config", None),
                   target):
        if eos_token_id is None:
            eos_token_id = getattr(source, "eos_token_id", None)
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, torch.Tensor):
        return eos_token_id.flatten().tolist()
    return list(eos_token_id) if isinstance(eos_token_id, (list, tuple, set)) else [eos_token_id]


class DiffusionDrafter(Drafter):
    """`DiffusionDrafter(model, mask_token_id, target)`: DiffuSpec (CPS + ADL by default).

    model: any HF model returning `.logits` `[B, L, Vd]` (run bidirectionally through a 4-D mask).
    target: the target model, its config, or its logits width (checked against the drafter's).
    eos_token_id: stop id(s) for CPS and ADL; default: the target's `generation_config`/`config`.
        An `eos_token_id` passed to `generate` wins for that call (`DraftState.eos_token_id`).
    tokenizer, target_tokenizer: when both are given, the vocabularies are compared id by id.
    proxy: a zero-argument factory of `CausalProxy` (one per sequence); default: `NgramProxy`.

    After each `propose`, the round can be inspected (from `generate(on_round=...)`; `end()`, which
    `generate` calls when the call is over, drops the lattice and the prefix cache):
    `lattice` (the round's `Lattice`), `paths` (per row, the candidate paths best first; `paths[b][0]`
    is the one drafted) and `generated` (per row, ADL's L_gen); `lengths[b].k` is the next block length.
    """

    def __init__(self, model, mask_token_id: int, target, *, eos_token_id=None, tokenizer=None,
                 target_tokenizer=None, proxy: Callable[[], CausalProxy] | None = None,
                 config: DiffusionDrafterConfig = DiffusionDrafterConfig()):
        if not isinstance(config, DiffusionDrafterConfig):
            raise TypeError(f"config must be a DiffusionDrafterConfig, got {type(config).__name__}")
        if not _is_id(mask_token_id):
            raise TypeError(f"mask_token_id must be an int, got {mask_token_id!r}")
        # a learned position table (GPT-2's n_positions) ends the DLM's context: a longer
        # prefix failed with a bare IndexError inside its embedding
        table = getattr(getattr(model, "config", None), "n_positions", None)
        if config.max_context is None and _is_id(table):
            try:
                config = dataclasses.replace(config, max_context=int(table))
            except ValueError as err:
                raise ValueError(f"model: its {table} learned positions ({err}); a DLM must see "
                                 f"a block and some context") from None
        self.model, self.mask_token_id, self.config = model, int(mask_token_id), config
        self.vocab_size = target_width(target)
        eos_ids = _eos_ids(eos_token_id, target)
        bad = [e for e in eos_ids if not (_is_id(e) and 0 <= e < self.vocab_size)]
        if bad:  # 100 past a 64-token vocabulary failed at the lattice's index, -1 read the last
            raise ValueError(f"eos_token_id: expected ids in the target's vocabulary "
                             f"[0, {self.vocab_size}), got {bad}")
        self.eos_ids = self.default_eos_ids = [int(e) for e in eos_ids]
        width = logits_width(model)
        check_dlm_width(width, self.vocab_size)
        check_mask_token(mask_token_id, width, self.eos_ids)
        extra = []
        if (tokenizer is None) != (target_tokenizer is None):
            raise ValueError("pass both tokenizer and target_tokenizer, or neither")
        if tokenizer is not None:
            extra = drafter_only_ids(tokenizer, target_tokenizer, width)
        self.suppressed = suppressed_ids(mask_token_id, extra)
        self.proxy_factory = proxy or (lambda: NgramProxy(self.vocab_size, config.ngram_order))
        self.prefix = PrefixCache()

    @classmethod
    def from_pretrained(cls, path, target, *, dtype="auto", config: DiffusionDrafterConfig | None
                        = None, **kwargs) -> "DiffusionDrafter":
        """A diffusion LM checkpoint folder as the drafter (`dlm_loading.load_diffusion_lm`:
        Dream without its remote code, or any `AutoModelForCausalLM` folder whose config names
        its `mask_token_id`). The default config takes the checkpoint's shift and context
        (Dream: shift, 2048 tokens); a given `config` is used as is, but must keep the
        checkpoint's shift. Other keywords
        (`eos_token_id`, `tokenizer`, ...) go to the constructor. Move it with `.to(device)`."""
        from .dlm_loading import load_diffusion_lm

        dlm = load_diffusion_lm(resolve_model(path, "path"), dtype)
        if config is None:
            config = DiffusionDrafterConfig(shift=dlm.shift, max_context=dlm.max_context)
        elif config.shift != dlm.shift:
            raise ValueError(f"config.shift={config.shift} but the checkpoint in {path} is "
                             f"trained with shift={dlm.shift}: its lattice would be off by one")
        return cls(dlm.model, dlm.mask_token_id, target, config=config, **kwargs)

    def to(self, device) -> "DiffusionDrafter":
        self.model.to(device)
        return self

    # -- state per sequence ------------------------------------------------------------------
    def _start(self, n: int) -> None:
        """n rows: the engine keeps every row for the whole `generate` call."""
        cfg = self.config
        self.lengths = [FixedDraftLength(cfg.fixed_k) if cfg.fixed_k else
                        AdaptiveDraftLength(cfg.adl) for _ in range(n)]
        self.proxies = [self.proxy_factory() for _ in range(n)] if self._uses_proxy() else []

    def _uses_proxy(self) -> bool:
        return self.config.cps is not None and self.config.cps.lam < 1.0

    # -- one round ---------------------------------------------------------------------------
    def propose(self, state: DraftState) -> Draft:
        valid = state.attention_mask.bool()  # 0 on left padding and on the engine's holes
        self.histories = [row[m] for row, m in zip(state.input_ids, valid)]
        if state.round == 0:  # a new generate call: fresh ADL controllers, proxies and cache
            where = next((p.device for p in self.model.parameters()), None)
            if where is not None and where != state.input_ids.device:
                raise ValueError(f"the diffusion drafter's model is on {where} and the inputs on "
                                 f"{state.input_ids.device}: move it with "
                                 f"drafter.to({str(state.input_ids.device)!r})")
            self._start(len(self.histories))
            self.prefix.reset()
            self.eos_ids = self.default_eos_ids
            if state.eos_token_id is not None:  # the call's own EOS ids win, as in transformers
                if self.mask_token_id in state.eos_token_id:
                    raise ValueError(f"eos_token_id must not include the drafter's mask_token_id "
                                     f"{self.mask_token_id}, got {list(state.eos_token_id)}")
                # an id outside the vocabulary is never produced: it stops nothing (as in
                # target.generate) rather than failing at the lattice's index
                self.eos_ids = [e for e in state.eos_token_id if 0 <= e < self.vocab_size]
        ks = [length.k for length in self.lengths]
        suppressed = self.suppressed.to(state.input_ids.device)
        if self.config.prefix_cache and self._fits_context(state, ks):
            lattice = build_lattice_cached(self.model, self.prefix, state.input_ids,
                                           state.attention_mask, ks, self.mask_token_id,
                                           self.vocab_size, self.config.shift, suppressed)
        else:
            self.prefix.reset()
            lattice = build_lattice(self.model, state.input_ids, self._context_mask(state, ks),
                                    ks, self.mask_token_id, self.vocab_size, self.config.shift,
                                    suppressed)
        broken = lattice.logprobs.isnan().any(-1).any(-1)  # [B]
        if bool(broken.any()):  # NaN/inf logits: every path would score NaN and draft nothing
            raise RuntimeError(
                f"the diffusion LM returned non-finite logits (NaN or inf) for batch rows "
                f"{broken.nonzero().flatten().tolist()} in round {state.round}: its dtype may "
                f"overflow (float16: load it in bfloat16 or float32) or its weights are broken")
        raw = lattice.argmax().tolist()  # [B, K]
        self.generated = [generated_length(raw[b][:k], self.eos_ids) for b, k in enumerate(ks)]
        depth = [min(k, state.max_tokens) for k in ks]  # deeper nodes could not be committed
        paths = [self._row_paths(lattice.logprobs[b, :d], b) for b, d in enumerate(depth)]
        self.lattice, self.paths = lattice, paths
        return self._to_draft(paths, lattice)

    def update(self, result: VerifyResult) -> None:
        for length, gen, acc in zip(self.lengths, self.generated, result.num_accepted.tolist()):
            length.update(gen, acc)

    def end(self) -> None:
        """The call is over: drop its tensors (prefix KV, lattice, proxies' state)."""
        self.prefix.reset()
        self.lattice = self.histories = None
        self.proxies = []

    def _fits_context(self, state: DraftState, ks: list[int]) -> bool:
        limit = self.config.max_context
        return limit is None or int(state.attention_mask.sum(-1).max()) + max(ks) <= limit

    def _context_mask(self, state: DraftState, ks: list[int]) -> torch.Tensor:
        """Hide the oldest prefix tokens so prefix + block fits `max_context`."""
        mask = state.attention_mask
        if self.config.max_context is None:
            return mask
        keep = self.config.max_context - max(ks)
        mask = mask.clone()
        mask[mask.flip(-1).cumsum(-1).flip(-1) > keep] = 0  # count valid tokens from the right
        return mask

    def _row_paths(self, logprobs: torch.Tensor, b: int) -> list[list[int]]:
        """Candidate paths of one row, best first (one path unless `return_tree`)."""
        cfg = self.config
        if cfg.cps is None:
            path = logprobs.argmax(-1).tolist()
            stop = generated_length(path, self.eos_ids)
            return [path[:stop + 1]]  # through the first EOS
        proxy = self.proxies[b] if self.proxies else None
        if proxy is not None:
            proxy.begin(self.histories[b].cpu())
        beams = search(logprobs, cfg.cps, self.eos_ids, proxy)
        return [beam.tokens for beam in (beams if cfg.return_tree else beams[:1])]

    def _to_draft(self, paths: list[list[list[int]]], lattice: Lattice) -> Draft:
        """Rows of paths -> one `Draft` `[B, T]`, ragged rows padded (token 0, parent -1)."""
        trees = [paths_to_tree(row) for row in paths]
        counts = [len(tokens) for tokens, _, _ in trees]
        width = max(counts)
        device = lattice.logprobs.device
        tokens = torch.zeros(len(trees), width, dtype=torch.long, device=device)
        parents = torch.full_like(tokens, -1)
        depths = torch.zeros_like(tokens)
        for b, (tok, par, dep) in enumerate(trees):
            tokens[b, :len(tok)] = torch.tensor(tok)
            parents[b, :len(par)] = torch.tensor(par)
            depths[b, :len(dep)] = torch.tensor(dep)
        probs = None
        if self.config.proposal == "approximate_l2r":  # q^L2R of node i = lattice at its depth
            probs = lattice.logprobs.gather(
                1, depths[:, :, None].expand(-1, -1, lattice.logprobs.shape[-1])).exp()
        num_tokens = None
        if len(set(counts)) > 1:
            num_tokens = torch.tensor(counts, device=device)
        if not self.config.return_tree:
            return Draft.chain(tokens, probs, num_tokens)
        return Draft(tokens, parents, probs, num_tokens)


class NaiveDiffusionDrafter(DiffusionDrafter):
    """The baseline: the DLM's argmax path (through the first EOS) at a fixed k, no CPS, no ADL.

    `config` (as `from_pretrained` passes it, with the checkpoint's shift and context) keeps its
    other fields; `k` and the argmax path replace its `fixed_k` and `cps`, and its `shift`
    replaces the `shift` argument."""

    def __init__(self, model, mask_token_id: int, target, *, k: int = 20, shift: bool = True,
                 config: DiffusionDrafterConfig | None = None, **kwargs):
        if k is None:  # fixed_k=None is ADL: not the baseline this class is
            raise ValueError("NaiveDiffusionDrafter: k must be an int > 0 (the fixed block "
                             "length), got None")
        if config is None:
            config = DiffusionDrafterConfig(shift=shift, fixed_k=k, cps=None)
        else:  # from_pretrained: the checkpoint's shift and max_context
            config = dataclasses.replace(config, fixed_k=k, cps=None)
        super().__init__(model, mask_token_id, target, config=config, **kwargs)
