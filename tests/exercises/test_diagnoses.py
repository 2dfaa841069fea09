"""Diagnoses never mislead (issue 29): the five misleading kinds a student found, as
regressions. When hypotheses disagree the checker says less, never something wrong."""
import numpy as np

from attention_ref import (
    merge_heads_backward,
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
