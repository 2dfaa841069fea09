"""The input contract, everywhere: upstream gradients, dtypes, overflowing scores.

* every public backward checks its upstream gradient as the forwards check their inputs:
  the forward output's shape (``ValueError`` naming it and both shapes), finite entries
  (``ValueError``), a dtype of the policy (``TypeError``);
* only float32 and float64 are computed in (integers in float64): float16, complex,
  object, boolean and string arrays, and such ``dtype=`` arguments, are a ``TypeError``;
* scores (and projections, and linear attention's sums) too large for the dtype raise
  ``FloatingPointError`` naming the inputs, the dtype and its largest finite value,
  never NaN with a NumPy ``RuntimeWarning``.
"""
import re
import warnings

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.documents import toy_task

from _helpers import random_params

# --- a. every public backward validates its upstream gradient ---------------------------


def _linear(rng):
    y, cache = ar.linear_forward(rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5)), np.zeros(5))
    return y, lambda d: ar.linear_backward(d, cache), "dy"


def _softmax(rng):
    y, cache = ar.softmax_forward(rng.standard_normal((3, 4)))
    return y, lambda d: ar.softmax_backward(d, cache), "dy"


def _attention(rng):
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    out, cache = ar.scaled_dot_product_attention_forward(q, k, v)
    return out, lambda d: ar.scaled_dot_product_attention_backward(d, cache), "dout"


def _multi_head(rng):
    x = rng.standard_normal((2, 3, 4))
    out, cache = ar.multi_head_attention_forward(x, x, x, random_params(rng, 4, 2, 2, 2), 2)
    return out, lambda d: ar.multi_head_attention_backward(d, cache), "dout"


def _rope_multi_head(rng):
    x = rng.standard_normal((2, 3, 4))
    out, cache = ar.rope_multi_head_attention_forward(x, x, x, random_params(rng, 4, 2, 2, 2), 2, layout="half",
                                                      positions=[[1, 2, 3], [4, 5, 6]])
    return out, lambda d: ar.rope_multi_head_attention_backward(d, cache), "dout"


def _separate_heads(rng):
    x = rng.standard_normal((3, 4))
    out, cache = ar.multi_head_attention_separate_heads_forward(x, x, x, random_params(rng, 4, 2, 2, 2), 2)
    return out, lambda d: ar.multi_head_attention_separate_heads_backward(d, cache), "dout"


def _flash(rng):
    q = rng.standard_normal((5, 2))
    out, cache = ar.flash_attention_forward(q, q, q, causal=True, block_size=2)
    return out, lambda d: ar.flash_attention_backward(d, cache), "dout"


def _linear_attention(rng):
    q = rng.standard_normal((4, 3))
    out, cache = ar.linear_attention_forward(q, q, q[:, :2])
    return out, lambda d: ar.linear_attention_backward(d, cache), "dout"


def _rope(rng):
    y, cache = ar.rope_forward(rng.standard_normal((3, 4)))
    return y, lambda d: ar.rope_backward(d, cache), "dy"


def _layer_norm(rng):
    y, cache = ar.layer_norm_forward(rng.standard_normal((3, 4)), np.ones(4), np.zeros(4))
    return y, lambda d: ar.layer_norm_backward(d, cache), "dy"


def _rms_norm(rng):
    y, cache = ar.rms_norm_forward(rng.standard_normal((3, 4)), np.ones(4))
    return y, lambda d: ar.rms_norm_backward(d, cache), "dy"


def _swiglu(rng):
    y, cache = ar.swiglu_forward(rng.standard_normal((3, 4)), rng.standard_normal((4, 6)),
                                 rng.standard_normal((4, 6)), rng.standard_normal((6, 4)))
    return y, lambda d: ar.swiglu_backward(d, cache), "dy"


def _relu(rng):
    a, h = ar.relu_forward(rng.standard_normal((3, 4)))
    return a, lambda d: ar.relu_backward(d, h), "da"


def _gelu(rng):
    a, h = ar.gelu_forward(rng.standard_normal((3, 4)))
    return a, lambda d: ar.gelu_backward(d, h), "da"


def _feed_forward(rng):
    params = {"W_1": rng.standard_normal((4, 6)), "W_2": rng.standard_normal((6, 4))}
    y, cache = ar.feed_forward_forward(rng.standard_normal((3, 4)), params)
    return y, lambda d: ar.feed_forward_backward(d, cache), "dy"


def _add_norm(rng):
    x = rng.standard_normal((3, 4))
    y, cache = ar.add_norm_forward(x, rng.standard_normal((3, 4)), np.ones(4), np.zeros(4))
    return y, lambda d: ar.add_norm_backward(d, cache), "dy"


def _residual(rng):
    params = {"W_1": rng.standard_normal((4, 6)), "W_2": rng.standard_normal((6, 4))}
    y, cache = ar.residual_forward(rng.standard_normal((3, 4)), lambda z: ar.feed_forward_forward(z, params),
                                   np.ones(4), np.zeros(4))
    return y, lambda d: ar.residual_backward(d, cache, ar.feed_forward_backward), "dy"


