"""From layer to model: the layer class and the pieces of a Transformer block, each pair
gradient-checked like the core. May import from ``core`` and ``variants``.

``multi_head_attention`` (the :class:`MultiHeadAttention` class, with KV-cache decoding),
``layer_norm`` and ``rms_norm``, ``feed_forward`` (ReLU, GELU in its tanh and exact forms,
with the vectorised ``erf``) and ``swiglu`` (Llama's), ``residual`` (Add & Norm, post- and
pre-norm), ``block_params`` (a block's flat parameter dict split by sub-layer and joined back), ``embedding`` (token lookup, scatter-add backward), ``cross_entropy`` (the
next-token loss, as torch's), ``encoder_block``, ``decoder_block``, the decoder-only blocks of real models
``gpt2_block`` and ``llama_block`` (RoPE, grouped-query heads, RMSNorm, SwiGLU), ``optim``
(SGD, Adam and AdamW, global-norm gradient clipping, the cosine learning-rate schedule); gpt-oss's mixture
of experts: ``moe_routing`` (the routing description and the router), ``clamped_swiglu`` (its
expert), ``moe`` (the layer), ``load_balancing`` (the auxiliary loss); ``yarn`` (YaRN's RoPE
frequencies, computed through ``rope_scaling``); Qwen3-Next's Gated DeltaNet and gated attention:
``causal_conv1d`` (the short causal depthwise convolution and its decoding window), ``gated_rms_norm``
(RMSNorm times ``silu(z)``), ``sigmoid_gate`` (the attention output times ``sigmoid(gate)``),
``gated_delta_net`` (the whole linear-attention layer, with its decoding state), ``gated_attention`` (the
full-attention layer: gated query projection, (1 + w) q/k norms, partial RoPE, sigmoid output gate),
``shared_expert`` (the gated shared expert beside the routed ones; the routed experts are ``moe``'s
``expert="swiglu"``);
also for Qwen3-MoE and DeepSeek-V3: ``moe``'s ``swiglu_moe_*`` (the same mixture, plain SwiGLU experts given as separate
gate and up arrays, with the grouped sigmoid routing of a ``Routing``); ``mla`` (DeepSeek's multi-head latent
attention and its absorbed decoding step with a cache of the latent); ``deepseek_block`` (DeepSeek-V3's decoder
block: MLA, and a dense SwiGLU or routed and shared experts); ``qwen3_moe_block`` (Qwen3-MoE's: Qwen3's attention
and a softmax-routed mixture or a dense SwiGLU).
"""
from .multi_head_attention import MultiHeadAttention
from .layer_norm import LayerNormCache, layer_norm_backward, layer_norm_forward
from .rms_norm import RMSNormCache, rms_norm_backward, rms_norm_forward
from .feed_forward import (
    FeedForwardCache,
    GeluCache,
    feed_forward_backward,
    feed_forward_forward,
    gelu_backward,
    gelu_forward,
    relu_backward,
    relu_forward,
)
from .swiglu import SwiGLUCache, silu, swiglu_backward, swiglu_forward
from .residual import AddNormCache, ResidualCache, add_norm_backward, add_norm_forward, residual_backward, residual_forward
from .encoder_block import (
    EncoderBlockCache,
    TransformerEncoderBlock,
    encoder_block_backward,
    encoder_block_forward,
    init_encoder_block_params,
)
from .decoder_block import (
    DecoderBlockCache,
    TransformerDecoderBlock,
    decoder_block_backward,
    decoder_block_forward,
    init_decoder_block_params,
)
from .gpt2_block import (
    GPT2BlockCache,
    gpt2_block_backward,
    gpt2_block_decode_step,
    gpt2_block_forward,
    init_gpt2_block_params,
)
from .llama_block import (
    LLAMA_PARAM_NAMES,
    LlamaBlockCache,
    init_llama_block_params,
    llama_block_backward,
    llama_block_decode_step,
    llama_block_forward,
)
from .gemma_block import (
    GEMMA2_PARAM_NAMES,
    GEMMA_PARAM_NAMES,
    GemmaBlockCache,
    gemma_block_backward,
    gemma_block_decode_step,
    gemma_block_forward,
    init_gemma_block_params,
)
from .optim import SGD, Adam, AdamW, clip_grad_norm, cosine_lr_schedule
from .embedding import EmbeddingCache, embedding_backward, embedding_forward
from .cross_entropy import CrossEntropyCache, cross_entropy_backward, cross_entropy_forward, next_token_targets
from .moe_routing import ROUTING_ORDERS, RouterCache, Routing, router_backward, router_forward
from .clamped_swiglu import ClampedSwiGLUCache, clamped_swiglu_backward, clamped_swiglu_forward
from .moe import (EXPERT_KINDS, MoECache, SwiGLUMoECache, moe_backward, moe_forward, swiglu_moe_backward,
                  swiglu_moe_forward)
