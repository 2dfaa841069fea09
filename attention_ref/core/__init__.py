"""The reference: every step of multi-head attention as a forward/backward pair, formulas only.

Read in this order, the student path of ``docs/reading_guide.md`` (after notebooks 01-07),
which is also the order of the imports below: ``linear.py`` (``Q = X W^Q``, the smallest
pair), ``softmax.py`` (stable, with the full Jacobian in its backward), ``masks.py`` (the one
mask convention), ``attention.py`` (scaled dot-product attention: four numbered steps, and the
same steps in reverse), ``heads.py`` (split and merge), ``multi_head.py`` (the weight-split
parallel form, the documents' layer), ``separate_heads.py`` (the documents' other strategy,
head by head, an independent check of the parallel form). In each module the private functions
are the formulas: the forward as one block of numbered steps, the backward as the same steps
in reverse; the public pair checks its arguments (``attention_ref._pair_checks``) and calls
them. What real models add (grouped-query heads, a head mask, rotary positions) is in
``attention_ref.variants.grouped_heads``, the speed in ``attention_ref.fast`` (both checked
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