def _encoder_block(rng):
    params = ar.init_encoder_block_params(4, 2, 8, seed=0)
    y, cache = ar.encoder_block_forward(rng.standard_normal((3, 4)), params, 2)
    return y, lambda d: ar.encoder_block_backward(d, cache), "dout"


def _decoder_block(rng):
    params = ar.init_decoder_block_params(4, 2, 8, seed=0)
    y, cache = ar.decoder_block_forward(rng.standard_normal((3, 4)), rng.standard_normal((2, 4)), params, 2)
    return y, lambda d: ar.decoder_block_backward(d, cache), "dout"


def _gpt2_block(rng):
    y, cache = ar.gpt2_block_forward(rng.standard_normal((3, 4)), ar.init_gpt2_block_params(4, 2, seed=0), 2)
    return y, lambda d: ar.gpt2_block_backward(d, cache), "dout"


def _llama_block(rng):
    params = ar.init_llama_block_params(4, 2, 8, num_kv_heads=1, seed=0)
    y, cache = ar.llama_block_forward(rng.standard_normal((3, 4)), params, 2, num_kv_heads=1)
    return y, lambda d: ar.llama_block_backward(d, cache), "dout"


def _gemma_block(rng):
    params = ar.init_gemma_block_params(4, 2, 8, num_kv_heads=1, seed=0)
    y, cache = ar.gemma_block_forward(rng.standard_normal((3, 4)), params, 2, num_kv_heads=1)
    return y, lambda d: ar.gemma_block_backward(d, cache), "dout"


def _toy_model(rng):
    x, _ = toy_task.make_batch(rng, 2, 3)
    pred, cache = toy_task.toy_model_forward(x, toy_task.init_toy_model(4, 2, 8), 2)
    return pred, lambda d: toy_task.toy_model_backward(d, cache), "dpred"


def _layer(rng):
    layer = ar.MultiHeadAttention(4, 2, seed=0)
    return layer(rng.standard_normal((3, 4))), layer.backward, "dout"


def _encoder_class(rng):
    block = ar.TransformerEncoderBlock(4, 2, 8, seed=0)
    return block(rng.standard_normal((3, 4))), block.backward, "dout"


def _decoder_class(rng):
    block = ar.TransformerDecoderBlock(4, 2, 8, seed=0)
    return block(rng.standard_normal((3, 4)), rng.standard_normal((2, 4))), block.backward, "dout"


def _embedding(rng):
    out, cache = ar.embedding_forward([[0, 2], [1, 1]], rng.standard_normal((3, 4)))
    return out, lambda d: ar.embedding_backward(d, cache), "dout"


def _sink_softmax(rng):
    P, cache = ar.sink_softmax_forward(rng.standard_normal((2, 3, 4)), rng.standard_normal(2))
    return P, lambda d: ar.sink_softmax_backward(d, cache), "dP"


def _router(rng):
    w, _, _, cache = ar.router_forward(rng.standard_normal((3, 4)), rng.standard_normal((4, 5)),
                                       rng.standard_normal(5), ar.Routing(2))
    return w, lambda d: ar.router_backward(d, cache), "dw"


def _clamped_swiglu(rng):
    y, cache = ar.clamped_swiglu_forward(rng.standard_normal((3, 4)), rng.standard_normal((4, 6)),
                                         rng.standard_normal(6), rng.standard_normal((3, 4)), rng.standard_normal(4))
    return y, lambda d: ar.clamped_swiglu_backward(d, cache), "dy"


def _moe(rng):
    y, cache = ar.moe_forward(rng.standard_normal((3, 4)), rng.standard_normal((4, 3)), rng.standard_normal(3),
                              rng.standard_normal((3, 4, 6)), rng.standard_normal((3, 6)),
                              rng.standard_normal((3, 3, 4)), rng.standard_normal((3, 4)), ar.Routing(2))
    return y, lambda d: ar.moe_backward(d, cache), "dy"


def _gated_delta_rule(rng):
    out, cache = ar.gated_delta_rule_forward(rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4)),
                                             rng.standard_normal((2, 3, 5)), -rng.uniform(0, 1, (2, 3)),
                                             rng.uniform(0, 1, (2, 3)))
    return out, lambda d: ar.gated_delta_rule_backward(d, cache), "dout"


def _causal_conv1d(rng):
    y, cache = ar.causal_conv1d_forward(rng.standard_normal((2, 4, 3)), rng.standard_normal((3, 2)))
    return y, lambda d: ar.causal_conv1d_backward(d, cache), "dy"


def _gated_rms_norm(rng):
    y, cache = ar.gated_rms_norm_forward(rng.standard_normal((2, 4)), rng.standard_normal((2, 4)),
                                         rng.standard_normal(4))
    return y, lambda d: ar.gated_rms_norm_backward(d, cache), "dy"


def _sigmoid_gate(rng):
    y, cache = ar.sigmoid_gate_forward(rng.standard_normal((2, 4)), rng.standard_normal((2, 4)))
    return y, lambda d: ar.sigmoid_gate_backward(d, cache), "dy"


