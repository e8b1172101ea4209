"""The KV cache's argument name. transformers 5.24 renamed the forward argument and the output
field `past_key_values` to `cache`; the old name warns on every call and goes in 5.40. Models on
older transformers, and remote code such as Dream's, still take `past_key_values`."""

from __future__ import annotations

import functools
import inspect


def _renamed() -> bool:
    from transformers import GenerationMixin

    return "cache" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters


_RENAMED = _renamed()


def cache_kwargs(method, cache) -> dict:
    """`{"cache": cache}` or `{"past_key_values": cache}`: the name `method` (a model's `forward`
    or `prepare_inputs_for_generation`) takes. A method that names neither (`**kwargs` only:
    Gemma 3's `prepare_inputs_for_generation`, a `torch.compile`d forward) gets the installed
    transformers' name."""
    fn = getattr(method, "__func__", None)  # a bound method: its class's function, cached
    return {_name_of_function(fn) if fn is not None else _name_of(method): cache}


@functools.lru_cache(maxsize=None)
def _name_of_function(fn) -> str:
    # only plain class functions are cached (the verify loop and the drafter call this every
    # round); a per-instance callable (accelerate's hook partial) would keep its model alive
    return _name_of(fn)


def _name_of(method) -> str:
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):  # a builtin or C callable
        params = {}
    if "cache" in params:
        return "cache"
    if "past_key_values" in params or not _RENAMED:
        return "past_key_values"
    return "cache"


def output_cache(out):
    """The cache a model output returned, under either name."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)
