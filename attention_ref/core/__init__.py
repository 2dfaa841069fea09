"""The reference: every step of multi-head attention as a forward/backward pair, formulas only.

Read in this order: ``linear`` (``Q = X W^Q``), ``softmax``, ``masks``, ``attention``
(scaled dot-product), ``heads`` (split and merge), ``multi_head`` (the weight-split
parallel form, with grouped-query attention and head masks), ``separate_heads`` (the
documents' other strategy, head by head). Each module holds its pair's forward as one
block of numbered steps and its backward as the same steps in reverse; the input checks
live in ``attention_ref._pair_checks``, the speed in ``attention_ref.fast`` (checked
against these functions). Imports: NumPy and the package's checks only.
"""
from .linear import LinearCache, glorot_uniform, linear_backward, linear_forward
from .softmax import SoftmaxCache, softmax_backward, softmax_forward
from .masks import causal_mask, mask_to_additive, padding_mask
from .attention import AttentionCache, scaled_dot_product_attention_backward, scaled_dot_product_attention_forward
from .heads import merge_heads, merge_heads_backward, split_heads, split_heads_backward
from .multi_head import PARAM_NAMES, MultiHeadCache, multi_head_attention_backward, multi_head_attention_forward
from .separate_heads import (
    multi_head_attention_separate_heads_backward,
    multi_head_attention_separate_heads_forward,
)

__all__ = [
    "LinearCache", "glorot_uniform", "linear_backward", "linear_forward",
    "SoftmaxCache", "softmax_backward", "softmax_forward",
    "causal_mask", "mask_to_additive", "padding_mask",
    "AttentionCache", "scaled_dot_product_attention_backward", "scaled_dot_product_attention_forward",
    "merge_heads", "merge_heads_backward", "split_heads", "split_heads_backward",
    "PARAM_NAMES", "MultiHeadCache", "multi_head_attention_backward", "multi_head_attention_forward",
    "multi_head_attention_separate_heads_backward", "multi_head_attention_separate_heads_forward",
]