def _gated_delta_net(rng):
    shape = ar.DeltaNetShape(1, 2, 2, 2)
    params = {"in_proj_qkvz.W": rng.standard_normal((3, 12)), "in_proj_ba.W": rng.standard_normal((3, 4)),
              "conv1d.weight": rng.standard_normal((8, 2)), "dt_bias": rng.standard_normal(2),
              "A_log": rng.standard_normal(2), "norm.weight": rng.standard_normal(2),
              "out_proj.W": rng.standard_normal((4, 3))}
    y, cache = ar.gated_delta_net_forward(rng.standard_normal((2, 4, 3)), params, shape)
    return y, lambda d: ar.gated_delta_net_backward(d, cache), "dy"


def _gated_attention(rng):
    shape = ar.GatedAttentionShape(2, 1, 4, 2)
    params = {"W_q": rng.standard_normal((3, 16)), "W_k": rng.standard_normal((3, 4)),
              "W_v": rng.standard_normal((3, 4)), "W_o": rng.standard_normal((8, 3)),
              "q_norm.weight": rng.standard_normal(4), "k_norm.weight": rng.standard_normal(4)}
    y, cache = ar.gated_attention_forward(rng.standard_normal((2, 4, 3)), params, shape)
    return y, lambda d: ar.gated_attention_backward(d, cache), "dy"


def _shared_expert(rng):
    y, cache = ar.gated_shared_expert_forward(rng.standard_normal((3, 4)), rng.standard_normal((4, 5)),
                                              rng.standard_normal((4, 5)), rng.standard_normal((5, 4)),
                                              rng.standard_normal((4, 1)))
    return y, lambda d: ar.gated_shared_expert_backward(d, cache), "dy"


def _swiglu_moe(rng):
    y, cache = ar.swiglu_moe_forward(rng.standard_normal((3, 4)), rng.standard_normal((4, 3)),
                                     rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 4, 5)),
                                     rng.standard_normal((3, 5, 4)), ar.Routing(2))
    return y, lambda d: ar.swiglu_moe_backward(d, cache), "dy"


_MLA = ar.MLAShape(2, None, 3, 2, 2, 3)  # heads, no query compression, latent 3, rope 2, nope 2, value 3


def _mla_params(rng, d):
    return {f"self_attn.{n}" if d else n: 1.0 + rng.random(s) if n.endswith("norm.weight") else rng.standard_normal(s)
            for n, s in ar.mla_param_shapes(4, _MLA).items()}


def _mla(rng):
    y, cache = ar.mla_forward(rng.standard_normal((2, 3, 4)), _mla_params(rng, False), _MLA, np.array([0.5]),
                              np.arange(3))
    return y, lambda d: ar.mla_backward(d, cache), "dy"


def _dense_mlp(rng):
    return {"input_norm.weight": rng.random(4) + 1, "post_attention_norm.weight": rng.random(4) + 1,
            "mlp.W_gate": rng.standard_normal((4, 5)), "mlp.W_up": rng.standard_normal((4, 5)),
            "mlp.W_down": rng.standard_normal((5, 4))}


def _deepseek_block(rng):
    p = {**_mla_params(rng, True), **_dense_mlp(rng)}
    y, cache = ar.deepseek_block_forward(rng.standard_normal((1, 3, 4)), p, ar.DeepSeekLayer(_MLA, 1e-6, None),
                                         np.array([0.5]), np.arange(3))
    return y, lambda d: ar.deepseek_block_backward(d, cache), "dy"


def _qwen3_moe_block(rng):
    p = {"self_attn.q_norm.weight": rng.random(2) + 1, "self_attn.k_norm.weight": rng.random(2) + 1,
         "self_attn.W_q": rng.standard_normal((4, 4)), "self_attn.W_k": rng.standard_normal((4, 2)),
         "self_attn.W_v": rng.standard_normal((4, 2)), "self_attn.W_o": rng.standard_normal((4, 4)), **_dense_mlp(rng)}
    y, cache = ar.qwen3_moe_block_forward(rng.standard_normal((1, 3, 4)), p,
                                          ar.Qwen3MoeLayer(2, 1, 1e-6, np.array([0.5]), None))
    return y, lambda d: ar.qwen3_moe_block_backward(d, cache), "dy"


def _load_balancing(rng):
    loss, cache = ar.load_balancing_loss_forward(rng.standard_normal((6, 4)), 2)
    return loss, lambda d: ar.load_balancing_loss_backward(d, cache), "dloss"


def _cross_entropy(rng):
    loss, cache = ar.cross_entropy_forward(rng.standard_normal((2, 3, 5)), [[0, 1, 2], [3, 4, -100]])
    return loss, lambda d: ar.cross_entropy_backward(d, cache), "dloss"


