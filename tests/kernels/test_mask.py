import math

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mmspec.kernels import (
    BlockSparseMask,
    causal_block_mask,
    prefix_block_mask,
    tree_ancestors,
    tree_block_mask,
    tree_depths,
)


def expand_blocks(block_bool, bq, bk, q_len, kv_len):
    dense = block_bool.repeat_interleave(bq, -2).repeat_interleave(bk, -1)
    return dense[..., :q_len, :kv_len]


@pytest.mark.parametrize("q_len,kv_len,bs", [(64, 64, 16), (100, 150, 32), (7, 300, (16, 64))])
def test_from_dense_round_trip(q_len, kv_len, bs):
    bq, bk = (bs, bs) if isinstance(bs, int) else bs
    g = torch.Generator().manual_seed(0)
    blocks = torch.rand(2, 3, math.ceil(q_len / bq), math.ceil(kv_len / bk), generator=g) < 0.4
    mask = BlockSparseMask.from_dense(blocks, bs, q_len, kv_len)
    assert torch.equal(mask.to_dense(), expand_blocks(blocks, bq, bk, q_len, kv_len))
    assert torch.equal(mask.block_layout() == 2, blocks)
    assert mask.density() == pytest.approx(blocks.float().mean().item())
    assert mask.kv_num_blocks.sum() == 0


def test_to_dense_is_kept_and_rebuilt_after_in_place_changes():
    g = torch.Generator().manual_seed(4)
    token = torch.rand(1, 2, 40, 70, generator=g) < 0.5
    mask = BlockSparseMask.from_token_mask(token, 16)
    first = mask.to_dense()
    assert mask.to_dense() is first and torch.equal(first, token)  # one build per mask
    # a new mask object around the same tensors (as the custom op makes for every layer)
    again = BlockSparseMask._unchecked(mask.kv_num_blocks, mask.kv_indices,
                                       mask.full_kv_num_blocks, mask.full_kv_indices,
                                       mask.partial_masks, (16, 16), 40, 70)
    assert again.to_dense() is first
    other = BlockSparseMask.from_token_mask(~token, 16)  # another mask in between
    assert torch.equal(other.to_dense(), ~token) and torch.equal(mask.to_dense(), token)
    first.fill_(False)  # a caller changed the tensor it got: not handed out again
    assert torch.equal(mask.to_dense(), token)
    mask.partial_masks.fill_(True)  # the mask itself changed in place
    assert torch.equal(mask.to_dense(), mask._build_dense()) and not torch.equal(
        mask.to_dense(), token)
    with torch.inference_mode():  # no version counters there: built every time, still right
        frozen = BlockSparseMask.from_token_mask(token.clone(), 16)
        assert torch.equal(frozen.to_dense(), token) and frozen.to_dense() is not frozen.to_dense()
    # a mask built outside, read inside (its dense form is an inference tensor): no crash
    outside = BlockSparseMask.from_token_mask(~token, 16)
    with torch.inference_mode():
        assert torch.equal(outside.to_dense(), ~token) and torch.equal(outside.to_dense(), ~token)


@pytest.mark.parametrize("shape,bs", [((1, 1, 50, 70), 16), ((2, 3, 33, 65), (16, 32))])
def test_from_token_mask_classifies_blocks(shape, bs):
    g = torch.Generator().manual_seed(1)
    token = torch.rand(shape, generator=g) < 0.5
    token[..., :16, :] = True  # some full blocks
    token[..., -5:, :] = False  # some empty rows and blocks
    mask = BlockSparseMask.from_token_mask(token, bs)
    assert torch.equal(mask.to_dense(), token)
    layout = mask.block_layout()
    bq, bk = (bs, bs) if isinstance(bs, int) else bs
    for m in range(layout.shape[2]):
        for n in range(layout.shape[3]):
            tile = token[..., m * bq:(m + 1) * bq, n * bk:(n + 1) * bk]
            expect = torch.where(tile.flatten(-2).all(-1), 2, torch.where(tile.flatten(-2).any(-1), 1, 0))
            assert torch.equal(layout[..., m, n], expect.to(torch.int8))


def test_ragged_tail_block_can_be_full():
    token = torch.ones(1, 1, 20, 20, dtype=torch.bool)
    mask = BlockSparseMask.from_token_mask(token, 16)
    assert mask.is_dense and mask.kv_num_blocks.sum() == 0


