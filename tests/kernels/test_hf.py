import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from mmspec.kernels import (
    HF_ATTENTION_NAME,
    causal_block_mask,
    register_hf_attention,
    tree_block_mask,
    tree_depths,
)


@pytest.fixture(scope="module")
def llama():
    register_hf_attention()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(config).eval()
    model.set_attn_implementation(HF_ATTENTION_NAME)
    return model


def test_causal_mask_reproduces_sdpa_forward(llama):
    ids = torch.randint(0, 64, (1, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = llama(ids).logits  # no block mask: SDPA fallback
        ours = llama(ids, block_sparse_mask=causal_block_mask(37, 37, 16)).logits
    torch.testing.assert_close(ours, plain, atol=1e-5, rtol=1e-5)


def test_tree_forward_matches_each_branch(llama):
    """A tree verified in one forward gives every node the logits of its own root-to-node path."""
    g = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, 64, (1, 20), generator=g)
    parents = torch.tensor([-1, 0, 0, 1, 2, 4])
    tree = torch.randint(0, 64, (1, 6), generator=g)
    with torch.no_grad():
        cache = DynamicCache(config=llama.config)
        llama(prefix, past_key_values=cache, use_cache=True)
        positions = (20 + tree_depths(parents))[None]
        tree_logits = llama(tree, past_key_values=cache, position_ids=positions,
                            block_sparse_mask=tree_block_mask(parents, 20, 16)).logits
        for node, path in {3: [0, 1, 3], 5: [0, 2, 4, 5]}.items():
            seq = torch.cat([prefix, tree[:, path]], dim=1)
            expect = llama(seq).logits[0, -1]
            torch.testing.assert_close(tree_logits[0, node], expect, atol=1e-5, rtol=1e-5)


def test_rejects_non_mask(llama):
    with pytest.raises(TypeError, match="block_sparse_mask must be a BlockSparseMask"):
        llama(torch.zeros(1, 4, dtype=torch.long), block_sparse_mask=torch.ones(4, 4))
