"""Diagnoses never mislead (issue 29): the five misleading kinds a student found, as
regressions. When hypotheses disagree the checker says less, never something wrong."""
import numpy as np

from attention_ref import (
    linear_backward,
    merge_heads_backward,
    multi_head_attention_backward,
    scaled_dot_product_attention_backward,
    softmax_backward,
    split_heads_backward,
)
from attention_ref._checks import unbroadcast
from attention_ref.exercises import check


def test_an_error_only_at_the_minus_inf_entries_is_never_called_precision():
    def tiny_at_masked(dy, cache):
        return np.where(cache.y == 0, 1e-9 * dy, softmax_backward(dy, cache))

    d = check("softmax_backward", tiny_at_masked).diagnosis
    assert "right except at masked entries" in d and "precision" not in d


def test_a_scale_taken_from_d_v_is_not_blamed_on_the_softmax_step():
    def scale_from_v(dout, cache):
        dq, dk, dv = scaled_dot_product_attention_backward(dout, cache)
        wrong = (1 / np.sqrt(cache.v.shape[-1])) / cache.scale
        return dq * wrong, dk * wrong, dv

    d = check("scaled_dot_product_attention_backward", scale_from_v).diagnosis
    assert "the error is in the softmax step;" not in d  # it may be the scale: both are said
    assert "widths = 'd_v != d_k' in the wrong cases and 'd_v = d_k' in the right ones" in d


def test_a_split_has_no_product_whose_factors_to_swap():
    def transposed(dheads):
        return np.swapaxes(split_heads_backward(dheads), -1, -2)

    d = check("split_heads_backward", transposed).diagnosis
    assert "its last two axes are exchanged" in d and "product" not in d


def test_a_ratio_that_tracks_h_is_a_factor_h_not_a_factor_2():
    for name, attempt in (("split_heads_backward", lambda dh: split_heads_backward(dh) * dh.shape[-3]),
                          ("merge_heads_backward", lambda dm, h: merge_heads_backward(dm, h) * h)):
        d = check(name, attempt).diagnosis
        assert "is h times the true gradient in every case" in d and "a factor 2" not in d, d


def test_a_ratio_that_changes_with_no_named_factor_is_not_given_one_cases_number():
    def by_rows(dheads):
        return split_heads_backward(dheads) * (dheads.shape[-2] + 0.5)  # N + 0.5: no factor of the cases

    d = check("split_heads_backward", by_rows).diagnosis
    assert "a multiple of the true gradient that changes from case to case" in d and "a factor 2" not in d, d


def test_a_computed_gradient_that_sums_to_zero_is_not_called_missing():
    def cancelling_dk(dout, cache):
        dq, _, dv = scaled_dot_product_attention_backward(dout, cache)
        P = cache.weights
        dP = dout @ np.swapaxes(cache.v, -1, -2)
        dS = P * (dP - (P * dP).sum(-1, keepdims=True))  # each row of dS sums to 0
        dk = np.swapaxes(dS.sum(-1, keepdims=True) * np.ones_like(dS), -1, -2) @ cache.q * cache.scale
        return dq, unbroadcast(dk, cache.k.shape), dv

    d = check("scaled_dot_product_attention_backward", cancelling_dk).diagnosis
    assert "missing" not in d and "zero up to rounding everywhere" in d and "its terms cancel" in d


def test_two_steps_that_feed_the_same_wrong_outputs_are_both_said():
    """The heads of dq, dk, dv merged back in reverse order: the wrong outputs (dquery, dkey,
    dvalue and their weights) are fed both by dconcat's split into heads and by the merge of the
    heads' gradients; the checker must not name one of them as the place."""
    def heads_reversed_in_the_merge(dout, cache):
        dconcat, dW_o, db_o = linear_backward(dout, cache.o_proj)
        dheads = merge_heads_backward(dconcat, cache.num_heads)  # (..., H, Nq, Dv)
        grads = {"W_o": dW_o, "b_o": db_o}
        inputs = []
        for name, d, proj in zip("qkv", scaled_dot_product_attention_backward(dheads, cache.attention),
                                 (cache.q_proj, cache.k_proj, cache.v_proj)):
            dx, grads["W_" + name], grads["b_" + name] = linear_backward(
                split_heads_backward(d[..., ::-1, :, :]), proj)  # the heads in reverse order
            inputs.append(dx)
        return (*inputs, {key: grads[key] for key in cache.param_keys})

    d = check("multi_head_attention_backward", heads_reversed_in_the_merge).diagnosis
    assert "the error is in one of:" in d, d
    assert "dconcat = dout W_o^T or its split into heads" in d and "dq, dk, dv back into dQ, dK, dV" in d, d


def test_right_only_where_an_axis_has_size_1_is_no_squeeze():
    """A split backward that exchanges N and Dh before the reshape is right only where N = 1;
    it has no squeeze: the checker says what the right cases share, not a cause."""
    def n_and_d_head_exchanged(dheads):
        *batch, h, n, d_head = dheads.shape
        return np.einsum("...hnd->...hdn", dheads).reshape(*batch, n, h * d_head)

    d = check("split_heads_backward", n_and_d_head_exchanged).diagnosis
    assert "squeeze" not in d and "'N' in the right ones" in d and "share an axis of size 1" in d, d


def test_a_bias_given_where_none_belongs_is_not_blamed_on_the_dtype():
    """Every bias's presence read from b_q's: wrong exactly where the biases are mixed. The
    cases where b_k is present but its gradient is zero up to rounding still count as right."""
    def presence_from_b_q(dout, cache):
        dquery, dkey, dvalue, grads = multi_head_attention_backward(dout, cache)
        for name in ("b_k", "b_v", "b_o"):
            proj = getattr(cache, name[-1] + "_proj")
            grads[name] = None if not cache.q_proj.has_bias else \
                grads[name] if grads[name] is not None else np.zeros(proj.W.shape[1], proj.W.dtype)
        return dquery, dkey, dvalue, grads

    d = check("multi_head_attention_backward", presence_from_b_q).diagnosis
    assert "bias = " in d and "dtype" not in d, d
