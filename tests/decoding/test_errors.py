"""Bad input raises a ValueError that names the argument."""

import pytest
import torch
from spec_helpers import tiny_llama

from mmspec import Draft, ModelDrafter, PromptLookupDrafter, generate


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0)


IDS = torch.tensor([[5, 6, 7, 8]])


def test_vocabulary_mismatch(target):
    with pytest.raises(ValueError, match=r"drafter vocabulary \(32 tokens\).*target's \(64 tokens\)"):
        generate(target, ModelDrafter(tiny_llama(1, vocab=32)), IDS)


@pytest.mark.parametrize("bad", [0, -3, 2.5, None])
def test_max_new_tokens(target, bad):
    with pytest.raises(ValueError, match=f"max_new_tokens must be an int >= 1, got {bad!r}"):
        generate(target, PromptLookupDrafter(), IDS, max_new_tokens=bad)


def test_empty_prompt(target):
    with pytest.raises(ValueError, match=r"input_ids must hold at least one token per row, got "
                                         r"shape \(1, 0\)"):
        generate(target, PromptLookupDrafter(), IDS[:, :0])


@pytest.mark.parametrize("kwargs,message", [
    ({"depth": 0}, r"depth must be None or an int >= 1, got 0"),
    ({"top_k": 65}, r"top_k must be at most the drafter's vocabulary \(64 tokens\), got 65"),
])
def test_model_drafter_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelDrafter(tiny_llama(1), 4, **kwargs)


def test_batch_without_pad_token(target):
    target.generation_config.pad_token_id = None
    try:
        with pytest.raises(ValueError, match="batch of 2 rows needs a padding token.*pad_token_id"):
            generate(target, PromptLookupDrafter(), IDS.repeat(2, 1), eos_token_id=[])
        # with an EOS id, target.generate pads with it (and so does generate now; it refused)
        ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
        ref = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=12)
        out = generate(target, PromptLookupDrafter(), ids, max_new_tokens=12)
        assert torch.equal(out.sequences, ref)
    finally:
        target.generation_config.pad_token_id = 0


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_top_p_outside_unit_interval(target, bad):
    with pytest.raises(ValueError, match=rf"top_p must lie in \(0, 1\], got {bad!r}"):
        generate(target, PromptLookupDrafter(), IDS, do_sample=True, top_p=bad)


def test_right_padding_is_refused(target):
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="attention_mask must be left-padded"):
        generate(target, PromptLookupDrafter(), IDS.repeat(2, 1), attention_mask=mask)


class _BadDrafter:
    def __init__(self, draft):
        self.draft = draft

    def propose(self, state):
        return self.draft

    def update(self, result):
        pass


@pytest.mark.parametrize("draft,message", [
    (Draft.chain(torch.tensor([[70, 3]])), r"Draft.tokens must lie in \[0, 64\)"),
    (Draft(torch.tensor([[3, 4]]), torch.tensor([-1, 1])), "Draft.parents"),
    (Draft.chain(torch.tensor([[3, 4]]), torch.ones(1, 2, 10)), r"Draft.probs must be \[B=1, T=2, V=64\]"),
    (Draft.chain(torch.tensor([[3, 4]]), num_tokens=torch.tensor([3])),
     r"Draft.num_tokens must lie in \[0, T=2\], got \[3\]"),
    (Draft.chain(torch.tensor([[3, 4]]), num_tokens=torch.tensor([1.0])),
     r"Draft.num_tokens must be None or long \[B=1\], got torch.float32 \(1,\)"),
    (Draft.chain(torch.tensor([[3, 4]]), num_tokens=2), r"Draft.num_tokens .* got int 2"),
])
def test_malformed_draft(target, draft, message):
    with pytest.raises(ValueError, match=message):
        generate(target, _BadDrafter(draft), IDS, max_new_tokens=4)


def test_unapplied_generation_config_processors_are_refused(target):
    target.generation_config.no_repeat_ngram_size = 3
    try:
        with pytest.raises(ValueError, match=r"generation_config.no_repeat_ngram_size=3 .*set "
                                             r"target.generation_config.no_repeat_ngram_size = 0"):
            generate(target, PromptLookupDrafter(), IDS)
    finally:
        target.generation_config.no_repeat_ngram_size = None


def test_top_k_and_top_p_default_to_the_generation_config(target):
    from mmspec.decoding.settings import sampling_config

    target.generation_config.top_k, target.generation_config.top_p = 7, 0.8
    try:
        cfg = sampling_config(target, True, 1.0, None, None)
        assert (cfg.top_k, cfg.top_p) == (7, 0.8)
        cfg = sampling_config(target, True, 1.0, 3, 1.0)  # explicit arguments win
        assert (cfg.top_k, cfg.top_p) == (3, 1.0)
    finally:
        target.generation_config.top_k = target.generation_config.top_p = None


