"""Qwen3 (transformers' ``Qwen3ForCausalLM``): Llama with an RMSNorm over each head's q and k.

The difference from :mod:`.llama`: in step 2.2, after the head split and before RoPE,
``q_hat = RMSNorm_q(q)``, ``k_hat = RMSNorm_k(k)`` over each head's Dh features, one weight (Dh,)
each shared by the heads (:class:`attention_ref.nn.llama_block.QKNormRotary`); ``head_dim`` may
differ from ``hidden_size / num_attention_heads``.
"""
from __future__ import annotations

from ..family import NEUTRAL, Features, Tensor
from .llama import FAMILY as LLAMA

__all__ = ["FAMILY"]

MODEL_TYPE = "qwen3"

#: Llama's block, and the two norms (Dh,)
BLOCK = LLAMA.block + (
    Tensor(("self_attn.q_norm.weight",), "self_attn.q_norm.weight", "as is", lambda c: (c.d_head,), "ones"),
    Tensor(("self_attn.k_norm.weight",), "self_attn.k_norm.weight", "as is", lambda c: (c.d_head,), "ones"),
)

#: Qwen3Config's keys: Llama's, and its sliding window's switch (refused on); the window
#: and max_window_layers are read by transformers only when use_sliding_window is true
KEYS = {**LLAMA.keys, "use_sliding_window": (False,), "sliding_window": NEUTRAL, "max_window_layers": NEUTRAL}

FAMILY = LLAMA._replace(model_type=MODEL_TYPE, read=lambda d: LLAMA.read(d, MODEL_TYPE), keys=KEYS,
                        features=Features(qk_norm="head"), block=BLOCK,
                        block_title="transformers Qwen3DecoderLayer (layers.<i>.)",
                        float32_steps=(("qwen3", "Qwen3"),))

FAMILY = FAMILY._replace(example={**LLAMA.example, "head_dim": 4, "use_sliding_window": False})  # a small model
