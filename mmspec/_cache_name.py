"""The KV cache's argument name. transformers 5.24 renamed the forward argument and the output
field `past_key_values` to `cache`; the old name warns on every call and goes in 5.40. Models on
older transformers, and remote code such as Dream's, still take `past_key_values`."""

from __future__ import annotations

import functools
import inspect


@functools.lru_cache(maxsize=None)
def _takes_cache(fn) -> bool:
    try:
        return "cache" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: the old name
        return False


def cache_kwargs(method, cache) -> dict:
    """`{"cache": cache}` or `{"past_key_values": cache}`: the name `method` (a model's
    `forward` or `prepare_inputs_for_generation`) takes."""
    fn = getattr(method, "__func__", method)  # a bound method's function: one entry per class
    return {"cache": cache} if _takes_cache(fn) else {"past_key_values": cache}


def output_cache(out):
    """The cache a model output returned, under either name."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)
