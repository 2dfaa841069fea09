"""The exercises: for each hand-derived backward, the formula, what to derive, hints revealed
one at a time, the inputs it is checked on, and the library's own forward and backward (the
reference solution).

An exercise is named after the library function the student writes; the student's function
has that function's signature and receives the cache of the library's forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..core.attention import scaled_dot_product_attention_backward, scaled_dot_product_attention_forward
from ..core.heads import merge_heads, merge_heads_backward, split_heads, split_heads_backward
from ..core.linear import linear_backward, linear_forward
from ..core.multi_head import multi_head_attention_backward, multi_head_attention_forward
from ..core.softmax import softmax_backward, softmax_forward
from ..nn.encoder_block import encoder_block_backward, encoder_block_forward
from ..nn.layer_norm import layer_norm_backward, layer_norm_forward
from ..variants.blockwise import flash_attention_backward, flash_attention_forward
from .contracts import CONTRACTS, Case
from .mistakes import MISTAKES

__all__ = ["Case", "Exercise", "EXERCISES"]


@dataclass(frozen=True)
class Exercise:
    """A backward to derive, with everything needed to check an attempt at it.

    ``steps`` locate a mistake no catalogue entry names: the backward's steps in order, each
    with the outputs it alone feeds; when exactly one step's outputs are the wrong ones, the
    error is in that step. ``cache_fields`` lists every field of the cache the attempt gets.
    """

    name: str
    forward_name: str
    signature: str
    returns: tuple  # names of the gradients, in order
    formula: str  # the forward, and what to derive
    hints: tuple
    cases: Callable  # rng -> list of Case
    forward: Callable  # forward(*inputs, **kwargs) -> (out, cache)
    backward: Callable  # the reference: backward(dout, cache)
    call: Callable = None  # how to call an attempt: call(fn, dout, cache); default fn(dout, cache)
    mistakes: tuple = ()
    wrap_forward: Callable = None  # a student's forward -> one returning (out, cache), when it differs
    steps: tuple = ()  # ((step, frozenset of the outputs it feeds), ...) in the backward's order
    cache_fields: tuple = ()  # ((field, shape and meaning), ...)
    contract: object = None  # the Contract its cases come from (attention_ref.exercises.contracts)

    def run(self, fn, dout, cache):
        """Call an attempt (or the reference) with this exercise's signature."""
        return fn(dout, cache) if self.call is None else self.call(fn, dout, cache)

    def adapt_forward(self, forward):
        """A student's forward with the library forward's signature, as ``(out, cache)``."""
        return forward if self.wrap_forward is None else self.wrap_forward(forward)


def _exercise(name, forward_name, signature, returns, formula, hints, forward, backward, call=None,
              wrap_forward=None):
    contract = CONTRACTS[name]
    return Exercise(name, forward_name, signature, returns, formula, tuple(hints), contract.cases, forward, backward,
                    call, MISTAKES.get(name, ()), wrap_forward, STEPS.get(name, ()), CACHE_FIELDS.get(name, ()),
                    contract)


def _steps(*pairs):
    return tuple((step, frozenset(outputs.split())) for step, outputs in pairs)


