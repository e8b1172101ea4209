import inspect
import warnings

import torch
from spec_helpers import VOCAB, tiny_llama

from mmspec import PromptLookupDrafter, generate
from mmspec._cache_name import cache_kwargs, output_cache


class _OldModel(torch.nn.Module):  # remote code (Dream) and transformers < 5.24
    def forward(self, input_ids, past_key_values=None, use_cache=False):
        return input_ids


def test_the_cache_goes_under_the_name_the_model_takes():
    target = tiny_llama(0)
    new = "cache" in inspect.signature(type(target).forward).parameters  # transformers >= 5.24
    assert cache_kwargs(target.forward, 1) == ({"cache": 1} if new else {"past_key_values": 1})
    assert cache_kwargs(_OldModel().forward, 1) == {"past_key_values": 1}
    out = target(torch.tensor([[5, 6, 7]]), use_cache=True)
    assert output_cache(out) is not None and output_cache(out).get_seq_length() == 3


def test_generate_and_its_drafters_raise_no_cache_name_deprecation():
    # transformers 5.24 warns on every `past_key_values=` and removes the name in 5.40
    target = tiny_llama(0)
    ids = torch.randint(3, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*", category=FutureWarning)
        out = generate(target, PromptLookupDrafter(4, 2), ids, max_new_tokens=8, eos_token_id=[])
    ref = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=8, eos_token_id=[])
    assert torch.equal(out.sequences, ref)


def test_a_kwargs_only_method_gets_the_installed_transformers_name():
    # Gemma 3 overrides prepare_inputs_for_generation with **kwargs only; it got the old name and
    # warned on every call (and would lose the cache once 5.40 drops the alias)
    from transformers import GenerationMixin

    def kwargs_only(input_ids, **kwargs):
        return kwargs

    renamed = "cache" in inspect.signature(
        GenerationMixin.prepare_inputs_for_generation).parameters
    assert cache_kwargs(kwargs_only, 1) == ({"cache": 1} if renamed else {"past_key_values": 1})


def test_the_name_lookup_keeps_no_model_alive():
    import functools
    import gc
    import weakref

    target = tiny_llama(0)
    target.forward = functools.partial(type(target).forward, target)  # as accelerate's hooks do
    assert cache_kwargs(target.forward, None) == cache_kwargs(tiny_llama(0).forward, None)
    ref = weakref.ref(target)
    del target
    gc.collect()
    assert ref() is None
