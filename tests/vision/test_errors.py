"""Bad input raises a clear error naming the argument."""

import pytest
import torch
from tiny_vlms import (
    llava_prompt,
    qwen_prompt,
    tiny_llava,
    tiny_llava_next,
    tiny_qwen2_5_vl,
)
from transformers import LlamaConfig, LlamaForCausalLM

from mmspec.decoding import DraftState
from mmspec.vision import ViSpecDrafter


@pytest.fixture(scope="module")
def llava():
    return tiny_llava()


def _state(ids, extras, hidden_size=64, hidden=True):
    return DraftState(input_ids=ids, attention_mask=torch.ones_like(ids), max_tokens=4,
                      position_ids=torch.tensor([[ids.shape[1] - 1]]), round=0,
                      target_hidden=torch.randn(1, ids.shape[1] - 1, hidden_size) if hidden else None,
                      extras=extras)


def test_unsupported_target_class():
    text_model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, vocab_size=64,
                                              num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(TypeError, match="target: unsupported class LlamaForCausalLM"):
        ViSpecDrafter.from_target(text_model)


def test_image_tokens_must_match_image_features(llava):
    ids, extras = llava_prompt(images=1, tokens_per_image=15)  # 16 features per image
    drafter = ViSpecDrafter.from_target(llava)
    with pytest.raises(ValueError, match="15 image tokens .* features have 16 tokens"):
        drafter.propose(_state(ids, extras))
    ids, extras = llava_prompt(images=2)
    with pytest.raises(ValueError, match="32 image tokens .* 0 tokens over 0 image"):
        drafter.propose(_state(ids, {}))  # image tokens but no pixel_values


def test_needs_target_hidden_states(llava):
    ids, extras = llava_prompt()
    with pytest.raises(ValueError, match="target_hidden is None"):
        ViSpecDrafter.from_target(llava).propose(_state(ids, extras, hidden=False))


def test_qwen_needs_mm_token_type_ids():
    target = tiny_qwen2_5_vl()
    ids, extras = qwen_prompt()
    del extras["mm_token_type_ids"]
    with pytest.raises(ValueError, match="mm_token_type_ids"):
        ViSpecDrafter.from_target(target).propose(_state(ids, extras))


@pytest.mark.parametrize("other", ["same_class_other_weights", "other_class"])
def test_drafter_saved_for_another_target(tmp_path, llava, other):
    ViSpecDrafter.from_target(llava).save_pretrained(tmp_path)
    target = tiny_llava(seed=1) if other == "same_class_other_weights" else tiny_qwen2_5_vl()
    reason = "embedding_signature" if other == "same_class_other_weights" else "class"
    with pytest.raises(ValueError, match=f"saved for a LlavaForConditionalGeneration.*{reason}"):
        ViSpecDrafter.from_pretrained(tmp_path, target)


def test_missing_checkpoint(tmp_path, llava):
    with pytest.raises(FileNotFoundError, match="path: no vispec_config.json"):
        ViSpecDrafter.from_pretrained(tmp_path, llava)


def test_broken_checkpoint_files_are_named(tmp_path, llava):
    # each came out as the parser's or loader's own error, without the file
    import json

    ViSpecDrafter.from_target(llava).save_pretrained(tmp_path)
    config = tmp_path / "vispec_config.json"
    good = config.read_text()
    for text, message in (("{not json", r"vispec_config.json is not JSON"),
                          ("[1, 2]", r"is not a ViSpec config \(a JSON object"),
                          (json.dumps({**json.loads(good), "extra": 1}),
                           r"has fields a ViSpec config does not: \['extra'\]"),
                          (json.dumps({**json.loads(good), "text_only": True}),
                           r"weights in .*model.safetensors do not fit the drafter its "
                           r"vispec_config.json describes \(unexpected \['adaptor"),
                          # the reason was torch's header line alone, with no key
                          (json.dumps({**json.loads(good), "num_layers": 2}),
                           r"describes \(missing \['head.layers.1"),
                          (json.dumps({k: v for k, v in json.loads(good).items()
                                       if k != "head_dim"}),
                           r"vispec_config.json lacks the fields \['head_dim'\]"),
                          (json.dumps({**json.loads(good), "target": None}),
                           r"'target' must be the target's signature \(a JSON object\), "
                           r"got None")):
        config.write_text(text)
        with pytest.raises(ValueError, match=message):
            ViSpecDrafter.from_pretrained(tmp_path, llava)
    config.write_text(good)
    with pytest.raises(TypeError, match=r"dtype must be a torch.dtype .*got 'float16'"):
        ViSpecDrafter.from_pretrained(tmp_path, llava, dtype="float16")
    (tmp_path / "model.safetensors").write_bytes(b"junk")
    with pytest.raises(ValueError, match=r"model.safetensors is not a safetensors file"):
        ViSpecDrafter.from_pretrained(tmp_path, llava)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="path: no model.safetensors in"):
        ViSpecDrafter.from_pretrained(tmp_path, llava)