_QKV = "dquery W_q b_q dkey W_k b_k dvalue W_v b_v"
_ATTN = "self_attn.W_q self_attn.b_q self_attn.W_k self_attn.b_k self_attn.W_v self_attn.b_v self_attn.W_o self_attn.b_o"
#: exercise -> the backward's steps, each with the outputs it alone feeds (see Exercise)
STEPS = {
    "linear_backward": _steps(("dx = dy W^T", "dx"), ("dW = x^T dy, leading axes folded into the rows", "dW"),
                              ("db = dy summed over every axis but the last", "db")),
    "scaled_dot_product_attention_backward": _steps(
        ("dv = P^T dout", "dv"),
        ("the softmax step (dP = dout v^T then dS = P * (dP - D) with D_i = rowsum(dout_i * out_i)), or"
         " the scale that dq and dk share", "dq dk"),
        ("dq = dS k * scale", "dq"), ("dk = dS^T q * scale", "dk")),
    "layer_norm_backward": _steps(
        ("dx, the normalisation's backward (with the gain, the mean and the variance)", "dx"),
        ("dgamma = dy * x_hat summed over the rows", "dgamma"), ("dbeta = dy summed over the rows", "dbeta")),
    "flash_attention_backward": _steps(
        ("dv[keys] += P^T dout[queries]", "dv"),
        ("each tile's dP = dout v^T, D or dS = P * (dP - D), or the scale that dq and dk share", "dq dk"),
        ("dq[queries] += dS k * scale", "dq"), ("dk[keys] += dS^T q * scale", "dk"),
        ("the recomputed P: the tiles visited, the masks or the saved statistics", "dq dk dv")),
    "multi_head_attention_backward": _steps(
        ("dW_o = concat^T dout", "W_o"), ("db_o = dout summed over every axis but the last", "b_o"),
        ("the attention's dv = P^T dout (or the value heads' merge)", "dvalue W_v b_v"),
        ("the attention's softmax step (dP = dout v^T then dS = P * (dP - D)), or the scale that dq and dk"
         " share", "dquery W_q b_q dkey W_k b_k"),
        ("the attention's dq = dS k * scale (or the query heads' merge)", "dquery W_q b_q"),
        ("the attention's dk = dS^T q * scale (or the key heads' merge)", "dkey W_k b_k"),
        ("dconcat = dout W_o^T or its split into heads", _QKV),
        ("the merge of each head's dq, dk, dv back into dQ, dK, dV (the backward of the split)", _QKV),
        ("dquery = dQ W_q^T", "dquery"), ("dW_q = query^T dQ", "W_q"), ("db_q", "b_q"),
        ("dkey = dK W_k^T", "dkey"), ("dW_k = key^T dK", "W_k"), ("db_k", "b_k"),
        ("dvalue = dV W_v^T", "dvalue"), ("dW_v = value^T dV", "W_v"), ("db_v", "b_v")),
    "encoder_block_backward": _steps(
        ("the feed-forward's weight gradients", "ffn.W_1 ffn.b_1 ffn.W_2 ffn.b_2"),
        ("ln2's dgamma and dbeta", "ln2.gamma ln2.beta"),
        ("the self-attention's weight gradients", _ATTN), ("ln1's dgamma and dbeta", "ln1.gamma ln1.beta"),
        ("dx: dquery + dkey + dvalue, ln1's input gradient, or the residual term", "dx"),
        ("the first sub-layer (self-attention, ln1, their residual) or the gradient the second passes to it",
         _ATTN + " ln1.gamma ln1.beta dx")),
}