@pytest.mark.parametrize("q_len,kv_len,bs", [(64, 64, 16), (30, 100, 16), (100, 100, (32, 16)), (1, 77, 16)])
def test_causal_fast_constructor_matches_generic(q_len, kv_len, bs):
    fast = causal_block_mask(q_len, kv_len, bs)
    token = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)[None, None]
    generic = BlockSparseMask.from_token_mask(token, bs)
    assert torch.equal(fast.to_dense(), token)
    assert torch.equal(fast.block_layout(), generic.block_layout())


def test_tree_ancestors_and_depths():
    parents = torch.tensor([-1, 0, 0, 1, 3, -1])
    anc = tree_ancestors(parents)
    assert anc[4].nonzero().flatten().tolist() == [0, 1, 3, 4]
    assert anc[5].nonzero().flatten().tolist() == [5]
    assert tree_depths(parents).tolist() == [0, 1, 1, 2, 3, 0]
    chain = tree_ancestors(torch.arange(-1, 5))
    assert torch.equal(chain, torch.ones(6, 6, dtype=torch.bool).tril())


def test_tree_block_mask_sees_prefix_and_ancestors_only():
    parents = torch.tensor([-1, 0, 0, 1, 2])
    mask = tree_block_mask(parents, prefix_len=20, block_size=16)
    dense = mask.to_dense()[0, 0]
    assert dense.shape == (5, 25)
    assert dense[:, :20].all()
    assert torch.equal(dense[:, 20:], tree_ancestors(parents))


@pytest.mark.parametrize("bad", [[0], [-1, 1], [-1, 0, -2]])
def test_tree_rejects_bad_parents(bad):
    with pytest.raises(ValueError, match="parents"):
        tree_block_mask(torch.tensor(bad), prefix_len=4)


@pytest.mark.parametrize("prefix_causal", [True, False])
def test_prefix_block_mask(prefix_causal):
    p, k = 37, 20
    mask = prefix_block_mask(p, k, block_size=16, prefix_causal=prefix_causal)
    n = p + k
    q = torch.arange(n)[:, None]
    kv = torch.arange(n)[None, :]
    prefix_rows = (kv < p) & ((kv <= q) if prefix_causal else True)
    expect = torch.where(q >= p, torch.ones(n, n, dtype=torch.bool), prefix_rows)
    assert torch.equal(mask.to_dense()[0, 0], expect)
    generic = BlockSparseMask.from_token_mask(expect[None, None], 16)
    assert torch.equal(mask.block_layout(), generic.block_layout())


def test_to_flex_layout_matches():
    token = torch.rand(2, 1, 40, 72, generator=torch.Generator().manual_seed(3)) < 0.3
    mask = BlockSparseMask.from_token_mask(token, 16)
    flex = mask.to_flex()
    ours = mask.block_layout() > 0
    assert torch.equal(flex.to_dense().bool(), ours)
    assert flex.seq_lengths == (40, 72)


# ------------------------------------------------------------------------------------ bad input


def valid_parts():
    mask = BlockSparseMask.from_token_mask(torch.rand(1, 2, 32, 48) < 0.5, 16)
    return dict(kv_num_blocks=mask.kv_num_blocks, kv_indices=mask.kv_indices,
                full_kv_num_blocks=mask.full_kv_num_blocks, full_kv_indices=mask.full_kv_indices,
                partial_masks=mask.partial_masks, block_size=(16, 16), q_len=32, kv_len=48)


def test_valid_parts_construct():
    BlockSparseMask(**valid_parts())


@pytest.mark.parametrize("edit,error,match", [
    (lambda p: p.update(full_kv_indices=p["full_kv_indices"].long()), TypeError, "dtype"),
    (lambda p: p.update(q_len=100), ValueError, "shape"),
    (lambda p: p.update(block_size=(16, 0)), ValueError, "block_size"),
    (lambda p: p.update(full_kv_num_blocks=p["full_kv_num_blocks"] + 9), ValueError, r"\[0, 3\]"),
    (lambda p: p.update(full_kv_indices=torch.full_like(p["full_kv_indices"], 7),
                        full_kv_num_blocks=torch.ones_like(p["full_kv_num_blocks"])),
     ValueError, "must lie in"),
    (lambda p: p.update(full_kv_indices=torch.zeros_like(p["full_kv_indices"]),
                        full_kv_num_blocks=torch.full_like(p["full_kv_num_blocks"], 2)),
     ValueError, "twice"),
    (lambda p: p.update(q_len=0), ValueError, "q_len"),
])
def test_bad_mask_tensors_raise(edit, error, match):
    parts = valid_parts()
    parts["kv_num_blocks"] = torch.zeros_like(parts["kv_num_blocks"])  # only full blocks in play
    edit(parts)
    with pytest.raises(error, match=match):
        BlockSparseMask(**parts)