_LM = {"gpt2": ar.LMConfig(family="gpt2", vocab_size=7, d_model=4, num_layers=1, num_heads=2, num_kv_heads=2,
                           d_ff=8, max_positions=8, eps=1e-5),
       "llama": ar.LMConfig(family="llama", vocab_size=7, d_model=4, num_layers=1, num_heads=2, num_kv_heads=1,
                            d_ff=8, max_positions=8, eps=1e-6),
       "gpt_neox": ar.LMConfig(family="gpt_neox", vocab_size=7, d_model=8, num_layers=1, num_heads=2, num_kv_heads=2,
                               d_ff=8, max_positions=8, eps=1e-5, rotary_pct=0.5),
       "phi3": ar.LMConfig(family="phi3", vocab_size=7, d_model=4, num_layers=1, num_heads=2, num_kv_heads=1,
                           d_ff=8, max_positions=8, eps=1e-6),
       "gemma2": ar.LMConfig(family="gemma2", vocab_size=7, d_model=4, num_layers=2, num_heads=2, num_kv_heads=1,
                             d_ff=8, max_positions=8, eps=1e-6, sliding_window=2, rope_local_theta=10000.0,
                             query_pre_attn_scalar=2, layer_types=("sliding_attention", "full_attention"),
                             attn_softcap=50.0, final_softcap=30.0)}


def _lm(family, backward):
    def case(rng):
        config = _LM[family]
        logits, cache = ar.lm_forward([[1, 2, 3]], ar.init_lm_params(config, seed=0), config)
        return logits, lambda d: backward(d, cache), "dlogits"
    return case


#: Every public backward with a cache: a forward, then ``(out, backward(dout), name of dout)``.
def _alibi(rng):
    out, cache = ar.alibi_forward(rng.standard_normal((2, 3, 4)), ar.alibi_slopes(2), np.arange(4.0))
    return out, lambda d: ar.alibi_backward(d, cache), "dout"


def _t5_bias(rng):
    out, cache = ar.t5_bias_forward(rng.standard_normal((2, 3, 4)), rng.standard_normal((6, 2)),
                                    ar.t5_buckets(3, 4, num_buckets=6, max_distance=8))
    return out, lambda d: ar.t5_bias_backward(d, cache), "dout"


def _relative_xl(rng):
    q, k = rng.standard_normal((2, 2, 3, 2)), rng.standard_normal((2, 2, 3, 2))
    out, cache = ar.relative_xl_scores_forward(q, k, ar.relative_xl_positions(3, 4), rng.standard_normal((4, 4)),
                                               rng.standard_normal((2, 2)), rng.standard_normal((2, 2)))
    return out, lambda d: ar.relative_xl_scores_backward(d, cache), "dA"


BACKWARDS = {
    "linear_backward": _linear, "softmax_backward": _softmax,
    "scaled_dot_product_attention_backward": _attention, "multi_head_attention_backward": _multi_head,
    "multi_head_attention_separate_heads_backward": _separate_heads, "flash_attention_backward": _flash,
    "rope_multi_head_attention_backward": _rope_multi_head,
    "linear_attention_backward": _linear_attention, "rope_backward": _rope,
    "layer_norm_backward": _layer_norm, "rms_norm_backward": _rms_norm, "swiglu_backward": _swiglu,
    "relu_backward": _relu, "gelu_backward": _gelu,
    "feed_forward_backward": _feed_forward, "add_norm_backward": _add_norm, "residual_backward": _residual,
    "encoder_block_backward": _encoder_block, "decoder_block_backward": _decoder_block,
    "gpt2_block_backward": _gpt2_block, "llama_block_backward": _llama_block,
    "toy_model_backward": _toy_model, "MultiHeadAttention.backward": _layer,
    "TransformerEncoderBlock.backward": _encoder_class, "TransformerDecoderBlock.backward": _decoder_class,
    "embedding_backward": _embedding, "cross_entropy_backward": _cross_entropy,
    "gpt2_lm_backward": _lm("gpt2", ar.gpt2_lm_backward), "llama_lm_backward": _lm("llama", ar.llama_lm_backward),
    "lm_backward": _lm("llama", ar.lm_backward),
    "gpt_neox_lm_backward": _lm("gpt_neox", ar.gpt_neox_lm_backward), "phi3_lm_backward": _lm("phi3", ar.phi3_lm_backward),
    "gemma_block_backward": _gemma_block, "gemma_lm_backward": _lm("gemma2", ar.gemma_lm_backward),
    "sink_softmax_backward": _sink_softmax, "router_backward": _router, "clamped_swiglu_backward": _clamped_swiglu,
    "moe_backward": _moe, "load_balancing_loss_backward": _load_balancing,
    "gated_delta_rule_backward": _gated_delta_rule, "causal_conv1d_backward": _causal_conv1d,
    "gated_rms_norm_backward": _gated_rms_norm, "sigmoid_gate_backward": _sigmoid_gate,
    "gated_delta_net_backward": _gated_delta_net, "gated_attention_backward": _gated_attention,
    "gated_shared_expert_backward": _shared_expert,
    "swiglu_moe_backward": _swiglu_moe, "mla_backward": _mla, "deepseek_block_backward": _deepseek_block,
    "qwen3_moe_block_backward": _qwen3_moe_block,
    "alibi_backward": _alibi, "t5_bias_backward": _t5_bias, "relative_xl_scores_backward": _relative_xl,
}
#: The two without a cache (a split and a merge are permutations): tested on their own below.
CACHELESS = {"split_heads_backward", "merge_heads_backward"}

