"""`ViSpecConfig`: the drafter's architecture and tree shape, as one frozen dataclass.

The architecture fields are copied from the target's text config by `ViSpecDrafter.from_target`;
the rest default to what ViSpec ships (`vispec.md` = `shared/reference/vispec.md`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ViSpecConfig:
    hidden_size: int
    num_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # M-RoPE frequency split over (t, h, w) for Qwen2.5-VL targets; None means 1-D RoPE
    mrope_section: tuple | None = None
    attention_bias: bool = False  # vispec.md §1.2: the Qwen configs set qkv_bias
    num_layers: int = 1  # vispec.md §1.2: one decoder layer in every shipped config
    # vispec.md §1.3: num_q = 2, i.e. one compressed token + one global vector per image
    num_queries: int = 2
    # ablation baseline (vispec.md §1.6 "--use-ours=False"): no adaptor, no global vector, every
    # image token stays in the draft sequence
    text_only: bool = False
    # tree (vispec.md §1.5: top_k 8, depth 3 expansions = 4 draft levels, total_token 30 with root)
    depth: int = 4
    top_k: int = 8
    total_tokens: int = 30
    # what the drafter was built for (class, sizes, embedding signature); checked on load
    target: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("num_layers", "depth", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.total_tokens < 2:
            raise ValueError(f"total_tokens counts the root and at least one draft node, "
                             f"got {self.total_tokens}")
        if not self.text_only and self.num_queries < 2:
            raise ValueError(f"num_queries must be >= 2 (compressed tokens + 1 global vector), "
                             f"got {self.num_queries}")
        if self.mrope_section is not None:
            object.__setattr__(self, "mrope_section", tuple(self.mrope_section))
            if 2 * sum(self.mrope_section) != self.head_dim:
                raise ValueError(f"mrope_section {self.mrope_section} must sum to head_dim/2 = "
                                 f"{self.head_dim // 2}")

    @property
    def draft_nodes(self) -> int:
        return self.total_tokens - 1
