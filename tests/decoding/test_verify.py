"""Tree building, the verification mask and greedy verification on hand-made trees."""

import torch

from mmspec import Draft
from mmspec.decoding.tree import build_tree, verify_mask
from mmspec.decoding.verify import verify_greedy

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
