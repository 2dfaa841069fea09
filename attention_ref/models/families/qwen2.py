"""Qwen2 / Qwen2.5 (transformers' ``Qwen2ForCausalLM``): Llama with biases on the q, k and v projections.

The difference from :mod:`.llama`: step 2.2's projections are ``q = z W_q + b_q``, ``k = z W_k + b_k``,
``v = z W_v + b_v`` (no bias on ``o_proj``); their gradients are the projections' bias gradients.
Qwen2's sliding window (``use_sliding_window``) is refused by name.
"""
from __future__ import annotations

from ..family import Features, Tensor
from .llama import FAMILY as LLAMA

__all__ = ["FAMILY"]

MODEL_TYPE = "qwen2"

#: Llama's block, and the three biases
BLOCK = LLAMA.block + (
    Tensor(("self_attn.b_q",), "self_attn.q_proj.bias", "as is", lambda c: (c.num_heads * c.d_head,), "zeros"),
    Tensor(("self_attn.b_k",), "self_attn.k_proj.bias", "as is", lambda c: (c.num_kv_heads * c.d_head,), "zeros"),
    Tensor(("self_attn.b_v",), "self_attn.v_proj.bias", "as is", lambda c: (c.num_kv_heads * c.d_head,), "zeros"),
)

FAMILY = LLAMA._replace(model_type=MODEL_TYPE, read=lambda d: LLAMA.read(d, MODEL_TYPE),
                        features=Features(qkv_bias=True), block=BLOCK,
                        block_title="transformers Qwen2DecoderLayer (layers.<i>.)",
                        float32_steps=(("qwen2", "Qwen2"),))
