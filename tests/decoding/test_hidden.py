"""Targets whose hidden states do not fit a hidden-state drafter (`mmspec/decoding/hidden.py`):
the architecture sweep's tiny Gemma 3n (AltUp streams `[2, B, L, H]`), Qwen4-Exp (inner layers
4 H wide), HunYuan-V4 (hyper-connections `[B, L, 4, H]`) and LongCat-Flash (fewer
`hidden_states` entries than `num_hidden_layers`), with a DFlash and an EAGLE-3 drafter: refused
with one line before anything is streamed, or, reading entries that fit, token-identical to
their own `generate`."""

import pytest
import torch

from mmspec import DFlashDrafter, UnsupportedTarget, generate
from mmspec.eagle.eagle3_train import new_eagle3_drafter
from tests.decoding import arch_sweep
from tests.diffusion.dflash_reference import dflash_raw_config, random_state, write_checkpoint

# model type -> what its hidden states are, as the refusal names them
UNFIT = {"gemma3n_text": r"is \[2, 1, 11, 64\]", "qwen4_exp_text": r"is \[1, 11, 256\]",
         "hy_v4": r"is \[1, 11, 4, 64\]", "longcat_flash": r"returns 3 entries"}
# model type -> DFlash target layer ids whose hidden_states entries are [B, L, H] (none in Gemma 3n)
FIT = {"qwen4_exp_text": [1], "hy_v4": [1], "longcat_flash": [0, 1]}


class Recorder:
    """A streamer that keeps what it is handed."""

    def __init__(self):
        self.put_calls, self.ended = [], False

    def put(self, value):
        self.put_calls.append(value)

    def end(self):
        self.ended = True


@pytest.fixture(scope="module")
def models():
    built = {}

    def get(model_type, second=False):
        if (model_type, second) not in built:
            built[model_type, second] = arch_sweep.build(model_type, second=second)
        return built[model_type, second]

    return get


def dflash(tmp_path, model, layer_ids):
    raw = dflash_raw_config(model, mask=5, layer_ids=layer_ids)
    raw["vocab_size"] = model.get_input_embeddings().weight.shape[0]
    return DFlashDrafter.from_pretrained(
        write_checkpoint(tmp_path / "d", raw, random_state(raw)), model)


def refused_before_streaming(model, drafter, match):
    streamer = Recorder()
    with pytest.raises(UnsupportedTarget, match=match) as err:
        generate(model, drafter, arch_sweep.PROMPTS[:1], max_new_tokens=arch_sweep.NEW_TOKENS,
                 do_sample=False, pad_token_id=0, streamer=streamer)
    assert "\n" not in str(err.value)
    assert streamer.put_calls == []  # not even the prompt


def token_identical(model, drafter):
    prompts, mask = arch_sweep.PROMPTS[:2], arch_sweep.MASK[:2]
    new = arch_sweep.NEW_TOKENS
    ref = model.generate(prompts, attention_mask=mask, max_new_tokens=new, do_sample=False,
                         pad_token_id=0)
    out = generate(model, drafter, prompts, attention_mask=mask, max_new_tokens=new,
                   do_sample=False, pad_token_id=0)
    assert torch.equal(out.sequences, ref)


@pytest.mark.parametrize("model_type", list(UNFIT))
def test_dflash_on_unfit_hidden_states_is_refused_before_the_first_token(tmp_path, models,
                                                                         model_type):
    model = models(model_type)
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    name = type(model).__name__
    refused_before_streaming(model, dflash(tmp_path, model, [0, layers - 1]),
                             rf"^{name}: .*hidden_states entry \d+ .*{UNFIT[model_type]}")


@pytest.mark.parametrize("model_type", list(FIT))
def test_dflash_reading_entries_that_fit_is_token_identical(tmp_path, models, model_type):
    model = models(model_type)
    token_identical(model, dflash(tmp_path, model, FIT[model_type]))


@pytest.mark.parametrize("model_type", list(UNFIT))
def test_eagle3_on_unfit_hidden_states_is_refused_before_the_first_token(models, model_type):
    model = models(model_type, second=True)  # three layers: EAGLE-3 reads three
    # LongCat-Flash's default layers (1, 3, 5) of its 6 counted ones: past its 4 entries
    layers = None if model_type == "longcat_flash" else (0, 1, 2)
    torch.manual_seed(0)
    drafter = new_eagle3_drafter(model, layers=layers, intermediate_size=64)
    refused_before_streaming(model, drafter, rf"^{type(model).__name__}: .*hidden_states entry")


def test_eagle3_reading_entries_that_fit_is_token_identical(models):
    model = models("longcat_flash", second=True)
    torch.manual_seed(0)
    token_identical(model, new_eagle3_drafter(model, layers=(0, 1, 2), intermediate_size=64))


def test_check_hidden_names_the_entry_and_both_shapes():
    from mmspec.decoding.hidden import check_hidden

    plain, target = torch.zeros(1, 11, 64), torch.nn.Linear(1, 1)
    check_hidden(target, (plain, plain), (0, -1), None, 1, 11)  # any width when none is declared
    cases = [((plain, torch.zeros(1, 11, 4, 64)), None, r"entry 1 is \[1, 11, 4, 64\], .* = "
                                                        r"\[1, 11, 'width'\]"),
             ((plain, plain), 32, r"entry 0 is \[1, 11, 64\], .* = \[1, 11, 32\]"),
             ((plain, torch.zeros(1, 10, 64)), None, r"entry 1 is \[1, 10, 64\]"),
             ((plain, plain), 64, r"entry -3 .* returns 2 entries \(ids in \[-2, 2\)\)"),
             (None, 64, r"^Linear: its forward returns no hidden_states")]
    for states, width, match in cases:
        layers = (0, -3) if "-3" in match else (0, 1)
        with pytest.raises(UnsupportedTarget, match=match):
            check_hidden(target, states, layers, width, 1, 11)
