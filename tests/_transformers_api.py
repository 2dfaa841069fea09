"""How the installed transformers takes and returns a model's KV cache, asked of the installed
release itself (its forward's signature, its output's fields), never of a version string.

transformers 5.24 renamed the keyword ``past_key_values`` to ``cache`` (the old name warns with a
FutureWarning, to be removed in 5.40) and the output field likewise; 4.57.1, the pinned release,
knows only ``past_key_values``. The decoding checks call these two helpers and so run the API of
whichever release is installed.
"""
from __future__ import annotations

import inspect


def cache_keyword(model) -> str:
    """The name under which ``model``'s forward takes the cache of earlier steps."""
    parameters = inspect.signature(type(model).forward).parameters
    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    raise TypeError(f"{type(model).__name__}.forward takes neither `cache` nor `past_key_values`: "
                    f"{list(parameters)}")


def with_cache(model, cache) -> dict:
    """Keyword arguments that hand ``cache`` (None on the first step) to ``model`` and ask for the next."""
    return {cache_keyword(model): cache, "use_cache": True}


def returned_cache(output):
    """The cache a forward returned, read from the field the installed release defines."""
    fields = getattr(type(output), "__dataclass_fields__", {})
    for name in ("cache", "past_key_values"):
        if name in fields:
            return getattr(output, name)
    raise TypeError(f"{type(output).__name__} has neither a `cache` nor a `past_key_values` field: {list(fields)}")


def penalty_skips_padding() -> bool:
    """Whether the installed generate leaves the left padding out of the repetition penalty
    (asked of its own source: 4.57's processor takes ``prompt_ignore_length`` but generate
    does not pass it)."""
    from transformers.generation.utils import GenerationMixin

    return "prompt_ignore_length" in inspect.getsource(GenerationMixin._get_logits_processor)