@pytest.mark.parametrize("field, value, match", [
    ("depth", 0, r"ViSpecConfig.depth must be an int >= 1, got 0"),
    ("total_tokens", 1, r"total_tokens must be an int >= 2 \(the root and at least one"),
    ("num_queries", 1, r"ViSpecConfig.num_queries must be >= 2 .*, got 1"),
    ("mrope_section", (2, 2, 2), r"mrope_section \(2, 2, 2\) must sum to head_dim/2 = 8"),
    # floats, strings and bools where an int is expected: range(top_k) and friends failed later
    ("depth", 2.0, r"ViSpecConfig.depth must be an int >= 1, got 2.0"),
    ("top_k", "8", r"ViSpecConfig.top_k must be an int >= 1, got '8'"),
    ("num_layers", True, r"ViSpecConfig.num_layers must be an int >= 1, got True"),
    ("total_tokens", 30.5, r"ViSpecConfig.total_tokens must be an int >= 2 .*, got 30.5"),
    ("intermediate_size", None, r"ViSpecConfig.intermediate_size must be an int >= 1, got None"),
    ("rope_theta", "1e4", r"ViSpecConfig.rope_theta must be a finite number > 0, got '1e4'"),
    ("text_only", "no", r"ViSpecConfig.text_only must be a bool, got 'no'"),
    ("mrope_section", (4, 4.0), r"mrope_section must be None or a sequence of ints >= 0"),
])
def test_config_errors(llava, field, value, match):
    with pytest.raises(ValueError, match=match):
        ViSpecDrafter.from_target(llava, **{field: value})


def test_mrope_section_must_fit_the_targets_position_axes(llava):
    # LLaVA with an 8-sum section passed the config check, then generate failed in rope_cos_sin
    # ("index 1 is out of bounds for dimension 0 with size 1"); Qwen without one drafted 1-D
    with pytest.raises(ValueError, match=r"mrope_section: a LlavaForConditionalGeneration target "
                                         r"has one position axis, so its drafter takes no "
                                         r"mrope_section \(1-D RoPE\), got \(2, 3, 3\)"):
        ViSpecDrafter.from_target(llava, mrope_section=(2, 3, 3))
    qwen = tiny_qwen2_5_vl()
    for section in (None, (8,)):
        with pytest.raises(ValueError, match=r"Qwen2_5_VLForConditionalGeneration target has 3 "
                                             r"position axes \(M-RoPE\), so its drafter takes "
                                             r"3 sections, one per axis"):
            ViSpecDrafter.from_target(qwen, mrope_section=section)
    assert ViSpecDrafter.from_target(qwen, mrope_section=[4, 2, 2]).config.mrope_section == \
        (4, 2, 2)


def test_unknown_config_field(llava):
    with pytest.raises(TypeError, match="num_querys"):
        ViSpecDrafter.from_target(llava, num_querys=3)



def test_generate_refuses_a_drafter_built_for_another_target(llava):
    from mmspec import generate

    ids, extras = llava_prompt(images=1, seed=3)
    drafter = ViSpecDrafter.from_target(llava)
    same_shape = tiny_llava(seed=1)  # same sizes, other weights: ran A's vision tower silently
    wider = tiny_qwen2_5_vl()
    for other, why in ((same_shape, "embedding_signature"), (wider, "class")):
        with pytest.raises(ValueError, match=rf"target: this ViSpecDrafter was built for another "
                                             rf"LlavaForConditionalGeneration \({why}"):
            generate(other, drafter, ids, max_new_tokens=3, **extras)
    # the model it was built for, also behind torch.compile's wrapper, passes
    compiled = torch.compile(llava, backend="eager")
    drafter.check_target(compiled)
    assert generate(llava, drafter, ids, max_new_tokens=3, **extras).sequences.shape[1] == \
        ids.shape[1] + 3


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size"])
def test_target_bound_sizes_cannot_be_overridden(llava, field):
    with pytest.raises(ValueError, match=rf"{field}: a ViSpec drafter takes its target's {field} "
                                         rf"\(\d+\), got 32"):
        ViSpecDrafter.from_target(llava, **{field: 32})


def test_llava_next_needs_image_sizes():
    drafter = ViSpecDrafter.from_target(tiny_llava_next())
    with pytest.raises(ValueError, match="LLaVA-NeXT prompts with images need image_sizes"):
        drafter.adapter.image_features({"pixel_values": torch.randn(1, 3, 3, 32, 32)})


def test_processor_outputs_the_target_needs_are_named_before_its_prefill():
    # LLaVA-NeXT without image_sizes, Qwen2.5-VL without image_grid_thw: the target's own prefill
    # failed first, deep inside transformers ('NoneType' object is not iterable / has no
    # attribute 'device'), before the adapter's clearer check could run
    from tiny_vlms import no_eos, tiny_llava_next, tiny_qwen2_5_vl

    from mmspec import generate

    nxt = no_eos(tiny_llava_next())
    ids = torch.tensor([[1, 5] + [127] * 36 + [6, 7]])
    with pytest.raises(ValueError, match=r"^image_sizes: LLaVA-NeXT prompts with images need it"):
        generate(nxt, ViSpecDrafter.from_target(nxt), ids, max_new_tokens=3,
                 pixel_values=torch.randn(1, 3, 3, 32, 32))
    qwen = no_eos(tiny_qwen2_5_vl())
    ids = torch.tensor([[124, 127, 125, 5, 6]])
    with pytest.raises(ValueError, match=r"^image_grid_thw: Qwen2.5-VL prompts with pixel_values "
                                         r"need it"):
        generate(qwen, ViSpecDrafter.from_target(qwen), ids, max_new_tokens=3,
                 pixel_values=torch.randn(4, 96), mm_token_type_ids=(ids == 127).int())
