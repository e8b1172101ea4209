"""EAGLE-2's dynamic draft tree (Li et al. 2024, "EAGLE-2"; `vispec.md` §1.5), batched over rows.

The one tree builder of mmspec: `ModelDrafter`, `ViSpecDrafter` and `EagleDrafter` (and the
ViSpec authors' drafter through it) differ only in the `step` they pass, one drafter forward
over a tree level.

    level 0: the top_k children of the root, scored by their draft log-probability
    level l: every frontier node proposes top_k children (cumulative log-prob = parent + own);
             the top_k of those k*k candidates form the next frontier
    finally: the best `num_nodes` candidates over all levels, by cumulative score

This is SafeAILab/EAGLE's `topK_genrate` (`cnets.py`), row by row. One deliberate difference:
the final pick sorts stably over candidates in level order, where the reference takes `topk`.
A child's score never exceeds its parent's (log-probs are <= 0), so on a tie the parent, always
the earlier candidate, ranks first and the kept set is always a tree; the reference can keep an
orphan on an exact tie.
The nodes are chosen, not sampled, so the draft has no `probs` (a point-mass proposal): the
engine's verification stays exact for sampling too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .draft import Draft


def dynamic_tree(step: Callable, root_logits: torch.Tensor, root_feature: torch.Tensor | None,
                 top_k: int, levels: int, num_nodes: int) -> Draft:
    """Grow a tree below every row's root.

    step(tokens long `[B, k]`, features `[B, k, d]` or None, depth int, ancestors bool
        `[B, k, T]`) -> (logits `[B, k, V]`, features `[B, k, d]` or None): one drafter forward
        over the frontier at tree depth `depth` (0 for the root's children), where `ancestors`
        marks, among the T frontier entries of earlier calls (in call order), the ones each
        frontier node descends from.
    root_logits `[B, V]`: the drafter's prediction at the root; root_feature `[B, d]`: what the
        root hands its children (EAGLE's draft output), None for a drafter that keeps its own
        state (`ModelDrafter`'s KV cache).
    """
    b = root_logits.shape[0]
    device = root_logits.device
    k = min(top_k, root_logits.shape[-1])
    top = torch.log_softmax(root_logits.float(), -1).topk(k)
    tokens, scores = top.indices, top.values  # frontier [B, k]
    ids = torch.arange(k, device=device).expand(b, k)  # frontier's candidate ids
    features = None if root_feature is None else root_feature[:, None].expand(b, k, -1)
    ancestors = torch.zeros(b, k, 0, dtype=torch.bool, device=device)
    cand_tokens, cand_scores, cand_parents = [tokens], [scores], [torch.full_like(tokens, -1)]
    n_cand = k
    eye = torch.eye(k, dtype=torch.bool, device=device).expand(b, k, k)
    for depth in range(levels - 1):
        logits, out = step(tokens, features, depth, ancestors)
        top = torch.log_softmax(logits.float(), -1).topk(k)  # [B, k, k]
        child_scores = (scores[..., None] + top.values).flatten(1)  # [B, k*k]
        child_tokens = top.indices.flatten(1)
        child_parents = ids[..., None].expand(b, k, k).flatten(1)
        cand_tokens.append(child_tokens)
        cand_scores.append(child_scores)
        cand_parents.append(child_parents)
        pick = child_scores.topk(k).indices  # [B, k] among this level's candidates
        from_node = pick // k  # [B, k] index into the old frontier
        tokens = child_tokens.gather(1, pick)
        scores = child_scores.gather(1, pick)
        features = None if out is None else out.gather(
            1, from_node[..., None].expand(-1, -1, out.shape[-1]))
        ancestors = torch.cat([ancestors, eye], 2).gather(
            1, from_node[..., None].expand(-1, -1, ancestors.shape[2] + k))
        ids = n_cand + pick
        n_cand += k * k
    return _select(torch.cat(cand_tokens, 1), torch.cat(cand_scores, 1),
                   torch.cat(cand_parents, 1), num_nodes)


def _select(tokens, scores, parents, num_nodes) -> Draft:
    """Keep the best `num_nodes` candidates `[B, C]`; re-index parents into the kept list."""
    b, c = tokens.shape
    n = min(num_nodes, c)
    best = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :n]
    kept = best.sort(1).values  # [B, n] candidate ids in level order: parents first
    new_index = torch.full((b, c + 1), -1, dtype=torch.long, device=tokens.device)
    new_index.scatter_(1, kept, torch.arange(n, device=tokens.device).expand(b, n))
    kept_parents = parents.gather(1, kept)  # [B, n] candidate ids, -1 for the root
    new_parents = new_index.gather(1, torch.where(kept_parents < 0, c, kept_parents))
    return Draft(tokens=tokens.gather(1, kept), parents=new_parents)
