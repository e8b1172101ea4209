"""mmspec.kernels: the one block-sparse attention layer under ViSpec, DiffuSpec and DraftAttention.

Public names:
    BlockSparseMask          FlexAttention-style layout of kept key blocks (full and partial)
    block_sparse_attention   the attention op, with backends "triton", "torch", "flex", "reference"
                             (and "flashinfer", "fa4" where their packages import)
    reads_through_order      whether a call's `token_order` is read inside the kernel (no copy)
    causal_block_mask, tree_block_mask, prefix_block_mask, tree_ancestors, tree_depths
    register_hf_attention    route any Hugging Face decoder's attention through this layer
"""

from .attention import block_sparse_attention, reads_through_order
from .backends import available_backends, register_backend
from .hf import HF_ATTENTION_NAME, register_hf_attention
from .mask import BlockSparseMask
from .masks import causal_block_mask, prefix_block_mask, tree_ancestors, tree_block_mask, tree_depths

__all__ = [
    "BlockSparseMask",
    "HF_ATTENTION_NAME",
    "available_backends",
    "block_sparse_attention",
    "causal_block_mask",
    "prefix_block_mask",
    "reads_through_order",
    "register_backend",
    "register_hf_attention",
    "tree_ancestors",
    "tree_block_mask",
    "tree_depths",
]