BAD_DTYPES = {
    "string": lambda shape: np.full(shape, "a"),
    "object": lambda shape: np.ones(shape, dtype=object),
    "complex": lambda shape: np.ones(shape, dtype=complex),
    "bool": lambda shape: np.ones(shape, dtype=bool),
    "float16": lambda shape: np.ones(shape, dtype=np.float16),
}


def test_every_public_backward_is_covered():
    public = {n for n in ar.__all__ + toy_task.__all__ if n.endswith("_backward")}
    classes = {f"{c}.backward" for c in ar.__all__ if hasattr(getattr(ar, c), "backward")}
    assert public | classes == set(BACKWARDS) | CACHELESS


@pytest.mark.parametrize("case", BACKWARDS)
def test_upstream_of_the_wrong_shape_names_both_shapes(case):
    out, backward, name = BACKWARDS[case](np.random.default_rng(0))
    bad = np.ones(out.shape[:-1] + (out.shape[-1] + 1,) if out.ndim else (1,))  # a loss is 0-d
    with pytest.raises(ValueError) as info:
        backward(bad)
    message = str(info.value)
    assert name in message and str(out.shape) in message and str(bad.shape) in message, message


@pytest.mark.parametrize("value, word", [(np.nan, "NaN"), (np.inf, "infinity"), (-np.inf, "infinity")])
@pytest.mark.parametrize("case", BACKWARDS)
def test_upstream_with_nan_or_inf_is_a_value_error(case, value, word):
    out, backward, name = BACKWARDS[case](np.random.default_rng(1))
    dout = np.ones(out.shape)
    dout.flat[-1] = value
    with pytest.raises(ValueError, match=f"{name} contains {word}"):
        backward(dout)


@pytest.mark.parametrize("dtype", BAD_DTYPES)
@pytest.mark.parametrize("case", BACKWARDS)
def test_upstream_of_a_non_real_dtype_is_a_type_error(case, dtype):
    out, backward, name = BACKWARDS[case](np.random.default_rng(2))
    with pytest.raises(TypeError, match=rf"^{name} must"):
        backward(BAD_DTYPES[dtype](out.shape))


@pytest.mark.parametrize("case", ["linear_backward", "scaled_dot_product_attention_backward",
                                  "encoder_block_backward", "TransformerDecoderBlock.backward"])
def test_integer_and_float32_upstream_are_accepted(case):
    """The policy, not a narrowing: integers are computed as float64, float32 is cast."""
    out, backward, _ = BACKWARDS[case](np.random.default_rng(3))
    as_float = backward(np.ones(out.shape))
    for dout in (np.ones(out.shape, int), np.ones(out.shape, np.float32)):
        for got, want in zip(_flatten(backward(dout)), _flatten(as_float)):
            np.testing.assert_array_equal(got, want)


def _flatten(grads):
    """The arrays in a backward's result (tuples, dicts), in order."""
    if isinstance(grads, np.ndarray):
        return [grads]
    if isinstance(grads, dict):
        return [g for v in grads.values() for g in _flatten(v)]
    if grads is None:
        return []
    return [g for v in grads for g in _flatten(v)]


def test_heads_backwards_check_their_gradient():
    with pytest.raises(ValueError, match=r"dheads must have shape \(\.\.\., num_heads, n, d_head\).*\(3, 4\)"):
        ar.split_heads_backward(np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"dmerged must have shape .* num_heads=2, got shape \(3, 5\)"):
        ar.merge_heads_backward(np.ones((3, 5)), 2)
    with pytest.raises(ValueError, match="dheads contains NaN"):
        ar.split_heads_backward(np.full((2, 3, 4), np.nan))
    with pytest.raises(ValueError, match="dmerged contains infinity"):
        ar.merge_heads_backward(np.full((3, 4), np.inf), 2)
    for make in BAD_DTYPES.values():
        with pytest.raises(TypeError, match="dheads"):
            ar.split_heads_backward(make((2, 3, 4)))
        with pytest.raises(TypeError, match="dmerged"):
            ar.merge_heads_backward(make((3, 4)), 2)
    x = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(ar.merge_heads_backward(ar.split_heads_backward(x), 2), x)


# --- c. only float32 and float64 (integers computed in float64) -------------------------

