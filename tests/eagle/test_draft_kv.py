"""The draft KV bookkeeping: layers extended along the sequence, tree levels after the committed
entries, in the order the heads' masks read them."""

import torch

from mmspec.eagle.draft_kv import TreeKV, append_kv, extend


def _kv(length: int, start: float) -> tuple:  # [B=1, H=2, P=length, Dh=3], entry i holds start+i
    k = start + torch.arange(length, dtype=torch.float32)
    k = k[None, None, :, None].expand(1, 2, -1, 3)
    return k, -k


def test_extend_appends_along_the_sequence():
    k, v = extend(_kv(2, 0), *_kv(3, 2))
    assert k.shape == (1, 2, 5, 3) and k[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4]
    assert torch.equal(v, -k)
    assert extend(None, *_kv(1, 7))[0][0, 0, 0, 0] == 7


def test_tree_levels_follow_the_committed_entries_layer_by_layer():
    committed = [_kv(3, 0), _kv(3, 100)]  # two layers
    tree = TreeKV(committed)
    assert tree.past() is committed  # before the first level: the cache itself
    tree.add([_kv(2, 3), _kv(2, 103)])
    tree.add([_kv(2, 5), _kv(2, 105)])
    past = tree.past()
    assert [layer[0][0, 0, :, 0].tolist() for layer in past] == [
        [0, 1, 2, 3, 4, 5, 6], [100, 101, 102, 103, 104, 105, 106]]
    assert tree.committed is committed and committed[0][0].shape[2] == 3  # the cache untouched
    assert append_kv([], committed) == committed and append_kv(None, committed) == committed