from .mla import (LatentCache, MLACache, MLADecodeCache, MLAShape, mla_backward, mla_decode_absorbed, mla_forward,
                  mla_param_shapes, mla_scale)
from .deepseek_block import DeepSeekBlockCache, DeepSeekLayer, deepseek_block_backward, deepseek_block_forward
from .qwen3_moe_block import Qwen3MoeBlockCache, Qwen3MoeLayer, qwen3_moe_block_backward, qwen3_moe_block_forward
from .load_balancing import LoadBalancingCache, load_balancing_loss_backward, load_balancing_loss_forward
from .causal_conv1d import CausalConv1dCache, causal_conv1d_backward, causal_conv1d_forward
from .gated_rms_norm import GatedRMSNormCache, gated_rms_norm_backward, gated_rms_norm_forward
from .sigmoid_gate import SigmoidGateCache, sigmoid_gate_backward, sigmoid_gate_forward
from .gated_delta_net import (DeltaNetShape, DeltaNetState, GatedDeltaNetCache, gated_delta_net_backward,
                              gated_delta_net_forward)
from .shared_expert import SharedExpertCache, gated_shared_expert_backward, gated_shared_expert_forward
from .gated_attention import GatedAttentionCache, GatedAttentionShape, gated_attention_backward, gated_attention_forward

__all__ = [
    "MultiHeadAttention",
    "LayerNormCache", "layer_norm_backward", "layer_norm_forward",
    "RMSNormCache", "rms_norm_backward", "rms_norm_forward",
    "FeedForwardCache", "GeluCache", "feed_forward_backward", "feed_forward_forward",
    "gelu_backward", "gelu_forward", "relu_backward", "relu_forward",
    "SwiGLUCache", "silu", "swiglu_backward", "swiglu_forward",
    "AddNormCache", "ResidualCache", "add_norm_backward", "add_norm_forward", "residual_backward", "residual_forward",
    "EncoderBlockCache", "TransformerEncoderBlock", "encoder_block_backward", "encoder_block_forward",
    "init_encoder_block_params",
    "DecoderBlockCache", "TransformerDecoderBlock", "decoder_block_backward", "decoder_block_forward",
    "init_decoder_block_params",
    "GPT2BlockCache", "gpt2_block_backward", "gpt2_block_decode_step", "gpt2_block_forward", "init_gpt2_block_params",
    "LLAMA_PARAM_NAMES", "LlamaBlockCache", "init_llama_block_params", "llama_block_backward",
    "llama_block_decode_step", "llama_block_forward",
    "GEMMA_PARAM_NAMES", "GEMMA2_PARAM_NAMES", "GemmaBlockCache", "gemma_block_backward", "gemma_block_decode_step", "gemma_block_forward",
    "init_gemma_block_params",
    "SGD", "Adam", "AdamW", "clip_grad_norm", "cosine_lr_schedule",
    "EmbeddingCache", "embedding_backward", "embedding_forward",
    "CrossEntropyCache", "cross_entropy_backward", "cross_entropy_forward", "next_token_targets",
    "ROUTING_ORDERS", "RouterCache", "Routing", "router_backward", "router_forward",
    "ClampedSwiGLUCache", "clamped_swiglu_backward", "clamped_swiglu_forward",
    "EXPERT_KINDS", "MoECache", "moe_backward", "moe_forward",
    "SwiGLUMoECache", "swiglu_moe_backward", "swiglu_moe_forward",
    "MLAShape", "MLACache", "LatentCache", "MLADecodeCache", "mla_param_shapes", "mla_scale", "mla_forward", "mla_backward",
    "mla_decode_absorbed", "DeepSeekLayer", "DeepSeekBlockCache", "deepseek_block_forward", "deepseek_block_backward",
    "Qwen3MoeLayer", "Qwen3MoeBlockCache", "qwen3_moe_block_forward", "qwen3_moe_block_backward",
    "LoadBalancingCache", "load_balancing_loss_backward", "load_balancing_loss_forward",
    "CausalConv1dCache", "causal_conv1d_backward", "causal_conv1d_forward",
    "GatedRMSNormCache", "gated_rms_norm_backward", "gated_rms_norm_forward",
    "SigmoidGateCache", "sigmoid_gate_backward", "sigmoid_gate_forward",
    "DeltaNetShape", "DeltaNetState", "GatedDeltaNetCache", "gated_delta_net_backward", "gated_delta_net_forward",
    "GatedAttentionCache", "GatedAttentionShape", "gated_attention_backward", "gated_attention_forward",
    "SharedExpertCache", "gated_shared_expert_backward", "gated_shared_expert_forward",
]
