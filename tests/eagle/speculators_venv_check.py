"""Run inside a venv with the `speculators` package (not mmspec): does a folder mmspec wrote in
the speculators format pass the package's own config class, load into its model, and compute
the same draft logits?

    python speculators_venv_check.py FOLDER REFERENCE.safetensors

REFERENCE holds mmspec's inputs and output for one prefill of the drafter: `features`
`[1, N, 3 * target d]` (the target's three layers' inputs), `tokens` `[1, N]`, `logits`
`[1, N, draft vocab]`. Driven by `test_speculators_venv.py`; prints one line per check and exits
non-zero on the first failure.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from speculators import SpeculatorModel, SpeculatorModelConfig
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig


def main(folder: Path, reference: Path) -> None:
    fields = json.loads((folder / "config.json").read_text())
    validated = Eagle3SpeculatorConfig.model_validate(fields)  # the pydantic schema itself
    config = SpeculatorModelConfig.from_pretrained(folder)  # the registry picks the class
    assert type(config) is Eagle3SpeculatorConfig, type(config)
    assert validated.draft_vocab_size == config.draft_vocab_size == fields["draft_vocab_size"]
    assert config.speculators_config.proposal_methods[0].speculative_tokens == \
        fields["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    print(f"config: {type(config).__name__} validates (draft vocab {config.draft_vocab_size}, "
          f"layer ids {config.eagle_aux_hidden_state_layer_ids})")

    model = SpeculatorModel.from_pretrained(folder).eval()
    assert type(model) is Eagle3DraftModel, type(model)
    written = load_file(str(folder / "model.safetensors"))
    own = model.state_dict()
    needed = {k for k in own if not k.startswith("verifier_")}
    assert needed == set(written), (sorted(needed ^ set(written)))
    for key, value in written.items():
        assert torch.equal(own[key].to(value.dtype), value), key
    assert not any(p.isnan().any() for p in model.parameters() if p.is_floating_point() and
                   p is not model.verifier_lm_head.weight)
    print(f"weights: {type(model).__name__} holds all {len(written)} written tensors, equal")

    ref = load_file(str(reference))
    features, tokens = ref["features"], ref["tokens"]
    n = tokens.shape[1]
    layer_config = model.config.transformer_layer_config
    layer_config._attn_implementation = "eager"  # the package's flex default needs a GPU build
    with torch.no_grad():
        g = model.fc(features)  # [1, N, d]
        x = torch.cat([model.embed_tokens(tokens), g], -1)  # [1, N, 2d]
        positions = torch.arange(n)[None]
        rope = model.rotary_emb(g, positions)
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]  # [1, 1, N, N] causal
        h = model.layers[0](x, attention_mask=mask, position_ids=positions,
                            position_embeddings=rope)
        logits = model.lm_head(model.norm(h))
    error = float((logits - ref["logits"]).abs().max())
    assert error < 1e-4, error
    print(f"forward: the package's fc, layers[0], norm and lm_head give mmspec's draft logits "
          f"(max abs error {error:.1e} over {tuple(logits.shape)})")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