def test_from_dense_rejects_wrong_block_count():
    with pytest.raises(ValueError, match="need"):
        BlockSparseMask.from_dense(torch.ones(1, 1, 2, 3, dtype=torch.bool), 16, 64, 48)
    with pytest.raises(TypeError, match="bool"):
        BlockSparseMask.from_dense(torch.ones(1, 1, 2, 3), 16, 32, 48)


def _causal_mod(b, h, q, k):
    return q >= k


@pytest.mark.parametrize("build,match", [
    (lambda: causal_block_mask("32", 32), "q_len must be a positive int, got '32'"),
    (lambda: causal_block_mask(32, 0), "kv_len must be a positive int, got 0"),
    (lambda: BlockSparseMask.from_dense(torch.ones(1, 1, 2, 2, dtype=torch.bool), 16, "32", 32),
     "q_len must be a positive int, got '32'"),
    (lambda: BlockSparseMask.from_block_flags(
        torch.ones(1, 1, 2, 2, dtype=torch.bool), torch.zeros(1, 1, 2, 2, dtype=torch.bool),
        _causal_mod, 16, 32, 32.0), "kv_len must be a positive int, got 32.0"),
    (lambda: tree_block_mask([-1, 0], 4.0), "prefix_len must be an int >= 0, got 4.0"),
    (lambda: prefix_block_mask(3.5, 4), "prefix_len must be an int >= 0, got 3.5"),  # said q_len
    (lambda: prefix_block_mask(3, 0), "block_len must be a positive int, got 0"),
], ids=["causal-str", "causal-zero", "from_dense-str", "from_block_flags-float", "tree-float",
        "prefix-float", "prefix-zero-block"])
def test_builders_name_the_bad_length(build, match):
    # a str length failed inside `<=` or `/`, a float prefix named q_len or failed in torch.ones
    with pytest.raises(ValueError, match=match):
        build()


def test_from_block_flags_wants_4d_bool_flags():
    # 2-D flags failed to unpack into (b, h, m, n); int64 flags failed in an index_put
    flags = torch.zeros(2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"full must be \[B, H, Mq, Nk\], where q_len=32, "
                                         r"kv_len=32 .* need \(Mq, Nk\) = \(2, 2\); got shape "
                                         r"\(2, 2\)"):
        BlockSparseMask.from_block_flags(flags, flags, _causal_mod, 16, 32, 32)
    flags = torch.zeros(1, 1, 2, 2, dtype=torch.int64)
    with pytest.raises(TypeError, match="partial must be a bool tensor .* got torch.int64"):
        BlockSparseMask.from_block_flags(flags.bool(), flags, _causal_mod, 16, 32, 32)


def test_from_block_flags_broadcasts_full_and_partial():
    # documented [B|1, H|1, ...] each: a batch-2 `full` with a shared `partial` crashed
    full = torch.zeros(2, 1, 2, 2, dtype=torch.bool)
    full[1, :, 0, 0] = True
    partial = torch.zeros(1, 1, 2, 2, dtype=torch.bool)
    partial[..., 1, :] = True
    mask = BlockSparseMask.from_block_flags(full, partial, lambda b, h, q, k: q >= k, 16, 32, 32)
    dense = mask.to_dense()
    causal = torch.ones(32, 32, dtype=torch.bool).tril()
    assert torch.equal(dense[0, 0, 16:], causal[16:]) and not dense[0, 0, :16].any()
    assert dense[1, 0, :16, :16].all() and not dense[1, 0, :16, 16:].any()


def test_to_flex_takes_index_lists_wider_than_the_key_blocks():
    # the constructor accepts index lists wider than the key blocks (counts bound what is read)
    mask = BlockSparseMask(
        torch.zeros(1, 1, 1, dtype=torch.int32), torch.zeros(1, 1, 1, 0, dtype=torch.int32),
        torch.tensor([[[2]]], dtype=torch.int32), torch.tensor([[[[0, 1, 0]]]], dtype=torch.int32),
        torch.zeros(1, 1, 1, 0, 16, 16, dtype=torch.bool), 16, 16, 32)
    assert mask.to_dense().all()
    flex = mask.to_flex()
    assert flex.full_kv_num_blocks.tolist() == [[[2]]] and flex.kv_num_blocks.tolist() == [[[0]]]


def test_numpy_lengths_are_ints():
    mask = causal_block_mask(np.int64(40), np.int64(40), np.int64(16))
    assert mask.q_len == 40 and type(mask.q_len) is int and mask.block_size == (16, 16)
    with pytest.raises(ValueError, match="q_len must be a positive int, got True"):
        BlockSparseMask(*[getattr(mask, f) for f in ("kv_num_blocks", "kv_indices",
                                                     "full_kv_num_blocks", "full_kv_indices",
                                                     "partial_masks")], 16, True, 40)


