"""Mistral (transformers' ``MistralForCausalLM``): Llama with a sliding window on every layer.

The difference from :mod:`.llama`: step 2.2's causal mask keeps the keys ``i - W < j <= i`` of
query ``i``, ``W = sliding_window`` (``config.json``'s; null: every earlier key).
"""
from __future__ import annotations

from ..family import COMPUTED
from .llama import FAMILY as LLAMA

__all__ = ["FAMILY"]

MODEL_TYPE = "mistral"

def read(d):
    """Llama's reading, with transformers' default window 4096 when ``sliding_window`` is absent
    (an explicit null: every earlier key)."""
    return LLAMA.read(d, MODEL_TYPE, sliding_window=d.get("sliding_window", 4096))


#: MistralConfig's keys: Llama's, with the window computed (every layer)
KEYS = {**LLAMA.keys, "sliding_window": COMPUTED}

FAMILY = LLAMA._replace(model_type=MODEL_TYPE, read=read, keys=KEYS,
                        allowed=LLAMA.allowed + ("sliding_window",), float32_steps=(("mistral", "Mistral"),))

FAMILY = FAMILY._replace(example={**LLAMA.example, "sliding_window": 4096})  # a small model
