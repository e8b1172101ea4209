"""`DiffusionDrafter.from_pretrained`: a Dream checkpoint loads without remote code, strictly."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from mmspec import generate
from mmspec.diffusion import DiffusionDrafter, DiffusionDrafterConfig
from mmspec.diffusion.dlm_loading import DREAM_CONTEXT, load_diffusion_lm
from mmspec.diffusion.bidirectional import make_bidirectional

from .models import MASK, tiny_qwen2


def _dream_folder(path, model):
    """`model`'s weights under a config.json as Dream-v0 ships it (transformers 4.46 style)."""
    model.save_pretrained(path)
    c = model.config
    (path / "config.json").write_text(json.dumps({
        "architectures": ["DreamModel"], "model_type": "Dream",
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                     "AutoModel": "modeling_dream.DreamModel"},
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "hidden_act": "silu",
        "max_position_embeddings": 256, "rms_norm_eps": c.rms_norm_eps, "rope_theta": 5000.0,
        "rope_scaling": None, "tie_word_embeddings": False, "use_sliding_window": False,
        "sliding_window": None, "max_window_layers": 2, "attention_dropout": 0.0,
        "bos_token_id": None, "eos_token_id": 1, "pad_token_id": 0, "mask_token_id": MASK,
        "torch_dtype": "float32", "transformers_version": "4.46.2", "use_cache": False}))
    return path


@pytest.fixture
def dream_dir(tmp_path, dlm):
    return _dream_folder(tmp_path / "dream", dlm)


def test_a_dream_checkpoint_loads_as_a_bidirectional_qwen2(dream_dir, dlm):
    loaded = load_diffusion_lm(dream_dir)
    assert (loaded.mask_token_id, loaded.shift, loaded.max_context) == (MASK, True, DREAM_CONTEXT)
    assert loaded.model.config.rope_parameters["rope_theta"] == 5000.0  # Dream's, not a default
    reference = make_bidirectional(tiny_qwen2(1))
    reference.config.rope_parameters = {"rope_type": "default", "rope_theta": 5000.0}
    reference.model.rotary_emb.__init__(reference.config)
    ids = torch.tensor([[5, 6, 7, MASK, MASK, MASK]])
    with torch.no_grad():
        got = loaded.model(ids).logits
        want = reference(ids).logits
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got[0, 0], reference.float()(ids[:, :1]).logits[0, 0])  # sees ahead


def test_the_dream_drafter_is_lossless(dream_dir, target):
    drafter = DiffusionDrafter.from_pretrained(dream_dir, target)
    assert drafter.config.shift and drafter.config.max_context == DREAM_CONTEXT
    ids = torch.tensor([[3, 4, 5, 6, 3, 4, 5]])
    out = generate(target, drafter, ids, max_new_tokens=20)
    with torch.no_grad():
        ref = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=20)
    assert torch.equal(out.sequences, ref[:, :out.sequences.shape[1]])
    assert out.sequences.shape[1] == ref.shape[1]


def test_the_naive_baseline_loads_too(dream_dir, target):
    # NaiveDiffusionDrafter.from_pretrained failed: "got multiple values for keyword 'config'"
    from mmspec import NaiveDiffusionDrafter

    drafter = NaiveDiffusionDrafter.from_pretrained(dream_dir, target, k=6)
    cfg = drafter.config
    assert (cfg.fixed_k, cfg.cps, cfg.shift, cfg.max_context) == (6, None, True, DREAM_CONTEXT)
    ids = torch.tensor([[3, 4, 5, 6, 3, 4, 5]])
    out = generate(target, drafter, ids, max_new_tokens=12)
    with torch.no_grad():
        ref = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=12)
    assert torch.equal(out.sequences, ref)


def test_missing_weights_are_refused_not_initialised(dream_dir):
    weights = load_file(dream_dir / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, dream_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"path: the weights in .* do not fit Qwen2ForCausalLM "
                                         r"\(model_type 'Dream'\): missing \['model.layers.1.mlp"):
        load_diffusion_lm(dream_dir)


def test_checkpoints_it_cannot_use_are_named(dream_dir, tmp_path, target):
    config = json.loads((dream_dir / "config.json").read_text())
    with pytest.raises(ValueError, match="config.shift=False but the checkpoint .* shift=True"):
        DiffusionDrafter.from_pretrained(dream_dir, target,
                                         config=DiffusionDrafterConfig(shift=False))
    (dream_dir / "config.json").write_text(json.dumps({**config, "mask_token_id": None}))
    with pytest.raises(ValueError, match="has no mask_token_id"):
        load_diffusion_lm(dream_dir)
    (dream_dir / "config.json").write_text(json.dumps({**config, "model_type": "llada"}))
    with pytest.raises(NotImplementedError, match="is a LLaDA checkpoint"):
        load_diffusion_lm(dream_dir)
    with pytest.raises(FileNotFoundError, match="is not a checkpoint folder"):
        load_diffusion_lm(tmp_path / "nothing")


def test_the_cli_drafts_with_a_dream_folder(tmp_path, capsys):
    """The zoo's text-dlm (a Qwen2 trained as a Dream-style DLM) repackaged as Dream ships."""
    from mmspec.__main__ import main
    from mmspec.zoo.paths import ZOO_DIR

    shipped = json.loads((ZOO_DIR / "text-dlm" / "config.json").read_text())
    dream = tmp_path / "dream"
    dream.mkdir()
    (dream / "model.safetensors").write_bytes((ZOO_DIR / "text-dlm" / "model.safetensors")
                                              .read_bytes())
    fields = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "hidden_act", "rms_norm_eps",
              "tie_word_embeddings", "max_position_embeddings", "mask_token_id", "eos_token_id")
    (dream / "config.json").write_text(json.dumps({
        "architectures": ["DreamModel"], "model_type": "Dream",
        "rope_theta": shipped["rope_parameters"]["rope_theta"],
        **{name: shipped[name] for name in fields}}))
    argv = ["generate", "--target", str(ZOO_DIR / "text-target"), "--drafter",
            f"diffusion:{dream}", "--prompt", "def fib(n):", "--max-new-tokens", "16",
            "--device", "cpu", "--threads", "1"]
    assert main(argv) == 0
    assert "identical to target-only greedy" in capsys.readouterr().err
    for name in ("tokenizer.json", "tokenizer_config.json"):  # a tokenizer of other ids
        (dream / name).write_bytes((ZOO_DIR / "vlm-processor" / name).read_bytes())
    with pytest.raises(SystemExit, match=r"--drafter diffusion:.*: vocabulary mismatch"):
        main(argv)