@pytest.mark.parametrize("parents", [[-1.0, 0.7, 1.5], torch.tensor([-1.0, 0.0])])
def test_tree_parents_must_be_integers(parents):
    # [-1., 0.7, 1.5] was truncated to [-1, 0, 1]: a mask for another tree
    with pytest.raises(ValueError, match="parents must be integer node indices, got torch.float"):
        tree_block_mask(parents, 4, 16)


def test_to_moves_without_revalidating():
    # `to` rebuilt the mask through the checks (device syncs; "meta" failed on `.item()`)
    mask = causal_block_mask(40, 40, 16)
    meta = mask.to("meta")
    assert meta.device.type == "meta" and meta.shape == mask.shape
    assert meta.block_size == mask.block_size
    assert torch.equal(mask.to("cpu").to_dense(), mask.to_dense())


def test_to_takes_a_device_only():
    # mask.to(torch.float16) cast the int32 indices and bool masks, and attention then failed
    # with "Index put requires the source and destination dtypes match"
    mask = causal_block_mask(40, 40, 16)
    for bad in (torch.float16, 3.0):
        with pytest.raises(TypeError, match=r"BlockSparseMask.to takes a device .*, got"):
            mask.to(bad)
    assert mask.to(torch.device("cpu")).kv_indices.dtype == mask.kv_indices.dtype


def test_edge_inputs_of_the_constructors():
    # a list where a tensor goes was an AttributeError ('list' object has no attribute 'device');
    # an int mask_mod an index_put dtype error; a batch of 0 a ZeroDivisionError in repr
    parts = valid_parts()
    parts["kv_num_blocks"] = [0]
    with pytest.raises(TypeError, match="kv_num_blocks must be a torch.Tensor, got list"):
        BlockSparseMask(**parts)
    partial = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    as_ints = BlockSparseMask.from_block_flags(
        torch.zeros_like(partial), partial, lambda b, h, q, k: (q >= k).int(), 16, 32, 32)
    as_bools = BlockSparseMask.from_block_flags(torch.zeros_like(partial), partial, _causal_mod,
                                                16, 32, 32)
    assert torch.equal(as_ints.to_dense(), as_bools.to_dense())
    empty = BlockSparseMask.from_dense(torch.zeros(0, 1, 2, 2, dtype=torch.bool), 16, 32, 32)
    assert empty.density() == 0.0 and "BlockSparseMask" in repr(empty)


class DeviceReads(TorchDispatchMode):
    """Counts the ops at which a GPU run would wait for the device (as tests/decoding/test_syncs.py)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
                    torch.ops.aten.equal.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_from_token_mask_is_trusted_and_padded_partials_read_nothing_back(monkeypatch):
    """Its lists come from the block flags, valid for any bool token mask: the index checks
    (device reads) are skipped, as from_dense skips them; sizing the partial lists is the one read
    left, and `pad_partials` (draft tree levels) avoids it with the same mask. Its token form is
    kept for `to_dense` (a copy), which the torch backend's small path would rebuild."""
    token = torch.ones(2, 1, 40, 70, dtype=torch.bool).tril(30)  # partial blocks on the diagonal
    token[1, :, 5, :3] = False  # and one more in row 1
    token[0, :, 20] = False  # an empty row
    with DeviceReads() as reads:
        fitted = BlockSparseMask.from_token_mask(token, 16)
    assert reads.count == 1
    with DeviceReads() as reads:
        padded = BlockSparseMask.from_token_mask(token, 16, pad_partials=True)
    assert reads.count == 0
    width = fitted.kv_indices.shape[-1]
    assert 0 < width < padded.kv_indices.shape[-1] == padded.num_kv_blocks == 5
    assert torch.equal(padded.kv_num_blocks, fitted.kv_num_blocks)
    assert torch.equal(padded.kv_indices[..., :width], fitted.kv_indices)
    with monkeypatch.context() as patch:
        patch.setattr(BlockSparseMask, "_build_dense", lambda self: pytest.fail("rebuilt"))
        kept = padded.to_dense()
    assert torch.equal(kept, token) and kept is not token
    assert torch.equal(padded._build_dense(), token) and torch.equal(fitted.to_dense(), token)
    with pytest.raises(ValueError, match="kv_len must be a positive int, got 0"):
        BlockSparseMask.from_token_mask(torch.ones(1, 1, 4, 0, dtype=torch.bool), 16)
