"""`ViSpecConfig`: the drafter's architecture and tree shape, as one frozen dataclass.

The architecture fields are copied from the target's text config by `ViSpecDrafter.from_target`;
the rest default to what ViSpec ships (`vispec.md` = `shared/reference/vispec.md`).
"""

from __future__ import annotations

import math
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
    # the target's `hidden_states` entries whose concatenation `fuse` maps to the feature (EAGLE-3's
    # multi-layer features, e.g. the inputs of layers 2, L//2, L-3); () means the last entry (the
    # normed last layer), ViSpec's and EAGLE-2's feature
    feature_layers: tuple = ()
    # tree (vispec.md §1.5: top_k 8, depth 3 expansions = 4 draft levels, total_token 30 with root)
    depth: int = 4
    top_k: int = 8
    total_tokens: int = 30
    # what the drafter was built for (class, sizes, embedding signature); checked on load
    target: dict = field(default_factory=dict)

    def __post_init__(self):
        for name, low in (("hidden_size", 1), ("num_heads", 1), ("head_dim", 1),
                          ("intermediate_size", 1), ("vocab_size", 1), ("num_layers", 1),
                          ("num_queries", 1), ("depth", 1), ("top_k", 1), ("total_tokens", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                why = " (the root and at least one draft node)" if name == "total_tokens" else ""
                raise ValueError(f"ViSpecConfig.{name} must be an int >= {low}{why}, got "
                                 f"{value!r}")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value <= 0):
                raise ValueError(f"ViSpecConfig.{name} must be a finite number > 0, got {value!r}")
        for name in ("attention_bias", "text_only"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ViSpecConfig.{name} must be a bool, got "
                                 f"{getattr(self, name)!r}")
        if not self.text_only and self.num_queries < 2:
            raise ValueError(f"ViSpecConfig.num_queries must be >= 2 (compressed tokens + 1 "
                             f"global vector), got {self.num_queries}")
        layers = self.feature_layers
        if (not isinstance(layers, (tuple, list))
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                           for i in layers) or len(set(layers)) != len(layers)):
            raise ValueError(f"ViSpecConfig.feature_layers must be distinct hidden_states ids "
                             f">= 0 (empty: the last hidden state), got {layers!r}")
        object.__setattr__(self, "feature_layers", tuple(layers))
        if self.mrope_section is not None:
            section = self.mrope_section
            if (not isinstance(section, (tuple, list))
                    or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                               for n in section)):
                raise ValueError(f"ViSpecConfig.mrope_section must be None or a sequence of "
                                 f"ints >= 0, got {section!r}")
            object.__setattr__(self, "mrope_section", tuple(section))
            if 2 * sum(self.mrope_section) != self.head_dim:
                raise ValueError(f"ViSpecConfig.mrope_section {self.mrope_section} must sum to "
                                 f"head_dim/2 = {self.head_dim // 2}")

    @property
    def draft_nodes(self) -> int:
        return self.total_tokens - 1
