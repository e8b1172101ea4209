"""Tree building, the verification mask, greedy verification on hand-made trees, and the
vectorised sampling rule against its one-step-at-a-time walk."""

import pytest
import torch

from mmspec import Draft
from mmspec.decoding.tree import build_tree, verify_mask
from mmspec.decoding.sampling import residual
from mmspec.decoding.verify import verify_greedy, verify_sampling

V = 10


def _logits_predicting(pred):
    """logits `[1, N, V]` whose argmax at node i is pred[i]."""
    return torch.nn.functional.one_hot(torch.tensor([pred]), V).float()


def test_build_tree_prepends_the_root():
    #        root
    #       /    \
    #      0(3)   1(4)
    #      |       \
    #      2(5)     3(6)
    draft = Draft(torch.tensor([[3, 4, 5, 6]]), torch.tensor([-1, -1, 0, 1]))
    tree = build_tree(torch.tensor([9]), draft, V)
    assert tree.tokens.tolist() == [[9, 3, 4, 5, 6]]
    assert tree.parents.tolist() == [[-1, 0, 0, 1, 2]]
    assert tree.depth.tolist() == [[0, 1, 1, 2, 2]]
    assert tree.anc[0, 4].tolist() == [True, False, True, False, True]


def test_verify_mask_sees_valid_cache_and_ancestors():
    draft = Draft(torch.tensor([[3, 4, 5]]), torch.tensor([-1, -1, 0]))
    tree = build_tree(torch.tensor([9]), draft, V)
    cache_valid = torch.tensor([[False, True, True, False, True]])  # pad, 2 tokens, a hole, 1
    dense = verify_mask(tree, cache_valid).to_dense()[0, 0]  # [N=4, C+N=9]
    expect = torch.tensor([
        [0, 1, 1, 0, 1, 1, 0, 0, 0],
        [0, 1, 1, 0, 1, 1, 1, 0, 0],
        [0, 1, 1, 0, 1, 1, 0, 1, 0],
        [0, 1, 1, 0, 1, 1, 1, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(dense, expect)


def test_greedy_takes_the_deepest_matching_path():
    draft = Draft(torch.tensor([[3, 4, 5, 6]]), torch.tensor([-1, -1, 0, 1]))
    tree = build_tree(torch.tensor([9]), draft, V)
    # target: after root -> 4, after node 1 (4) -> 6, after node 3 (6) -> 7
    best, bonus = verify_greedy(tree, _logits_predicting([4, 0, 6, 0, 7]))
    assert best.tolist() == [4] and bonus.tolist() == [7]
    # nothing matches: the bonus is the target's token after the root
    best, bonus = verify_greedy(tree, _logits_predicting([8, 0, 6, 0, 7]))
    assert best.tolist() == [0] and bonus.tolist() == [8]
    # a matching child below a rejected parent does not count
    best, bonus = verify_greedy(tree, _logits_predicting([3, 1, 6, 0, 7]))
    assert best.tolist() == [1] and bonus.tolist() == [1]


def test_greedy_ignores_nodes_past_num_tokens():
    draft = Draft.chain(torch.tensor([[3, 4, 5], [3, 4, 5]]), num_tokens=torch.tensor([3, 1]))
    tree = build_tree(torch.tensor([9, 9]), draft, V)
    logits = _logits_predicting([3, 4, 5, 6]).expand(2, -1, -1)
    best, bonus = verify_greedy(tree, logits)
    assert best.tolist() == [3, 1] and bonus.tolist() == [6, 4]


def test_per_row_tree_shapes():
    draft = Draft(torch.tensor([[3, 4], [3, 4]]), torch.tensor([[-1, 0], [-1, -1]]))
    tree = build_tree(torch.tensor([9, 9]), draft, V)
    assert tree.depth.tolist() == [[0, 1, 2], [0, 1, 1]]
    best, _ = verify_greedy(tree, _logits_predicting([3, 4, 0]).expand(2, -1, -1))
    assert best.tolist() == [2, 1]


def test_tree_of_a_whole_query_block_in_a_batch():
    """16 nodes (one full query block) in a batch: HF's transposed queries fill a whole block
    (this once hit a non-contiguous `.view` in the kernels' torch backend)."""
    from spec_helpers import RandomDrafter, tiny_llama

    from mmspec import generate

    target = tiny_llama(0)
    ids = torch.randint(3, 64, (2, 5))
    ref = target.generate(ids, do_sample=False, max_new_tokens=4, eos_token_id=[])
    out = generate(target, RandomDrafter(15), ids, max_new_tokens=4, eos_token_id=[])
    assert torch.equal(out.sequences, ref)


def test_main_path_follows_the_first_child_at_every_depth():
    """Where no tree verifies exactly, the engine verifies each row's main path: from the root,
    the first child (drafters list their best child first) of every node."""
    from mmspec.decoding import Draft
    from mmspec.decoding.tree import main_path

    tokens = torch.tensor([[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]])
    probs = torch.rand(2, 6, 30)
    draft = Draft(tokens, torch.tensor([-1, -1, 1, 0, 0, 3]), probs)
    chain, index = main_path(draft)
    assert index.tolist() == [[0, 3, 5], [0, 3, 5]]
    assert chain.tokens.tolist() == [[10, 13, 15], [20, 23, 25]]
    assert chain.parents.tolist() == [-1, 0, 1]
    assert torch.equal(chain.probs, probs[:, [0, 3, 5]])
    # rows with their own shapes and node counts: paths of their own lengths
    rows = Draft(tokens, torch.tensor([[-1, 0, 1, -1, 3, 4], [-1, -1, 0, 2, 2, 4]]),
                 num_tokens=torch.tensor([6, 3]))
    chain, index = main_path(rows)
    assert index.tolist() == [[0, 1, 2], [0, 2, 3]]  # row 1: node 3 is past its 3 nodes
    assert chain.num_tokens.tolist() == [3, 2]
    assert main_path(Draft.chain(tokens)) is None


def _walk_sampling(tree, probs, generator):
    """The sampling rule as the module docstring states it, one (step, rank) at a time: the
    readable reference of the vectorised `verify_sampling`, drawing the same uniforms."""
    b, n, _ = probs.shape
    kids = [[[i for i in range(1, n) if row[i] == j] for j in range(n)]
            for row in tree.host_parents]
    r_max = max(1, max(len(k) for row in kids for k in row))
    best, stop = [0] * b, [probs[r, 0] for r in range(b)]
    moving = [True] * b
    for _ in range(tree.max_depth):
        moved = [False] * b
        for rank in range(r_max):
            u = torch.rand(b, generator=generator)
            for r in range(b):
                row_kids = kids[r][best[r]]
                if not moving[r] or moved[r] or rank >= len(row_kids):
                    continue
                c = row_kids[rank]
                x = int(tree.tokens[r, c])
                if not tree.valid[r, c]:
                    continue
                q = (torch.nn.functional.one_hot(torch.tensor(x), probs.shape[-1]).float()
                     if tree.probs is None else tree.probs[r, c - 1])
                if u[r] < stop[r][x] / q[x].clamp_min(1e-30):
                    best[r], stop[r], moved[r] = c, probs[r, c], True
                else:
                    stop[r] = residual(stop[r], q)
        moving = [m and v for m, v in zip(moving, moved)]
    bonus = torch.multinomial(torch.stack(stop), 1, generator=generator)[:, 0]
    return torch.tensor(best), bonus


@pytest.mark.parametrize("with_probs", [False, True], ids=["point_masses", "draft_probs"])
def test_sampling_verifies_every_node_at_once_as_the_walk_does(with_probs):
    """The vectorised rule picks the walk's path and bonus from the same draws (one generator
    seed: the same tokens), on random trees of their own shape per row, with siblings that
    repeat a token, nodes past `num_tokens`, and peaked targets (paths of every length)."""
    depths = []
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        b, t, v = 3, 9, 6
        parents = torch.stack([torch.tensor([-1] + [int(torch.randint(-1, i, (), generator=g))
                                                    for i in range(1, t)]) for _ in range(b)])
        probs = (torch.randn(b, t + 1, v, generator=g) * 3).softmax(-1)
        q = (torch.randn(b, t, v, generator=g) * 2).softmax(-1) if with_probs else None
        tokens = torch.multinomial(probs[:, :1].expand(b, t, v).reshape(-1, v), 1,
                                   generator=g).view(b, t)
        num = torch.randint(t // 2, t + 1, (b,), generator=g)
        tree = build_tree(torch.zeros(b, dtype=torch.long), Draft(tokens, parents, q, num), v)
        ours = verify_sampling(tree, probs, torch.Generator().manual_seed(seed))
        walk = _walk_sampling(tree, probs, torch.Generator().manual_seed(seed))
        assert torch.equal(ours[0], walk[0]) and torch.equal(ours[1], walk[1]), seed
        depths += tree.depth.gather(1, ours[0][:, None])[:, 0].tolist()
    assert {0, 1, 2} <= set(depths)  # rejections and paths past the first level both occur


def test_a_repeated_tree_shape_sends_nothing_to_the_device():
    """A drafter's tree shape repeats from round to round: its ancestors, depths and the
    sampling rule's tables are made once (host lists copied to the device), then reused."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Copies(TorchDispatchMode):  # torch.tensor(host list) dispatches lift_fresh
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Copies.count += str(func) == "aten.lift_fresh.default"
            return func(*args, **(kwargs or {}))

    parents = torch.tensor([-1, -1, 0, 0, 1, 0])  # a shape no other test uses
    probs, roots = torch.rand(2, 7, V).softmax(-1), torch.tensor([1, 2])

    def round_(seed):
        draft = Draft(torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(seed)),
                      parents)
        tree = build_tree(roots, draft, V)
        return tree, verify_sampling(tree, probs, torch.Generator().manual_seed(seed))

    first, _ = round_(0)
    with Copies():
        again, _ = round_(1)
    assert Copies.count == 0
    assert torch.equal(again.anc, first.anc) and torch.equal(again.depth, first.depth)
    assert again.tokens[:, 1:].tolist() != first.tokens[:, 1:].tolist()
