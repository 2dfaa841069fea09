"""SmolLM3 (transformers' ``SmolLM3ForCausalLM``): Llama with no RoPE on every fourth layer.

The difference from :mod:`.llama`: step 2.2 rotates q and k only on the layers whose
``no_rope_layers`` entry is 1 (transformers' name: the list says which layers *use* RoPE;
default ``int((i + 1) % no_rope_layer_interval != 0)``, interval 4: layers 3, 7, 11, ... are NoPE).
Read as ``config.rope_layers``. The head is tied by default; ``use_sliding_window`` is refused by name.
"""
from __future__ import annotations

from ..family import COMPUTED, NEUTRAL
from .llama import FAMILY as LLAMA

__all__ = ["FAMILY"]

MODEL_TYPE = "smollm3"


def read(d):
    layers = d["num_hidden_layers"]
    flags = d.get("no_rope_layers")
    if flags is None:
        interval = d.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(flags, list) or len(flags) != layers or any(f not in (0, 1) or isinstance(f, float)
                                                                   for f in flags):
        raise ValueError(f"{MODEL_TYPE}: no_rope_layers must list 0 or 1 for each of the {layers} layers,"
                         f" got {flags!r}")
    return LLAMA.read(d, MODEL_TYPE, rope_layers=tuple(bool(f) for f in flags),
                      tie_word_embeddings=d.get("tie_word_embeddings", True))


#: SmolLM3Config's keys: Llama's, the NoPE layers computed, its sliding window's switch refused on (the window
#: and max_window_layers are read only when it is on)
KEYS = {**LLAMA.keys, "no_rope_layers": COMPUTED, "no_rope_layer_interval": COMPUTED, "use_sliding_window": (False,),
        "sliding_window": NEUTRAL, "max_window_layers": NEUTRAL}

FAMILY = LLAMA._replace(
    model_type=MODEL_TYPE, read=read, keys=KEYS, allowed=LLAMA.allowed + ("rope_layers",),
    fields=LLAMA.fields._replace(optional_positive=LLAMA.fields.optional_positive + ("no_rope_layer_interval",)),
    block_title="transformers SmolLM3DecoderLayer (layers.<i>.)", float32_steps=(("smollm3", "SmolLM3"),))

FAMILY = FAMILY._replace(example={**LLAMA.example, "no_rope_layers": [1, 0], "use_sliding_window": False})  # a small model
