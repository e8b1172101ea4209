"""benchmarks/text.py's settings table names the values HF's assisted generation ran with."""

import sys
from pathlib import Path

import mmspec.zoo

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.text import HF_ASSIST, HF_TUNED, build_methods


def test_hf_assistant_rows_name_the_settings_they_run_with():
    # the table printed a blank GenerationConfig() ("num_assistant_tokens=None, schedule None"):
    # HF fills the assistant's unset fields with transformers' defaults when it runs
    target, drafter = mmspec.zoo.load("text-target"), mmspec.zoo.load("text-drafter").model
    methods = {m.name: m for m in build_methods(target.model, drafter, drafter,
                                                mmspec.zoo.load("text-dlm"),
                                                target.tokenizer.eos_token_id, 20)}
    assert methods[HF_ASSIST].settings.endswith(
        "num_assistant_tokens=20, schedule 'constant', assistant_confidence_threshold=0.4")
    assert methods[HF_TUNED].settings.endswith(
        "num_assistant_tokens=5, schedule 'constant', assistant_confidence_threshold=0.0")
    assert drafter.generation_config.num_assistant_tokens is None  # the tuned row has a copy
