"""mmspec.video_dit: DraftAttention for video diffusion transformers (Shen et al., arXiv 2505.14708).

Public names:
    tile_permutation        token order that makes each th x tw tile of a frame contiguous
                            (and each query tile of whole tiles, with query_tile=)
    draft_block_mask        the draft attention map's block mask (mode "global", "row" or
                            "top_p")
    DraftAttentionConfig    sparsity, tile (and query tile), mode, mass and calibrate (adaptive
                            budgets), dense warm-up steps and layers
    apply_draft_attention   install on a diffusers pipeline or transformer (Wan, Wan VACE,
                            SkyReels-V2, HunyuanVideo and 1.5, CogVideoX); returns a
                            DraftAttentionState with the densities (DraftAttentionStates for
                            Wan 2.2's two experts)
    remove_draft_attention  restore the original processors
Tools: `python -m mmspec.video_dit.generate` and `python -m mmspec.video_dit.compare`.
"""

from .apply import (
    DensityRecord,
    DraftAttentionState,
    DraftAttentionStates,
    apply_draft_attention,
    remove_draft_attention,
)
from .config import DraftAttentionConfig
from .draft_map import draft_block_mask
from .sparse_attention import draft_attention
from .tiles import TileLayout, tile_layout, tile_permutation

__all__ = [
    "DensityRecord",
    "DraftAttentionConfig",
    "DraftAttentionState",
    "DraftAttentionStates",
    "TileLayout",
    "apply_draft_attention",
    "draft_attention",
    "draft_block_mask",
    "remove_draft_attention",
    "tile_layout",
    "tile_permutation",
]