def test_unset_sampling_settings_resolve_as_target_generate_does(target):
    # transformers fills a field left at None in the generation config with its global default
    # (top-k 50 among them); reading None as "off" sampled from another distribution
    from mmspec.decoding.settings import sampling_config

    gen = target.generation_config
    assert (gen.do_sample, gen.temperature, gen.top_k, gen.top_p) == (None,) * 4
    assert sampling_config(target, None, None, None, None).do_sample is False
    cfg = sampling_config(target, True, None, None, None)
    assert (cfg.temperature, cfg.top_k, cfg.top_p) == (1.0, 50, 1.0)
    gen.do_sample, gen.temperature, gen.top_k = True, 0.5, 0  # top_k 0: no top-k, as in HF
    try:
        cfg = sampling_config(target, None, None, None, None)  # an instruct model's config
        assert (cfg.do_sample, cfg.temperature, cfg.top_k) == (True, 0.5, None)
        assert sampling_config(target, False, None, None, None).do_sample is False  # greedy: ok
        out = generate(target, PromptLookupDrafter(), IDS, max_new_tokens=4, do_sample=False)
        assert out.sequences.shape[1] == IDS.shape[1] + 4
    finally:
        gen.do_sample = gen.temperature = gen.top_k = None


@pytest.mark.parametrize("name,value", [("num_beams", 3), ("exponential_decay_length_penalty",
                                                           (2, 1.5)), ("stop_strings", ["\n"])])
def test_other_decoding_strategies_are_refused(target, name, value):
    setattr(target.generation_config, name, value)
    try:
        with pytest.raises(ValueError, match=f"generation_config.{name}="):
            generate(target, PromptLookupDrafter(), IDS, max_new_tokens=4)
    finally:
        setattr(target.generation_config, name, None)


def test_engine_owned_forward_arguments_are_refused(target):
    # they collided with the engine's own (a "multiple values for keyword" TypeError)
    with pytest.raises(ValueError, match="output_hidden_states, past_key_values: generate runs"):
        generate(target, PromptLookupDrafter(), IDS, max_new_tokens=4, past_key_values=None,
                 output_hidden_states=True)


@pytest.mark.parametrize("kwargs,message", [
    # generation settings passed to the call reached the prefill's **kwargs and were dropped
    ({"encoder_repetition_penalty": 5.0}, r"encoder_repetition_penalty=5.0 changes the target"),
    ({"no_repeat_ngram_size": 1}, r"no_repeat_ngram_size=1 changes the target's distribution"),
    ({"num_return_sequences": 3}, r"num_return_sequences=3 changes the target's distribution"),
    ({"output_scores": True}, r"output_scores=True: not supported: generate returns SpecOutput"),
    ({"bogus_arg": 1}, r"model_kwargs` are not used by the model: \['bogus_arg'\]"),
])
def test_generation_settings_and_typos_in_kwargs_are_refused(target, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(target, PromptLookupDrafter(), IDS, **kwargs)


def test_neutral_generation_settings_in_kwargs_pass(target):
    ref = generate(target, PromptLookupDrafter(), IDS, max_new_tokens=6).sequences
    out = generate(target, PromptLookupDrafter(), IDS, max_new_tokens=6, repetition_penalty=1.0,
                   num_return_sequences=1)
    assert torch.equal(out.sequences, ref)


def test_running_out_of_learned_positions_names_the_limit():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=24, n_embd=32, n_layer=1,
                                      n_head=2, eos_token_id=None, bos_token_id=None)).eval()
    ids = torch.randint(2, 60, (1, 10))
    with pytest.raises(ValueError, match=r"max_new_tokens=30: the prompt \(10 tokens\) and the "
                                         r"new tokens fed back need 39 positions, past the "
                                         r"target's n_positions=24.*ask for at most 15 new "
                                         r"tokens"):
        generate(gpt2, PromptLookupDrafter(), ids, max_new_tokens=30)
    # the last new token is never fed back: 15 fit, as in gpt2.generate (the hint said 14)
    out = generate(gpt2, PromptLookupDrafter(), ids, max_new_tokens=15).sequences
    ref = gpt2.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=15,
                        do_sample=False)
    assert out.shape[1] == 25 and torch.equal(out, ref)
    with pytest.raises(ValueError, match="ask for at most 15 new tokens"):
        generate(gpt2, PromptLookupDrafter(), ids, max_new_tokens=16)


