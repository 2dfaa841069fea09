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
documents, the reference) <- ``fast`` (the same pairs with speed tricks, checked against
core) <- ``variants`` <- ``nn`` (layer classes, blocks, optimisers) <- ``models`` (every family whole, generation)
<- ``documents``
(claims, experiments, walkthrough) and ``plot``. ``docs/reading_guide.md`` says what to read
first. Every name below is importable from ``attention_ref`` directly, and each is imported by
name from the one module that defines it.
"""

# the checker: any hand-written (forward, backward) pair against finite differences
from .gradcheck import GradcheckError, GradcheckReport, gradcheck, numerical_gradient

# core, the reference: softmax, masks, split/merge heads, and the documents' two strategies of
# multi-head attention; each pair is also attention_ref.core.X, the formulas only
from .core.linear import LinearCache, glorot_uniform
from .core.softmax import SoftmaxCache, softmax_backward, softmax_forward
from .core.masks import causal_mask, mask_to_additive, padding_mask
from .core.attention import AttentionCache
from .core.heads import merge_heads, merge_heads_backward, split_heads, split_heads_backward
from .core.multi_head import PARAM_NAMES, MultiHeadCache
from .core.separate_heads import (
    multi_head_attention_separate_heads_backward,
    multi_head_attention_separate_heads_forward,
)

# the public pairs of linear and attention: validate once, then one visible branch runs the fast
# path (attention_ref.fast.X_fast) for large inputs and the reference (attention_ref.core.X)
# otherwise; reference_only() switches everything to the reference (attention_ref/fast/dispatch.py)
from .fast.dispatch import (
    linear_backward,
    linear_forward,
    reference_only,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)

# variants: blockwise (flash) attention, local windows, linear attention, RoPE, the KV cache, the softmax with sinks,
# and the public multi_head_attention_forward/backward: grouped-query heads and a head mask
# around the plain layer (core's, or its fast path for large inputs); the same layer with RoPE
# on every head's queries and keys (rope_multi_head_attention_forward/backward, layout= named)
from .variants.blockwise import FlashAttentionCache, flash_attention_backward, flash_attention_forward
from .variants.local import local_window_mask
from .variants.linear_attention import LinearAttentionCache, linear_attention_backward, linear_attention_forward
from .variants.rope import RopeCache, rope_backward, rope_forward
from .variants.kv_cache import KVCache
from .variants.grouped_heads import GroupedMultiHeadCache, multi_head_attention_backward, multi_head_attention_forward
from .variants.rope_multi_head import rope_multi_head_attention_backward, rope_multi_head_attention_forward
from .variants.sink_softmax import SinkSoftmaxCache, sink_softmax_backward, sink_softmax_forward
from .variants.gated_delta_rule import GatedDeltaRuleCache, gated_delta_rule_backward, gated_delta_rule_forward
# the relative positions added to the scores: ALiBi (BLOOM), T5's bucketed bias, Transformer-XL's relative attention
from .variants.alibi import AlibiCache, alibi_backward, alibi_bias, alibi_forward, alibi_positions, alibi_slopes
from .variants.t5_bias import T5BiasCache, t5_bias_backward, t5_bias_forward, t5_buckets
from .variants.relative_xl import (RelativeXLCache, relative_xl_positions, relative_xl_scores_backward,
                                   relative_xl_scores_forward)

# nn: the MultiHeadAttention class, the norms, feed-forward networks, Add & Norm, embeddings and
# the loss, encoder and decoder blocks, GPT-2's and Llama's blocks, SGD, Adam and AdamW, gradient clipping and
# the cosine learning-rate schedule
from .nn.multi_head_attention import MultiHeadAttention
from .nn.layer_norm import LayerNormCache, layer_norm_backward, layer_norm_forward
from .nn.rms_norm import RMSNormCache, rms_norm_backward, rms_norm_forward
from .nn.feed_forward import (
    FeedForwardCache,
    GeluCache,
    feed_forward_backward,
    feed_forward_forward,
    gelu_backward,
    gelu_forward,
    relu_backward,
    relu_forward,
)
from .nn.swiglu import SwiGLUCache, silu, swiglu_backward, swiglu_forward
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
from .nn.gpt2_block import (
    GPT2BlockCache,
    gpt2_block_backward,
    gpt2_block_decode_step,
    gpt2_block_forward,
    init_gpt2_block_params,
)
from .nn.llama_block import (
    LLAMA_PARAM_NAMES,
    LlamaBlockCache,
    init_llama_block_params,
    llama_block_backward,
    llama_block_decode_step,
    llama_block_forward,
)
from .nn.gemma_block import (
    GEMMA2_PARAM_NAMES,
    GEMMA_PARAM_NAMES,
    GemmaBlockCache,
    gemma_block_backward,
    gemma_block_decode_step,
    gemma_block_forward,
    init_gemma_block_params,
)
from .nn.optim import SGD, Adam, AdamW, clip_grad_norm, cosine_lr_schedule
from .nn.embedding import EmbeddingCache, embedding_backward, embedding_forward
from .nn.cross_entropy import CrossEntropyCache, cross_entropy_backward, cross_entropy_forward, next_token_targets
# gpt-oss's mixture of experts: the routing description, the router, the expert, the layer, the balancing loss
from .nn.moe_routing import ROUTING_ORDERS, RouterCache, Routing, router_backward, router_forward
from .nn.clamped_swiglu import ClampedSwiGLUCache, clamped_swiglu_backward, clamped_swiglu_forward
from .nn.moe import EXPERT_KINDS, MoECache, moe_backward, moe_forward
# the same layer with plain SwiGLU experts (Qwen3-MoE; DeepSeek-V3 with its grouped sigmoid routing)
from .nn.moe import SwiGLUMoECache, swiglu_moe_backward, swiglu_moe_forward
# DeepSeek's multi-head latent attention: the plain pair and the absorbed decoding step with a latent cache
from .nn.mla import (LatentCache, MLACache, MLADecodeCache, MLAShape, mla_backward, mla_decode_absorbed, mla_forward,
                     mla_param_shapes, mla_scale)
from .nn.deepseek_block import DeepSeekBlockCache, DeepSeekLayer, deepseek_block_backward, deepseek_block_forward
from .nn.qwen3_moe_block import Qwen3MoeBlockCache, Qwen3MoeLayer, qwen3_moe_block_backward, qwen3_moe_block_forward
from .nn.load_balancing import LoadBalancingCache, load_balancing_loss_backward, load_balancing_loss_forward
# Qwen3-Next's Gated DeltaNet and gated attention: the short causal convolution, the gated RMSNorm, the output gate
from .nn.causal_conv1d import CausalConv1dCache, causal_conv1d_backward, causal_conv1d_forward
from .nn.gated_rms_norm import GatedRMSNormCache, gated_rms_norm_backward, gated_rms_norm_forward
from .nn.sigmoid_gate import SigmoidGateCache, sigmoid_gate_backward, sigmoid_gate_forward
from .nn.gated_delta_net import (DeltaNetShape, DeltaNetState, GatedDeltaNetCache, gated_delta_net_backward,
                                 gated_delta_net_forward)
from .nn.shared_expert import SharedExpertCache, gated_shared_expert_backward, gated_shared_expert_forward
from .nn.gated_attention import (GatedAttentionCache, GatedAttentionShape, gated_attention_backward,
                                 gated_attention_forward)

# models: every family (models/families/) as a whole language model (ids -> logits -> loss and back), generation
# (the logits processed as transformers' generate does; left_pad for prompts of different lengths)
from .models.config import FAMILIES, LMConfig
from .models.params import block_params, init_lm_params, param_names
from .models.gpt2 import GPT2LMCache, gpt2_lm_backward, gpt2_lm_forward
from .models.llama import LlamaLMCache, llama_lm_backward, llama_lm_forward
from .models.gpt_neox import GPTNeoXLMCache, gpt_neox_lm_backward, gpt_neox_lm_forward
from .models.phi3 import Phi3LMCache, phi3_lm_backward, phi3_lm_forward
from .models.gemma import GemmaLMCache, gemma_lm_backward, gemma_lm_forward
from .models.lm import lm_backward, lm_forward, lm_loss
from .models.trace import lm_trace, trace_names_4x
from .models.logits_processing import (
    apply_min_new_tokens,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    left_pad,
    process_logits,
)
from .models.generate import LMDecoder, generate

# the layers as modules: attention_ref.core.X is the reference, attention_ref.fast.X_fast the fast path
from . import core, fast, models, nn, variants

__version__ = "0.4.0"

__all__ = list(dict.fromkeys(["GradcheckError", "GradcheckReport", "gradcheck", "numerical_gradient",
                              *core.__all__, "reference_only", *variants.__all__, *nn.__all__, *models.__all__]))
