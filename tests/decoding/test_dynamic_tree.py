"""EAGLE-2 dynamic tree: the kept nodes are the best by cumulative log-probability, as a tree.

One builder serves every tree drafter: `ModelDrafter` here, ViSpec and EAGLE in
tests/vision and tests/eagle."""

import torch
from spec_helpers import tiny_llama

from mmspec import ModelDrafter
from mmspec.decoding.draft import DraftState
from mmspec.decoding.dynamic_tree import dynamic_tree

V = 5


def _logits_for(prefix: tuple) -> torch.Tensor:
    """A fixed toy drafter: next-token log-probs depend on the path so far."""
    g = torch.Generator().manual_seed(hash(prefix) % (2 ** 31))
    return torch.randn(V, generator=g) * 2


def _tree(top_k, levels, num_nodes):
    paths = {}

    def step(tokens, features, depth, ancestors):
        # features carry each frontier node's path as token ids (+1; 0 is padding)
        out_logits, out_feats = [], []
        for b in range(tokens.shape[0]):
            row_l, row_f = [], []
            for j in range(tokens.shape[1]):
                path = tuple(int(x) - 1 for x in features[b, j] if x > 0) + (int(tokens[b, j]),)
                paths[path] = True
                row_l.append(_logits_for(path))
                f = torch.zeros(levels + 1)
                f[: len(path)] = torch.tensor(path) + 1
                row_f.append(f)
            out_logits.append(torch.stack(row_l))
            out_feats.append(torch.stack(row_f))
        return torch.stack(out_logits), torch.stack(out_feats)

    root = _logits_for(())[None]
    return dynamic_tree(step, root, torch.zeros(1, levels + 1), top_k, levels, num_nodes)


def _brute_force(top_k, levels, num_nodes, logits_for=_logits_for):
    """EAGLE-2 by enumeration: expand the per-level top-k frontier, keep the best nodes."""
    cands = []  # (score, level, path)
    frontier = [((), 0.0)]
    for level in range(levels):
        children = []
        for path, score in frontier:
            logp = torch.log_softmax(logits_for(path), -1)
            top = logp.topk(top_k)
            for v, t in zip(top.values.tolist(), top.indices.tolist()):
                children.append((path + (t,), score + v))
        cands += [(s, level, p) for p, s in children]
        frontier = sorted(children, key=lambda c: -c[1])[:top_k]
    best = sorted(cands, key=lambda c: -c[0])[:num_nodes]
    return {p for _, _, p in best}


def _paths(draft):
    tokens, parents = draft.tokens[0].tolist(), draft.parents[0].tolist()
    out = []
    for i in range(len(tokens)):
        path, j = [], i
        while j >= 0:
            path.append(tokens[j])
            j = parents[j]
        out.append(tuple(reversed(path)))
    return out


def test_tree_is_eagle2s_best_nodes():
    draft = _tree(top_k=3, levels=3, num_nodes=9)
    parents = draft.parents[0].tolist()
    assert all(p < i for i, p in enumerate(parents))  # parents first
    assert set(_paths(draft)) == _brute_force(3, 3, 9)


def test_tree_size_is_capped_by_the_candidates():
    draft = _tree(top_k=2, levels=2, num_nodes=100)
    assert draft.tokens.shape[1] == 2 + 2 * 2
    assert all(p < i for i, p in enumerate(draft.parents[0].tolist()))  # parents first
    assert set(_paths(draft)) == _brute_force(2, 2, 100)  # every candidate, rightly linked


def test_model_drafter_tree_is_eagle2s_best_nodes_of_its_model():
    """ModelDrafter's tree (cache, tree mask, levels through `dynamic_tree`) equals the
    enumeration over whole-prefix forwards of its model, for a row with left padding too."""
    model = tiny_llama(3, init_std=0.5)
    prompt = [5, 17, 9, 31, 2, 44]
    for pad in (0, 3):
        ids = torch.tensor([[0] * pad + prompt])
        mask = torch.tensor([[0] * pad + [1] * len(prompt)])
        draft = ModelDrafter(model, num_tokens=10, top_k=3, depth=3).propose(
            DraftState(ids, mask, 8, round=0))

        def logits_for(path):
            with torch.no_grad():
                return model(torch.tensor([prompt + list(path)])).logits[0, -1].float()

        assert set(_paths(draft)) == _brute_force(3, 3, 10, logits_for)