@pytest.mark.parametrize("make, message", [
    # floats passed the checks and failed inside generate ('float' object cannot be interpreted
    # as an integer, topk(): argument 'k' must be int), or ran as if rounded, unnamed
    (lambda m: ModelDrafter(m, num_tokens=2.5), r"num_tokens must be an int >= 1, got 2.5"),
    (lambda m: ModelDrafter(m, 4, top_k=2.0), r"top_k must be an int >= 1, got 2.0"),
    (lambda m: ModelDrafter(m, 4, top_k=True), r"top_k must be an int >= 1, got True"),
    (lambda m: ModelDrafter(m, temperature=None), r"temperature must be a number >= 0, got None"),
    (lambda m: ModelDrafter(m, sample="yes"), r"sample must be a bool, got 'yes'"),
    (lambda m: PromptLookupDrafter(num_tokens=2.5), r"num_tokens must be an int >= 1, got 2.5"),
    (lambda m: PromptLookupDrafter(max_ngram_size=1.5), r"max_ngram_size must be an int >= 1"),
])
def test_drafter_arguments_of_the_wrong_type_are_named(target, make, message):
    with pytest.raises(ValueError, match=message):
        make(target)


def test_an_attention_mask_that_is_not_a_tensor_is_named(target):
    with pytest.raises(ValueError, match=r"attention_mask must be a tensor \[B, L\] or None, "
                                         r"got list"):
        generate(target, PromptLookupDrafter(), IDS, attention_mask=[[1] * IDS.shape[1]])


def test_a_model_passed_as_the_drafter_is_named(target):
    # AttributeError: 'LlamaForCausalLM' object has no attribute 'propose'
    with pytest.raises(TypeError, match=r"drafter must be a drafter .*got LlamaForCausalLM: "
                                        r"wrap a small model as ModelDrafter\(model\)"):
        generate(target, tiny_llama(1), IDS)
    with pytest.raises(TypeError, match="got NoneType"):
        generate(target, None, IDS)


def test_a_numpy_int_max_new_tokens(target):
    np = pytest.importorskip("numpy")
    out = generate(target, ModelDrafter(tiny_llama(1)), IDS, max_new_tokens=np.int64(3))
    assert out.sequences.shape[1] == IDS.shape[1] + 3


@pytest.mark.parametrize("kwargs, message", [
    ({"max_length": 20}, "max_length=20: give max_new_tokens instead"),
    ({"return_dict_in_generate": True}, "not supported: generate returns SpecOutput"),
    ({"generation_config": "greedy"}, "generation_config must be a transformers "
                                      "GenerationConfig or None, got str"),
    ({"do_sample": True, "temperature": "0.7"}, "temperature must be a number, got '0.7'"),
])
def test_generate_arguments_of_target_generate_it_does_not_take(target, kwargs, message):
    # each was refused with a misleading reason, a typo note or a TypeError
    with pytest.raises(ValueError, match=message):
        generate(target, ModelDrafter(tiny_llama(1)), IDS, max_new_tokens=3, **kwargs)


def test_a_row_of_padding_only_is_named(target):
    ids = torch.tensor([[0, 0, 0], [5, 6, 7]])
    with pytest.raises(ValueError, match="attention_mask: row 0 has no real token"):
        generate(target, ModelDrafter(tiny_llama(1)), ids, max_new_tokens=3,
                 attention_mask=torch.tensor([[0, 0, 0], [1, 1, 1]]))


def test_numpy_sampling_numbers(target):
    np = pytest.importorskip("numpy")
    out = generate(target, ModelDrafter(tiny_llama(1)), IDS, max_new_tokens=3, do_sample=True,
                   temperature=np.float32(0.7), top_p=np.float32(0.9))
    assert out.sequences.shape[1] == IDS.shape[1] + 3


def test_token_ids_as_target_generate_takes_them(target):
    # numpy ids failed with "'numpy.int64' object is not iterable"; strings with messages that
    # named no argument
    np = pytest.importorskip("numpy")
    ids = torch.tensor([[5, 6, 7], [0, 8, 9]])
    mask = (ids != 0).long()
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False,
                          eos_token_id=np.int64(1), pad_token_id=0)
    out = generate(target, ModelDrafter(tiny_llama(1)), ids, attention_mask=mask,
                   max_new_tokens=4, eos_token_id=np.int64(1), pad_token_id=np.int64(0))
    assert torch.equal(out.sequences, ref)
    for kwargs, message in (({"eos_token_id": "1"}, "eos_token_id must be an int or a list of "
                                                    "ints, got '1'"),
                            ({"eos_token_id": [1, 2.5]}, r"got \[1, 2.5\]"),
                            ({"pad_token_id": "x"}, "pad_token_id must be an int, got 'x'")):
        with pytest.raises(ValueError, match=message):
            generate(target, ModelDrafter(tiny_llama(1)), IDS, max_new_tokens=3, **kwargs)


def test_a_bidirectional_target_is_refused(target):
    # a diffusion LM's config (is_causal=False) as the target: ran, and differed from its own
    # generate; the check reads the config, so this is the same tiny Llama marked bidirectional
    target.config.is_causal = False
    try:
        with pytest.raises(ValueError, match=r"target: its config says is_causal=False"):
            generate(target, PromptLookupDrafter(), IDS, max_new_tokens=3)
    finally:
        del target.config.is_causal
    assert generate(target, PromptLookupDrafter(), IDS, max_new_tokens=3).sequences.shape[1] == 7
