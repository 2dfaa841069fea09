"""Variants of attention built on the core: the same maths computed another way, or a
different attention. Each module may import from ``core`` (never from ``nn`` or above).

``blockwise`` (memory-efficient tiles with an online softmax, FlashAttention's algorithm;
``causal=`` and ``window=``), ``local`` (sliding-window masks), ``linear_attention``
(``phi(Q) (phi(K)^T V)``), ``rope`` (rotary position embedding, and ``RotaryHalf``, the multi-head path's rotary hook),
``kv_cache`` (the key/value cache of autoregressive decoding, a decoding step's checks and its attention), ``grouped_heads`` (multi-head attention with grouped-query
heads, a head mask and rotary positions around the core's plain layer: the public
``multi_head_attention_forward``), ``rope_multi_head`` (that layer with RoPE on every head's
queries and keys, in either pairing), ``sink_softmax`` (gpt-oss's softmax with a learned sink logit
per head in the denominator), ``gated_delta_rule`` (Gated DeltaNet's recurrent state, Qwen3-Next's linear
attention, with its backward through time), and the relative positions added to the scores: ``alibi`` (a fixed
per-head linear penalty on distance: BLOOM), ``t5_bias`` (a learned scalar per head and distance
bucket: T5) and ``relative_xl`` (Transformer-XL's relative attention within one segment). May
import from ``core`` and ``fast``.
"""
from .blockwise import FlashAttentionCache, flash_attention_backward, flash_attention_forward
from .local import local_window_mask
from .linear_attention import LinearAttentionCache, linear_attention_backward, linear_attention_forward
from .rope import RopeCache, rope_backward, rope_forward
from .kv_cache import KVCache
from .grouped_heads import GroupedMultiHeadCache, multi_head_attention_backward, multi_head_attention_forward
from .rope_multi_head import rope_multi_head_attention_backward, rope_multi_head_attention_forward
from .sink_softmax import SinkSoftmaxCache, sink_softmax_backward, sink_softmax_forward
from .gated_delta_rule import GatedDeltaRuleCache, gated_delta_rule_backward, gated_delta_rule_forward
from .alibi import AlibiCache, alibi_backward, alibi_bias, alibi_forward, alibi_positions, alibi_slopes
from .t5_bias import T5BiasCache, t5_bias_backward, t5_bias_forward, t5_buckets
from .relative_xl import (RelativeXLCache, relative_xl_positions, relative_xl_scores_backward,
                          relative_xl_scores_forward)

__all__ = [
    "FlashAttentionCache", "flash_attention_backward", "flash_attention_forward",
    "local_window_mask",
    "LinearAttentionCache", "linear_attention_backward", "linear_attention_forward",
    "RopeCache", "rope_backward", "rope_forward",
    "KVCache",
    "GroupedMultiHeadCache", "multi_head_attention_backward", "multi_head_attention_forward",
    "rope_multi_head_attention_backward", "rope_multi_head_attention_forward",
    "SinkSoftmaxCache", "sink_softmax_backward", "sink_softmax_forward",
    "GatedDeltaRuleCache", "gated_delta_rule_backward", "gated_delta_rule_forward",
    "AlibiCache", "alibi_backward", "alibi_bias", "alibi_forward", "alibi_positions", "alibi_slopes",
    "T5BiasCache", "t5_bias_backward", "t5_bias_forward", "t5_buckets",
    "RelativeXLCache", "relative_xl_positions", "relative_xl_scores_backward", "relative_xl_scores_forward",
]
