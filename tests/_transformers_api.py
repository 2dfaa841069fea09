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


def decode_side_by_side(model, decoder, ids, mask, steps):
    """Our ``decoder`` (an ``LMDecoder``) and transformers' ``model`` on the same left-padded prompts
    ``ids`` (B, T) with ``mask`` (torch tensors), then the new tokens ``steps`` (B, n) one at a time, the
    model on its own cache with the positions and masks ``generate`` gives it. Returns
    ``(ours, theirs)``: the last position's logits after the prompt and after each step."""
    import torch

    ours = [decoder.prefill(ids.numpy(), mask.numpy())[:, -1]]
    ours += [decoder.step(steps[:, i].numpy()) for i in range(steps.shape[1])]
    with torch.no_grad():
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        res = model(ids, attention_mask=mask, position_ids=positions, **with_cache(model, None))
        theirs, past = [res.logits[:, -1]], returned_cache(res)
        for i in range(steps.shape[1]):
            mask = torch.cat([mask, torch.ones(mask.shape[0], 1, dtype=mask.dtype)], dim=1)
            positions = positions[:, -1:] + 1
            res = model(steps[:, i:i + 1], attention_mask=mask, position_ids=positions, **with_cache(model, past))
            theirs.append(res.logits[:, -1])
            past = returned_cache(res)
    return ours, theirs