def _forwards():
    """(name of the first argument, call with that argument replaced) for the forwards."""
    rng = np.random.default_rng(4)
    x, W = rng.standard_normal((3, 4)), rng.standard_normal((4, 4))  # the argument tried is (4, 4)
    params = random_params(rng, 4, 2, 2, 2)
    ffn = {"W_1": W, "W_2": W}
    return {
        "linear_forward": ("x", lambda a: ar.linear_forward(a, W)),
        "softmax_forward": ("x", lambda a: ar.softmax_forward(a)),
        "scaled_dot_product_attention_forward": ("q", lambda a: ar.scaled_dot_product_attention_forward(a, x, x)),
        "multi_head_attention_forward": ("query", lambda a: ar.multi_head_attention_forward(a, x, x, params, 2)),
        "flash_attention_forward": ("q", lambda a: ar.flash_attention_forward(a, x, x)),
        "linear_attention_forward": ("q", lambda a: ar.linear_attention_forward(a, x, x)),
        "rope_forward": ("x", lambda a: ar.rope_forward(a)),
        "rope_multi_head_attention_forward": (
            "query", lambda a: ar.rope_multi_head_attention_forward(a, a, a, params, 2, layout="interleaved")),
        "silu": ("x", lambda a: ar.silu(a)),
        "layer_norm_forward": ("x", lambda a: ar.layer_norm_forward(a, np.ones(4), np.zeros(4))),
        "feed_forward_forward": ("x", lambda a: ar.feed_forward_forward(a, ffn)),
        "encoder_block_forward": ("x", lambda a: ar.encoder_block_forward(a, ar.init_encoder_block_params(4, 2), 2)),
        "MultiHeadAttention": ("query", lambda a: ar.MultiHeadAttention(4, 2)(a)),
        "weights": ("params['W_q']", lambda a: ar.multi_head_attention_forward(x, x, x, {**params, "W_q": a}, 2)),
    }


FORWARDS = _forwards()


@pytest.mark.parametrize("dtype", [np.float16, np.longdouble])
@pytest.mark.parametrize("case", FORWARDS)
def test_floats_other_than_float32_and_float64_are_rejected(case, dtype):
    if np.dtype(dtype) == np.float64:
        pytest.skip("longdouble is float64 on this platform")
    name, call = FORWARDS[case]
    with pytest.raises(TypeError, match=rf"^{re.escape(name)} must be float32 or float64 .*dtype {np.dtype(dtype)}"):
        call(np.ones((4, 4), dtype))


@pytest.mark.parametrize("dtype", [complex, object, bool, "U1"])
@pytest.mark.parametrize("case", FORWARDS)
def test_non_real_inputs_are_rejected(case, dtype):
    name, call = FORWARDS[case]
    with pytest.raises(TypeError, match=rf"^{re.escape(name)} must hold real numbers.*dtype"):
        call(np.ones((4, 4), dtype) if dtype != "U1" else np.full((4, 4), "a"))


@pytest.mark.parametrize("case", FORWARDS)
def test_integers_are_computed_in_float64(case):
    _, call = FORWARDS[case]
    out = call(np.ones((4, 4), int))
    out = out[0] if isinstance(out, tuple) else out
    assert out.dtype == np.float64


@pytest.mark.parametrize("mask_dtype", [np.float16, complex, object])
def test_masks_follow_the_same_policy(mask_dtype):
    x = np.ones((3, 4))
    for forward in (ar.scaled_dot_product_attention_forward, ar.flash_attention_forward):
        with pytest.raises(TypeError, match="mask must"):
            forward(x, x, x, np.zeros((3, 3), mask_dtype))


@pytest.mark.parametrize("make", [
    lambda dtype: ar.MultiHeadAttention(4, 2, dtype=dtype),
    lambda dtype: ar.TransformerEncoderBlock(4, 2, dtype=dtype),
    lambda dtype: ar.TransformerDecoderBlock(4, 2, dtype=dtype),
    lambda dtype: ar.init_encoder_block_params(4, 2, dtype=dtype),
    lambda dtype: ar.init_decoder_block_params(4, 2, dtype=dtype),
    lambda dtype: ar.mask_to_additive(np.ones(3, bool), dtype=dtype),
])
@pytest.mark.parametrize("dtype", [np.float16, complex, int, bool, object, "not a dtype"])
def test_dtype_arguments_must_be_float32_or_float64(make, dtype):
    with pytest.raises(TypeError, match="dtype must be a floating dtype, float32 or float64"):
        make(dtype)
    for good in (np.float32, "float64"):
        make(good)


# --- d. scores that overflow: FloatingPointError, no NumPy warning ----------------------

#: Per dtype: an input size whose q k^T overflows (d_k = 4), and the largest finite value
#: as the message prints it.
OVERFLOW = {np.float32: (1e20, "3.403e+38"), np.float64: (1e200, "1.798e+308")}


