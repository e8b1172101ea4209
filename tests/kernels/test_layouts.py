"""Our mask in other kernels' layouts (FlashInfer's BSR, FlashAttention-4's padded lists), each
rebuilt into a token mask and compared with `to_dense`."""

import math

import pytest
import torch

from mmspec.kernels import BlockSparseMask, causal_block_mask
from mmspec.kernels.backends.layouts import attending_rows, bsr, padded_full_lists


def masks():
    g = torch.Generator().manual_seed(0)
    token = torch.rand(2, 3, 50, 90, generator=g) < 0.4  # full, partial, empty blocks, ragged
    token[:, :, :16] = True
    token[..., 20, :] = False  # an empty row
    blocks = torch.rand(1, 2, 4, 3, generator=g) < 0.5
    blocks[..., 1, :] = False  # an empty query block
    yield "token", BlockSparseMask.from_token_mask(token, (16, 32))
    yield "blocks", BlockSparseMask.from_dense(blocks, (16, 16), 64, 48)
    yield "causal", causal_block_mask(40, 70, block_size=16)


def bsr_to_dense(indptr, indices, elements, mask):
    bq, bk = mask.block_size
    mq, nk = mask.num_q_blocks, mask.num_kv_blocks
    dense = torch.zeros(mq * bq, nk * bk, dtype=torch.bool)
    for row in range(mq):
        for slot in range(int(indptr[row]), int(indptr[row + 1])):
            col = int(indices[slot])
            block = True if elements is None else elements[slot]
            dense[row * bq:(row + 1) * bq, col * bk:(col + 1) * bk] = block
    return dense[: mask.q_len, : mask.kv_len]


@pytest.mark.parametrize("name,mask", list(masks()), ids=lambda x: x if isinstance(x, str) else "")
def test_bsr_rebuilds_the_dense_mask(name, mask):
    dense = mask.to_dense()
    for b in range(dense.shape[0]):
        for h in range(dense.shape[1]):
            indptr, indices, elements = bsr(mask, b, h)
            assert indptr.dtype == indices.dtype == torch.int32
            assert indptr[0] == 0 and indptr[-1] == len(indices)
            for row in range(mask.num_q_blocks):  # ascending block ids in each row
                cols = indices[indptr[row]:indptr[row + 1]]
                assert torch.equal(cols, cols.sort().values)
            assert (elements is None) == (mask.kv_indices.shape[-1] == 0)
            assert torch.equal(bsr_to_dense(indptr, indices, elements, mask), dense[b, h])


@pytest.mark.parametrize("name,mask", list(masks()), ids=lambda x: x if isinstance(x, str) else "")
def test_attending_rows(name, mask):
    assert torch.equal(attending_rows(mask), mask.to_dense().any(-1))


def test_padded_full_lists_rebuild_the_blocks():
    blocks = torch.rand(1, 2, 4, 5, generator=torch.Generator().manual_seed(1)) < 0.5
    mask = BlockSparseMask.from_dense(blocks, 16, 64, 80)
    counts, indices = padded_full_lists(mask, 3, 2)
    assert counts.shape == (3, 2, 4) and indices.shape == (3, 2, 4, 5)
    assert indices.is_contiguous() and indices.dtype == torch.int32
    live = torch.arange(5) < counts[..., None]
    rebuilt = torch.zeros(3, 2, 4, 6, dtype=torch.bool)  # padding slots go to a spare column
    rebuilt.scatter_(-1, torch.where(live, indices, 5).long(), True)
    assert torch.equal(rebuilt[..., :5], blocks.expand(3, 2, 4, 5))
    assert math.isclose(float(counts.float().mean()) / 5, mask.density())
