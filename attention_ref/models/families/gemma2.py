"""Gemma 2 (transformers' ``Gemma2ForCausalLM``): Gemma 3's block without q/k norms, with soft caps.

The differences from :mod:`.gemma3_text`: one RoPE base for every layer (no scaling); the layers
alternate sliding and global, sliding first; no q/k norms; step 2.2's scaled scores become
``attn_softcap * tanh(S / attn_softcap)`` before the mask (``attn_logit_softcapping``), and after
step 4 a fifth step caps the logits (:func:`attention_ref.nn.soft_cap.soft_cap_formula`):

5. ``logits = final_softcap * tanh(z / final_softcap)``   (``final_logit_softcapping``)
"""
from __future__ import annotations


from ...nn.soft_cap import soft_cap_backward_formula, soft_cap_formula
from ..config import refuse
from ..family import COMPUTED, Features
from .gemma3_text import FAMILY as GEMMA3, GEMMA_ALLOWED, read_gemma
from .llama import rope_spellings

__all__ = ["FAMILY"]

MODEL_TYPE = "gemma2"


def read(d):
    """Gemma 3's reading (layer types, head_dim, query_pre_attn_scalar) with one RoPE base for
    every layer (no scaling) and the two soft caps."""
    for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = d.get(cap)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value < float("inf")):
            raise ValueError(f"{MODEL_TYPE}: {cap} must be null or a positive number, got {value!r}")
    rope, theta = rope_spellings(d, MODEL_TYPE)  # 4.x's and 5.x's spellings; a conflict refused naming both
    if rope["rope_type"] != "default":
        refuse("the RoPE scaling rope_type", rope["rope_type"], MODEL_TYPE)
    as_gemma3 = {k: v for k, v in d.items() if k not in ("attn_logit_softcapping", "final_logit_softcapping",
                                                          "rope_parameters", "rope_scaling", "rope_theta")}
    as_gemma3.update(rope_theta=theta, rope_local_base_freq=theta)  # one base for both kinds of layer
    if "layer_types" not in d:  # transformers' Gemma 2 alternates, sliding first
        as_gemma3["layer_types"] = ["sliding_attention" if not i % 2 else "full_attention"
                                    for i in range(d["num_hidden_layers"])]
    return read_gemma(as_gemma3, MODEL_TYPE, max_positions=d.get("max_position_embeddings", 8192),
                      attn_softcap=d.get("attn_logit_softcapping", 50.0),  # transformers' defaults when absent
                      final_softcap=d.get("final_logit_softcapping", 30.0))  # (an explicit null: no cap)


def logits(z, config):
    """Step 5: the final soft cap (none when ``final_softcap`` is None)."""
    if config.final_softcap is None:
        return z, None
    return soft_cap_formula(z, config.final_softcap)


def logits_backward(dlogits, cache):
    return dlogits if cache is None else soft_cap_backward_formula(dlogits, cache)


#: Gemma 3's block without the q/k norms
BLOCK = tuple(t for t in GEMMA3.block if t.ours[0] not in ("self_attn.q_norm.weight", "self_attn.k_norm.weight"))

#: Gemma2Config's keys: Gemma 3's with the soft caps computed, and without the sliding layers' own base and the
#: pattern (Gemma 2 alternates; transformers' Gemma 2 reads neither)
KEYS = {**{k: v for k, v in GEMMA3.keys.items() if k not in ("rope_local_base_freq", "sliding_window_pattern",
                                                             "_sliding_window_pattern")},
        "attn_logit_softcapping": COMPUTED, "final_logit_softcapping": COMPUTED}

FAMILY = GEMMA3._replace(
    model_type=MODEL_TYPE, read=read, keys=KEYS, features=Features(norm_placement="sandwich"),
    allowed=GEMMA_ALLOWED + ("attn_softcap", "final_softcap"), block=BLOCK,
    block_title="transformers Gemma2DecoderLayer (layers.<i>.)",
    logits=logits, logits_backward=logits_backward)

#: a small Gemma 2 (attention_ref.interop.write_random_model)
FAMILY = FAMILY._replace(example={**{k: v for k, v in GEMMA3.example.items() if k != "rope_local_base_freq"},
                                  "rope_theta": 10000.0, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0})