def _raises_overflow(call, *words):
    """``call()`` raises FloatingPointError naming ``words`` (no NumPy RuntimeWarning first)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(FloatingPointError) as info:
            call()
    message = str(info.value)
    assert all(w in message for w in words), message
    return message


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("dtype", OVERFLOW)
def test_attention_scores_that_overflow_raise(dtype, sign):
    """sign -1: every score overflows to -inf, which would otherwise look like a fully
    masked row (zero output, no error at all)."""
    big, limit = OVERFLOW[dtype]
    q, v = np.full((2, 4), big, dtype), np.ones((2, 3), dtype)
    k = sign * q
    for call in (lambda: ar.scaled_dot_product_attention_forward(q, k, v),
                 lambda: ar.scaled_dot_product_attention_forward(q, k, v, ar.causal_mask(2)),
                 lambda: ar.flash_attention_forward(q, k, v, block_size=1),
                 lambda: ar.flash_attention_forward(q, k, v, causal=True)):
        _raises_overflow(call, "q k^T / sqrt(d_k)", "|q|", "|k|", np.dtype(dtype).name, limit)


@pytest.mark.parametrize("dtype", OVERFLOW)
def test_multi_head_scores_and_projections_that_overflow_raise(dtype):
    big, limit = OVERFLOW[dtype]
    params = {f"W_{n}": np.ones((4, 4), dtype) for n in "qkvo"}  # x W sums 4 entries of x: no cancelling
    x, ones = np.full((3, 4), big, dtype), np.ones((3, 4), dtype)
    _raises_overflow(lambda: ar.multi_head_attention_forward(x, x, x, params, 2),
                     "q k^T / sqrt(d_k)", "query W_q + b_q", "key W_k + b_k", limit)
    _raises_overflow(lambda: ar.multi_head_attention_separate_heads_forward(x, x, x, params, 2),
                     "query W_q + b_q", "key W_k + b_k", limit)
    huge = np.full((3, 4), np.finfo(dtype).max / 2, dtype)  # x W is 2 * max: overflows before any score
    _raises_overflow(lambda: ar.multi_head_attention_forward(huge, x, x, params, 2),
                     "overflow in query W_q", "|query|", "|W_q|", np.dtype(dtype).name)
    _raises_overflow(lambda: ar.multi_head_attention_forward(ones, ones, huge, params, 2),
                     "overflow in value W_v", "|value|")
    layer = ar.MultiHeadAttention(4, 2, seed=0, dtype=dtype)
    _raises_overflow(lambda: layer(x), "q k^T", limit)
    _raises_overflow(lambda: ar.linear_forward(huge, params["W_q"]), "overflow in x W", "|x|", "|W|")


def test_float_mask_that_overflows_the_scores_raises():
    q = np.full((2, 4), 3e18, np.float32)  # scores 1.8e37: finite, but + 3.3e38 is not
    mask = np.full((2, 2), 3.3e38, np.float32)
    for forward in (ar.scaled_dot_product_attention_forward, ar.flash_attention_forward):
        _raises_overflow(lambda: forward(q, q, q, mask), "q k^T / sqrt(d_k) + mask", "float32")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype, big", [(np.float32, 1e13), (np.float64, 1e110)])
def test_linear_attention_sums_that_overflow_raise(dtype, big, causal):
    q = np.full((4, 4), big, dtype)
    _raises_overflow(lambda: ar.linear_attention_forward(q, q, q, causal=causal),
                     "linear-attention sums", "|q|", "|k|", "|v|", np.dtype(dtype).name)


@pytest.mark.parametrize("dtype, big", [(np.float32, 1e19), (np.float64, 9e153)])
def test_scores_near_the_limit_that_do_not_overflow_are_computed(dtype, big):
    """The bound max|q| max|k| d_k allows an overflow here, the exact check finds none."""
    q, v = np.full((2, 4), big, dtype), np.ones((2, 3), dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for forward in (ar.scaled_dot_product_attention_forward, ar.flash_attention_forward):
            out, _ = forward(q, q, v)
            np.testing.assert_array_equal(out, v)  # equal scores: uniform weights over equal values


@pytest.mark.parametrize("dtype", OVERFLOW)
def test_decode_step_and_feed_forward_projections_that_overflow_raise(dtype):
    """The projections of a decoding step and of the feed-forward network are checked too,
    and name their own inputs."""
    huge = np.full((1, 4), np.finfo(dtype).max / 2, dtype)
    layer = ar.MultiHeadAttention(4, 2, seed=0, dtype=dtype)
    layer.params = {name: np.ones_like(w) for name, w in layer.params.items()}
    _raises_overflow(lambda: layer.decode_step(huge, ar.KVCache()), "overflow in x_t W_q", "|x_t|")
    params = {"W_1": np.ones((4, 3), dtype), "b_1": np.zeros(3, dtype),
              "W_2": np.ones((3, 4), dtype), "b_2": np.zeros(4, dtype)}
    _raises_overflow(lambda: ar.feed_forward_forward(huge, params), "overflow in x W_1", "|x|")


def test_nan_in_a_kv_cache_is_refused_when_it_is_appended():
    """A NaN key used to reach the scores' overflow check with no mask and crash there."""
    cache = ar.KVCache()
    with pytest.raises(ValueError, match="keys contains NaN"):
        cache.append(np.full((2, 1, 4), np.nan), np.zeros((2, 1, 4)))
    with pytest.raises(ValueError, match=r"values must have shape \(\.\.\., Hkv, t, Dv\)"):
        cache.append(np.zeros((2, 1, 4)), np.zeros(4))
    assert cache.length == 0