#: exercise -> every field of the cache its backward receives, with shapes
CACHE_FIELDS = {
    "softmax_backward": (("y", "(... same shape as x), the softmax output"), ("axis", "int, the softmax's axis")),
    "linear_backward": (("x", "(..., d_in), the input"), ("W", "(d_in, d_out)"),
                        ("has_bias", "bool: return db = None when False")),
    "scaled_dot_product_attention_backward": (
        ("q", "(..., Nq, Dk)"), ("k", "(..., Nk, Dk)"), ("v", "(..., Nk, Dv)"),
        ("weights", "(..., Nq, Nk), P = softmax(S), exactly 0 where masked"), ("out", "(..., Nq, Dv), P v"),
        ("scale", "float, 1/sqrt(d_k)")),
    "split_heads_backward": (("(none)", "the backward gets dheads (..., H, N, Dh) and nothing else"),),
    "merge_heads_backward": (("(none)", "the backward gets dmerged (..., N, H*Dh) and num_heads"),),
    "layer_norm_backward": (("x_hat", "(..., D), (x - mu) * rstd"), ("rstd", "(..., 1), 1 / sqrt(var + eps)"),
                            ("gamma", "(D,)")),
    "flash_attention_backward": (
        ("q", "(..., Nq, Dk)"), ("k", "(..., Nk, Dk)"), ("v", "(..., Nk, Dv)"),
        ("mask", "the caller's mask or None, broadcastable to (..., Nq, Nk)"), ("out", "(..., Nq, Dv)"),
        ("row_max", "(..., Nq), m: each query's largest masked, scaled score"),
        ("log_row_sum", "(..., Nq), log l: l = sum_j exp(S_ij - m_i); +inf for a query with no key"),
        ("scale", "float, 1/sqrt(d_k)"), ("causal", "bool"), ("window", "int or None"),
        ("block_size", "int, the tile side")),
    "encoder_block_backward": (
        ("attn", "ResidualCache of the first sub-layer: sublayer (MultiHeadCache), norm (LayerNormCache),"
                 " norm_first, x_shape, y_shape, y_dtype"),
        ("ffn", "ResidualCache of the second sub-layer: sublayer (FeedForwardCache), norm (LayerNormCache),"
                " norm_first, x_shape, y_shape, y_dtype"),
        ("ffn.sublayer", "FeedForwardCache: fc1 (LinearCache: x, W, has_bias), h (..., n, d_ff) the"
                         " pre-activation, fc2 (LinearCache of the activation's output), activation ('relu',"
                         " 'gelu' the tanh form, or 'gelu_exact' with erf: attention_ref.nn.erf.erf works in"
                         " float32 and float64), param_keys, Phi (the exact GELU's (1 + erf(h / sqrt(2))) / 2, which the"
                         " backward reuses; None for the other activations), t (the tanh form's"
                         " tanh(s (h + c h^3)), which the backward reuses; None for the others)"),
        ("attn.norm, ffn.norm", "LayerNormCache: x_hat, rstd (..., n, 1) = 1/sqrt(var + eps), gamma"),
        ("attn.sublayer.attention.scale", "the scale the scores were multiplied by (scale= or 1/sqrt(d_k))"),
        ("param_keys", "tuple, the keys of params in order")),
    "multi_head_attention_backward": (
        ("q_proj, k_proj, v_proj", "LinearCache (x, W, has_bias) of each projection"),
        ("attention", "AttentionCache of all heads at once: q (..., H, Nq, Dk), k (..., H, Nk, Dk), v (...,"
                      " H, Nk, Dv), weights (..., H, Nq, Nk), out (..., H, Nq, Dv) (the heads), scale"),
        ("o_proj", "LinearCache of the output projection"), ("num_heads", "int, H"),
        ("param_keys", "tuple, the keys of params in order; a bias that is absent (None) in params gets"
                       " grads[...] = None, not zeros")),
}


