"""CPS's alternative causal proxy: any small causal LM sharing the target's token ids (DiffuSpec §3.3
notes that a tiny causal LM can replace the n-gram).

`begin(history)` runs the LM over the prefix once per round and keeps its KV cache; every beam
depth then runs only the beam paths `[n, d]` on a copy of that cache.
"""

from __future__ import annotations

import copy

import torch

from mmspec._cache_name import cache_kwargs, output_cache


class CausalLMProxy:
    """Proxy for one sequence; build one per row, e.g. `proxy=lambda: CausalLMProxy(small_lm)`."""

    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def begin(self, history: torch.Tensor) -> None:
        device = next(self.model.parameters()).device
        rows = self.model.get_input_embeddings().num_embeddings
        # a narrower LM than the target: an id it lacks reads as its last one (a rough proxy);
        # clamped unconditionally, not after a host sync to ask whether any id is that wide
        history = history.clamp_max(rows - 1)
        out = self.model(input_ids=history[None].to(device), use_cache=True)
        self.cache = output_cache(out)
        self.last = torch.log_softmax(out.logits[0, -1].float(), -1)  # [V_lm]

    @torch.no_grad()
    def score(self, paths: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """paths `[n, d]`, candidates `[C]` -> log-probs `[n, C]` (-inf past the LM's vocab)."""
        n = paths.shape[0]
        if paths.shape[1] == 0:
            logp = self.last[None].expand(n, -1)  # [n, V_lm]
        else:
            cache = copy.deepcopy(self.cache)
            cache.batch_repeat_interleave(n)
            rows = self.model.get_input_embeddings().num_embeddings
            logits = self.model(input_ids=paths.clamp_max(rows - 1).to(self.last.device),
                                **cache_kwargs(self.model.forward, cache),
                                use_cache=True).logits[:, -1]
            logp = torch.log_softmax(logits.float(), -1)  # [n, V_lm]
        inside = candidates < logp.shape[-1]
        out = torch.full((n, candidates.numel()), float("-inf"), device=logp.device)
        out[:, inside] = logp[:, candidates[inside].to(logp.device)]
        return out.cpu()