def test_scores_overflow_check_treats_nan_bounds_as_unsafe():
    from attention_ref._checks import scores_may_overflow

    q = np.array([[np.nan, 1.0]])
    assert scores_may_overflow(q, q, 1.0)        # NaN: look at the scores
    assert not scores_may_overflow(np.ones((1, 2)), np.ones((1, 2)), 1.0)


@pytest.mark.parametrize("dtype", [">f8", ">f4"])
def test_byte_swapped_floats_are_accepted(dtype):
    """A big-endian float64 or float32 is float64 or float32: same numbers, same result."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((3, 4)) for _ in range(3))
    out, _ = ar.scaled_dot_product_attention_forward(q.astype(dtype), k.astype(dtype), v.astype(dtype))
    ref, _ = ar.scaled_dot_product_attention_forward(q.astype(dtype[1:]), k.astype(dtype[1:]), v.astype(dtype[1:]))
    np.testing.assert_allclose(out, ref, rtol=1e-6)


@pytest.mark.parametrize("dtype, fix", [(np.float16, "np.float32"), (np.longdouble, "np.float64")])
def test_rejected_float_names_the_lossless_conversion(dtype, fix):
    if np.dtype(dtype).itemsize == 8:
        pytest.skip("longdouble is float64 on this platform")
    with pytest.raises(TypeError, match=re.escape(f"q.astype({fix})")):
        ar.scaled_dot_product_attention_forward(np.ones((2, 2), dtype), np.ones((2, 2)), np.ones((2, 2)))


@pytest.mark.parametrize("mask_dtype", [np.float16, complex])
def test_a_mask_of_another_dtype_gets_the_mask_message(mask_dtype):
    with pytest.raises(TypeError, match="mask must be boolean .* or float32/float64"):
        ar.scaled_dot_product_attention_forward(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)),
                                                np.zeros((2, 2), mask_dtype))


def _pairs():
    """Public forwards that hand back an output, with their backward and inputs."""
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    return {
        "softmax": (lambda: ar.softmax_forward(q), ar.softmax_backward),
        "attention": (lambda: ar.scaled_dot_product_attention_forward(q, k, v), ar.scaled_dot_product_attention_backward),
        "blockwise": (lambda: ar.flash_attention_forward(q, k, v, block_size=2), ar.flash_attention_backward),
        "linear attention": (lambda: ar.linear_attention_forward(q, k, v), ar.linear_attention_backward),
    }


@pytest.mark.parametrize("name", list(_pairs()))
def test_editing_the_returned_output_does_not_change_the_backward(name):
    forward, backward = _pairs()[name]
    out, cache = forward()
    dout = np.random.default_rng(4).standard_normal(out.shape)
    before = backward(dout, cache)
    out += 1.0  # the caller's array; the backward's D_i = rowsum(dout * out) must not see it
    after = backward(dout, cache)
    for a, b in zip(np.atleast_1d(before) if isinstance(before, np.ndarray) else before,
                    np.atleast_1d(after) if isinstance(after, np.ndarray) else after):
        np.testing.assert_array_equal(a, b)


def test_weights_keep_the_batch_axes_of_q_k_and_the_mask_only():
    """Axes that only v carries are broadcast in weights @ v, as the docstring says."""
    out, cache = ar.scaled_dot_product_attention_forward(np.ones((2, 3)), np.ones((4, 3)), np.ones((5, 4, 2)))
    assert out.shape == (5, 2, 2) and cache.weights.shape == (2, 4)
    out, cache = ar.scaled_dot_product_attention_forward(np.ones((2, 3)), np.ones((4, 3)), np.ones((5, 4, 2)),
                                                         np.ones((5, 2, 4), bool))
    assert cache.weights.shape == (5, 2, 4)


# --- the finiteness test without an array of booleans ------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_all_finite_is_exact_when_the_sum_overflows_or_an_entry_is_not_finite(dtype):
    """``all_finite`` reads a sum from ``_SUM_TEST_MIN`` entries on: a finite array whose sum
    overflows is still finite, and one NaN or infinity anywhere is found; no warning escapes and
    the user's error settings stay as they were."""
    from attention_ref._checks import _SUM_TEST_MIN, all_finite

    big = np.full(_SUM_TEST_MIN * 2, np.finfo(dtype).max / 4, dtype)  # its sum overflows
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        assert all_finite(big)
        assert all_finite(-big)
        for bad in (np.nan, np.inf, -np.inf):
            x = np.zeros(_SUM_TEST_MIN + 3, dtype)
            x[-2] = bad
            assert not all_finite(x)
            assert not all_finite(x[::-1].reshape(-1, 1))  # strided
            y = big.copy()
            y[7] = bad
            assert not all_finite(y)
        assert all_finite(np.zeros((0, 4), dtype)) and all_finite(np.zeros(3, dtype))
        assert not all_finite(np.array([1.0, np.nan], dtype))
        assert np.geterr()["over"] == "raise"
    with pytest.raises(ValueError, match="contains infinity"):
        ar.linear_forward(np.r_[np.zeros(_SUM_TEST_MIN, dtype), np.inf].reshape(-1, 1), np.ones((1, 2), dtype))
