"""attention_ref: multi-head attention in plain NumPy, one formula at a time.

Every step is a pure pair ``*_forward(...) -> (out, cache)`` and
``*_backward(dout, cache) -> gradients`` with a hand-derived backward, and
:func:`gradcheck` checks any such pair against finite differences.

Conventions (the same in every module):

* row vectors, as in the documents: ``Q = X W^Q``, ``W`` of shape ``(d_in, d_out)``;
* shapes ``(..., n, d)`` with any number of leading batch axes;
* boolean masks: ``True`` = "may attend" (see :mod:`attention_ref.core.masks`);
* float64 by default, float32 stays float32, integers are computed in float64.

The folders are the layers, and imports flow down only: ``core`` (the layer of the
documents) <- ``variants`` <- ``nn`` (layer classes, blocks, optimisers) <- ``documents``
(claims, experiments, walkthrough) and ``plot``. ``docs/reading_guide.md`` says what to read
first. Every name below is importable from ``attention_ref`` directly.
"""

# the checker: any hand-written (forward, backward) pair against finite differences
from .gradcheck import GradcheckError, GradcheckReport, gradcheck, numerical_gradient

# core: the steps of multi-head attention, each a forward/backward pair
from .core.linear import LinearCache, linear_backward, linear_forward
from .core.softmax import SoftmaxCache, softmax_backward, softmax_forward
from .core.masks import causal_mask, mask_to_additive, padding_mask
from .core.attention import (
    AttentionCache,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from .core.heads import merge_heads, merge_heads_backward, split_heads, split_heads_backward
from .core.multi_head import (
    PARAM_NAMES,
    MultiHeadCache,
    multi_head_attention_backward,
    multi_head_attention_forward,
)
from .core.separate_heads import (
    multi_head_attention_separate_heads_backward,
    multi_head_attention_separate_heads_forward,
)

# variants: blockwise (flash), local windows, linear attention, rotary positions, KV cache
from .variants.blockwise import FlashAttentionCache, flash_attention_backward, flash_attention_forward
from .variants.local import local_window_mask
from .variants.linear_attention import LinearAttentionCache, linear_attention_backward, linear_attention_forward
from .variants.rope import RopeCache, rope_backward, rope_forward
from .variants.kv_cache import KVCache

# nn: the layer class, the pieces of a Transformer block, the blocks, the optimisers
from .nn.multi_head_attention import MultiHeadAttention
from .nn.layer_norm import LayerNormCache, layer_norm_backward, layer_norm_forward
from .nn.feed_forward import (
    FeedForwardCache,
    feed_forward_backward,
    feed_forward_forward,
    gelu_backward,
    gelu_forward,
    relu_backward,
    relu_forward,
)
from .nn.residual import (
    AddNormCache,
    ResidualCache,
    add_norm_backward,
    add_norm_forward,
    residual_backward,
    residual_forward,
)
from .nn.encoder_block import (
    EncoderBlockCache,
    TransformerEncoderBlock,
    encoder_block_backward,
    encoder_block_forward,
    init_encoder_block_params,
)
from .nn.decoder_block import (
    DecoderBlockCache,
    TransformerDecoderBlock,
    decoder_block_backward,
    decoder_block_forward,
    init_decoder_block_params,
)
from .nn.optim import SGD, Adam

# speed: threads for the elementwise (..., Nq, Nk) work (results are bit-identical either way)
from ._parallel import get_num_threads, set_num_threads

# the flat module paths of 0.1 (attention_ref.core.masks, ...) still import, with a DeprecationWarning
from . import _moved

_moved.install()

__version__ = "0.1.0"

__all__ = [
    # the checker
    "GradcheckError", "GradcheckReport", "gradcheck", "numerical_gradient",
    # core
    "LinearCache", "linear_backward", "linear_forward",
    "SoftmaxCache", "softmax_backward", "softmax_forward",
    "causal_mask", "mask_to_additive", "padding_mask",
    "AttentionCache", "scaled_dot_product_attention_backward", "scaled_dot_product_attention_forward",
    "merge_heads", "merge_heads_backward", "split_heads", "split_heads_backward",
    "PARAM_NAMES", "MultiHeadCache", "multi_head_attention_backward", "multi_head_attention_forward",
    "multi_head_attention_separate_heads_backward", "multi_head_attention_separate_heads_forward",
    # variants
    "FlashAttentionCache", "flash_attention_backward", "flash_attention_forward",
    "local_window_mask",
    "LinearAttentionCache", "linear_attention_backward", "linear_attention_forward",
    "RopeCache", "rope_backward", "rope_forward",
    "KVCache",
    # nn
    "MultiHeadAttention",
    "LayerNormCache", "layer_norm_backward", "layer_norm_forward",
    "FeedForwardCache", "feed_forward_backward", "feed_forward_forward",
    "gelu_backward", "gelu_forward", "relu_backward", "relu_forward",
    "AddNormCache", "ResidualCache", "add_norm_backward", "add_norm_forward", "residual_backward", "residual_forward",
    "EncoderBlockCache", "TransformerEncoderBlock", "encoder_block_backward", "encoder_block_forward",
    "init_encoder_block_params",
    "DecoderBlockCache", "TransformerDecoderBlock", "decoder_block_backward", "decoder_block_forward",
    "init_decoder_block_params",
    "SGD", "Adam",
    # speed
    "get_num_threads", "set_num_threads",
]
