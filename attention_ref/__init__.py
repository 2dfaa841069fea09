"""attention_ref: multi-head attention in plain NumPy, one formula at a time.

Every step is a pure pair ``*_forward(...) -> (out, cache)`` and
``*_backward(dout, cache) -> gradients`` with a hand-derived backward, and
:func:`gradcheck` checks any such pair against finite differences.

Conventions (the same in every module):

* row vectors, as in the documents: ``Q = X W^Q``, ``W`` of shape ``(d_in, d_out)``;
* shapes ``(..., n, d)`` with any number of leading batch axes;
* boolean masks: ``True`` = "may attend" (see :mod:`attention_ref.masks`);
* float64 by default, float32 stays float32, integers are computed in float64.
"""
from .attention import (
    AttentionCache,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from .gradcheck import GradcheckError, GradcheckReport, gradcheck, numerical_gradient
from .heads import merge_heads, merge_heads_backward, split_heads, split_heads_backward
from .layer import KVCache, MultiHeadAttention
from .linear import LinearCache, linear_backward, linear_forward
from .masks import causal_mask, mask_to_additive, padding_mask
from .multi_head import (
    PARAM_NAMES,
    MultiHeadCache,
    multi_head_attention_backward,
    multi_head_attention_forward,
)
from .separate_heads import (
    multi_head_attention_separate_heads_backward,
    multi_head_attention_separate_heads_forward,
)
from .softmax import SoftmaxCache, softmax_backward, softmax_forward
# --- blocks: layer norm, feed-forward, Add & Norm, encoder/decoder blocks, optimisers ---
from .blocks import (
    AddNormCache,
    ResidualCache,
    add_norm_backward,
    add_norm_forward,
    residual_backward,
    residual_forward,
)
from .decoder_block import (
    DecoderBlockCache,
    TransformerDecoderBlock,
    decoder_block_backward,
    decoder_block_forward,
    init_decoder_block_params,
)
from .encoder_block import (
    EncoderBlockCache,
    TransformerEncoderBlock,
    encoder_block_backward,
    encoder_block_forward,
    init_encoder_block_params,
)
from .feed_forward import (
    FeedForwardCache,
    feed_forward_backward,
    feed_forward_forward,
    gelu_backward,
    gelu_forward,
    relu_backward,
    relu_forward,
)
from .layer_norm import LayerNormCache, layer_norm_backward, layer_norm_forward
from .optim import SGD, Adam
# --- end blocks ---
# --- variants (blockwise, local, linear, rotary) ---
from .flash import FlashAttentionCache, flash_attention_backward, flash_attention_forward
from .linear_attention import LinearAttentionCache, linear_attention_backward, linear_attention_forward
from .local import local_window_mask
from .rope import RopeCache, rope_backward, rope_forward
# --- end variants ---
# --- performance: threads for the elementwise (..., Nq, Nk) work ---
from ._parallel import get_num_threads, set_num_threads
# --- end performance ---

__version__ = "0.1.0"

__all__ = [
    "AttentionCache",
    "GradcheckError",
    "GradcheckReport",
    "KVCache",
    "LinearCache",
    "MultiHeadAttention",
    "MultiHeadCache",
    "PARAM_NAMES",
    "SoftmaxCache",
    "causal_mask",
    "gradcheck",
    "linear_backward",
    "linear_forward",
    "mask_to_additive",
    "merge_heads",
    "merge_heads_backward",
    "multi_head_attention_backward",
    "multi_head_attention_forward",
    "multi_head_attention_separate_heads_backward",
    "multi_head_attention_separate_heads_forward",
    "numerical_gradient",
    "padding_mask",
    "scaled_dot_product_attention_backward",
    "scaled_dot_product_attention_forward",
    "softmax_backward",
    "softmax_forward",
    "split_heads",
    "split_heads_backward",
    # --- blocks ---
    "AddNormCache",
    "ResidualCache",
    "add_norm_backward",
    "add_norm_forward",
    "residual_backward",
    "residual_forward",
    "DecoderBlockCache",
    "TransformerDecoderBlock",
    "decoder_block_backward",
    "decoder_block_forward",
    "init_decoder_block_params",
    "EncoderBlockCache",
    "TransformerEncoderBlock",
    "encoder_block_backward",
    "encoder_block_forward",
    "init_encoder_block_params",
    "FeedForwardCache",
    "feed_forward_backward",
    "feed_forward_forward",
    "gelu_backward",
    "gelu_forward",
    "relu_backward",
    "relu_forward",
    "LayerNormCache",
    "layer_norm_backward",
    "layer_norm_forward",
    "SGD",
    "Adam",
    # --- end blocks ---
    # --- variants (blockwise, local, linear, rotary) ---
    "FlashAttentionCache",
    "LinearAttentionCache",
    "RopeCache",
    "flash_attention_backward",
    "flash_attention_forward",
    "linear_attention_backward",
    "linear_attention_forward",
    "local_window_mask",
    "rope_backward",
    "rope_forward",
    # --- end variants ---
    # --- performance ---
    "get_num_threads",
    "set_num_threads",
    # --- end performance ---
]