EXERCISES = {e.name: e for e in [
    _exercise(
        "softmax_backward", "softmax_forward", "softmax_backward(dy, cache) -> dx", ("dx",),
        "y_i = exp(x_i - m) / sum_j exp(x_j - m) along an axis (the last by default; m the maximum).\n"
        "Derive dx = dL/dx from dy = dL/dy. The cache holds y (cache.y) and the axis (cache.axis).",
        ["Every y_j depends on every x_i: write the Jacobian dy_j/dx_i, not only its diagonal.",
         "dy_j/dx_i = y_j (delta_ij - y_i).",
         "dx_i = sum_j dy_j y_j (delta_ij - y_i) = y_i (dy_i - sum_j y_j dy_j); sum along the axis with"
         " keepdims=True so it broadcasts."],
        softmax_forward, softmax_backward),
    _exercise(
        "linear_backward", "linear_forward", "linear_backward(dy, cache) -> (dx, dW, db)", ("dx", "dW", "db"),
        "y = x W + b with x (..., d_in), W (d_in, d_out), b (d_out,) or None.\n"
        "Derive dx, dW, db from dy (..., d_out). The cache holds x, W and has_bias; return db = None"
        " without a bias.",
        ["Each gradient has the shape of what it differentiates: dx like x, dW like W, db like b.",
         "y_nj = sum_i x_ni W_ij + b_j: so dx = dy W^T and dW = x^T dy, with every leading axis of x"
         " folded into the rows n.",
         "b is added to every row of every batch item: db sums dy over all axes but the last."],
        linear_forward, linear_backward),
    _exercise(
        "scaled_dot_product_attention_backward", "scaled_dot_product_attention_forward",
        "scaled_dot_product_attention_backward(dout, cache) -> (dq, dk, dv)", ("dq", "dk", "dv"),
        "S = q k^T / sqrt(d_k) (+ mask), P = softmax(S) along the keys, out = P v.\n"
        "Derive dq, dk, dv from dout (..., n_q, d_v). The cache holds q, k, v, weights (P, 0 where"
        " masked), out and scale (1/sqrt(d_k)).",
        ["Walk the forward backwards: out = P v first, then the softmax, then S = q k^T / sqrt(d_k).",
         "out = P v gives dv = P^T dout and dP = dout v^T.",
         "The softmax gives dS = P * (dP - D), D_i = sum_j P_ij dP_ij. The mask needs no step of its"
         " own: S + M has the identity Jacobian in S (and a blocked entry has P = 0, so dS = 0).",
         "S = q k^T * scale gives dq = dS k * scale and dk = dS^T q * scale; with batch axes"
         " transpose with swapaxes(-1, -2): .T reverses every axis, batch axes included.",
         "q, k and v may have different batch axes that broadcast (k, v shared by every batch item):"
         " sum each gradient over the axes its input was broadcast along, back to its shape. Keep the"
         " inputs' dtype, and read the scale from cache.scale."],
        scaled_dot_product_attention_forward, scaled_dot_product_attention_backward),
    _exercise(
        "split_heads_backward", "split_heads", "split_heads_backward(dheads) -> dx", ("dx",),
        "heads = split_heads(x, H): (..., N, H*Dh) -> (..., H, N, Dh), head i taking the columns"
        " i*Dh:(i+1)*Dh.\nDerive dx from dheads. The split only moves numbers: undo the move.",
        ["The split is a reshape (..., N, H, Dh) and a moveaxis of H before N.",
         "Its backward undoes both in reverse order: move H back after N, then reshape to (..., N, H*Dh)."],
        lambda x, h: (split_heads(x, h), h), split_heads_backward,
        call=lambda fn, dout, cache: fn(dout), wrap_forward=lambda f: lambda x, h: (f(x, h), h)),
    _exercise(
        "merge_heads_backward", "merge_heads", "merge_heads_backward(dmerged, num_heads) -> dheads", ("dheads",),
        "merged = merge_heads(heads): (..., H, N, Dh) -> (..., N, H*Dh), the documents' Concat.\n"
        "Derive dheads from dmerged.",
        ["The merge is a moveaxis of H after N and a reshape; undo them in reverse order.",
         "Split the last axis into (H, Dh) first, then move H before N."],
        lambda heads, h: (merge_heads(heads), h), merge_heads_backward,
        wrap_forward=lambda f: lambda heads, h: (f(heads), h)),
    _exercise(
        "layer_norm_backward", "layer_norm_forward", "layer_norm_backward(dy, cache) -> (dx, dgamma, dbeta)",
        ("dx", "dgamma", "dbeta"),
        "mu, var: mean and (biased) variance of each row over the last axis; rstd = 1/sqrt(var + eps);"
        " x_hat = (x - mu) rstd; y = gamma * x_hat + beta.\nDerive dx, dgamma, dbeta. The cache holds"
        " x_hat, rstd (..., 1) and gamma.",
        ["dgamma and dbeta: gamma and beta act on every row, so sum dy * x_hat and dy over the rows.",
         "Let g = gamma * dy, the gradient reaching x_hat. mu and var depend on every x of the row.",
         "dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)), means over the last axis."],
        layer_norm_forward, layer_norm_backward),
    _exercise(
        "flash_attention_backward", "flash_attention_forward", "flash_attention_backward(dout, cache) -> (dq, dk, dv)",
        ("dq", "dk", "dv"),
        "Blockwise attention with the online softmax: the forward visits tiles of block_size queries"
        " x block_size keys and keeps, per query, m (row_max) and log l (log_row_sum), never P.\n"
        "Derive dq, dk, dv tile by tile. The cache holds q, k, v, mask, out, row_max, log_row_sum,"
        " scale, causal, window, block_size.",
        ["Recompute each tile's probabilities from the saved statistics: P = exp(S - m - log l).",
         "D_i = sum_j P_ij dP_ij over the whole row equals rowsum(dout_i * out_i): compute it once.",
         "Per tile: dv[keys] += P^T dout[queries], dP = dout v^T, dS = P * (dP - D), dq[queries] +="
         " dS k * scale, dk[keys] += dS^T q * scale.",
         "attention_ref.variants.blockwise has _key_blocks (the tiles to visit) and _scores (a tile's"
         " masked, scaled scores); you may use them."],
        flash_attention_forward, flash_attention_backward),
    _exercise(
        "encoder_block_backward", "encoder_block_forward", "encoder_block_backward(dout, cache) -> (dx, grads)",
        ("dx", "grads"),
        "An encoder block: h = LN1(x + SelfAttention(x)), y = LN2(h + FFN(h)) (post-norm), or"
        " h = x + SelfAttention(LN1(x)), y = h + FFN(LN2(h)) (pre-norm); SelfAttention(z) is"
        " multi-head attention with z as query, key and value.\nDerive dx and the parameter"
        " gradients (a flat dict like params: 'self_attn.W_q', ..., 'ln1.gamma', ...). The cache"
        " holds attn and ffn (ResidualCache: sublayer, norm, norm_first, ...) and param_keys.",
        ["Use the pieces: residual_backward(d, cache.ffn, feed_forward_backward) undoes the second"
         " sub-layer and returns (dh, ffn grads, dgamma2, dbeta2).",
         "For the first sub-layer, residual_backward needs the self-attention's backward as"
         " sublayer_backward(ds, c) -> (dz, grads): z fed the query, the key and the value.",
         "So it returns dquery + dkey + dvalue from multi_head_attention_backward(ds, c). Collect the"
         " gradients with attention_ref.nn.residual.join_grads({'self_attn': ..., 'ln1': {'gamma':"
         " ..., 'beta': ...}, 'ffn': ..., 'ln2': ...}, cache.param_keys)."],
        encoder_block_forward, encoder_block_backward),
    _exercise(
        "multi_head_attention_backward", "multi_head_attention_forward",
        "multi_head_attention_backward(dout, cache) -> (dquery, dkey, dvalue, grads)",
        ("dquery", "dkey", "dvalue", "grads"),
        "Q = query W_q + b_q (likewise K, V); split into H heads; head_i = attention(Q_i, K_i, V_i);"
        " concat = merge(heads); out = concat W_o + b_o.\nDerive the gradients of query, key, value"
        " and of every parameter (grads, a dict like params). The cache holds the caches of each step:"
        " q_proj, k_proj, v_proj (LinearCache), attention (AttentionCache of every head at once:"
        " q (..., H, Nq, Dk)), o_proj, num_heads, param_keys.",
        ["Use the pieces: linear_backward for the projections, split/merge for the heads,"
         " scaled_dot_product_attention_backward for the heads' attention.",
         "Walk back: out = concat W_o + b_o, then merge, then attention per head, then split, then the"
         " three projections.",
         "The attention cache holds every head at once, (..., H, N, D): split dconcat into heads,"
         " run the attention backward once, and merge dq, dk, dv back to (..., N, H*D)."],
        multi_head_attention_forward, multi_head_attention_backward),
]}
