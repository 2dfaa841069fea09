"""Qwen2 / Qwen2.5 (transformers' ``Qwen2ForCausalLM``): Llama with biases on the q, k and v projections.

The difference from :mod:`.llama`: step 2.2's projections are ``q = z W_q + b_q``, ``k = z W_k + b_k``,
``v = z W_v + b_v`` (no bias on ``o_proj``); their gradients are the projections' bias gradients.
Qwen2's sliding window (``use_sliding_window``) is refused by name.
"""
from __future__ import annotations

from ..family import NEUTRAL, Features, Tensor
from .llama import FAMILY as LLAMA

__all__ = ["FAMILY"]

MODEL_TYPE = "qwen2"

#: Llama's block, and the three biases
BLOCK = LLAMA.block + (
    Tensor(("self_attn.b_q",), "self_attn.q_proj.bias", "as is", lambda c: (c.num_heads * c.d_head,), "zeros"),
    Tensor(("self_attn.b_k",), "self_attn.k_proj.bias", "as is", lambda c: (c.num_kv_heads * c.d_head,), "zeros"),
    Tensor(("self_attn.b_v",), "self_attn.v_proj.bias", "as is", lambda c: (c.num_kv_heads * c.d_head,), "zeros"),
)

#: Qwen2Config's keys: Llama's, and its sliding window's switch (refused on); the window
#: and max_window_layers are read by transformers only when use_sliding_window is true
KEYS = {**LLAMA.keys, "use_sliding_window": (False,), "sliding_window": NEUTRAL, "max_window_layers": NEUTRAL}

FAMILY = LLAMA._replace(model_type=MODEL_TYPE, read=lambda d: LLAMA.read(d, MODEL_TYPE), keys=KEYS,
                        features=Features(qkv_bias=True), block=BLOCK,
                        block_title="transformers Qwen2DecoderLayer (layers.<i>.)",
                        float32_steps=(("qwen2", "Qwen2"),))

FAMILY = FAMILY._replace(example={**LLAMA.example, "use_sliding_window": False})  # a small model
