"""scaled_dot_product_attention_forward / _backward."""
import math

import numpy as np
import pytest

from attention_ref import (
    causal_mask,
    gradcheck,
    padding_mask,
    scaled_dot_product_attention_backward as sdpa_backward,
    scaled_dot_product_attention_forward as sdpa_forward,
)
from _helpers import assert_close, check_gradients
from _reference import loop_attention

# (q shape, k shape, v shape): unbatched, batched, n_q != n_k, d_k != d_v, broadcast batch
CASES = [
    ((3, 4), (3, 4), (3, 4)),
    ((2, 3, 4), (2, 5, 4), (2, 5, 2)),
    ((2, 2, 1, 3), (2, 2, 4, 3), (2, 2, 4, 5)),
    ((2, 3, 4), (5, 4), (5, 3)),  # keys/values shared across the batch
]


def _inputs(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def _masks(q_shape, k_shape, rng):
    n_q, n_k = q_shape[-2], k_shape[-2]
    bool_mask = rng.random((n_q, n_k)) < 0.7
    bool_mask[:, 0] = True  # every query keeps one key
    float_mask = np.where(rng.random((n_q, n_k)) < 0.3, -np.inf, rng.standard_normal((n_q, n_k)))
    float_mask[:, 0] = 0.5
    return [None, bool_mask, float_mask]


@pytest.mark.parametrize("shapes", CASES)
def test_forward_matches_loop(shapes):
    q, k, v = _inputs(shapes)
    for mask in _masks(q.shape, k.shape, np.random.default_rng(1)):
        out, cache = sdpa_forward(q, k, v, mask)
        ref_out, ref_w = loop_attention(q, k, v, mask)
        assert_close(out, ref_out, what=f"attention output, mask {None if mask is None else mask.dtype}")
        assert_close(cache.weights, ref_w, what="attention weights")


@pytest.mark.parametrize("shapes", CASES)
def test_backward_gradcheck(shapes):
    q, k, v = _inputs(shapes, seed=2)
    for mask in _masks(q.shape, k.shape, np.random.default_rng(3)):
        check_gradients(lambda q, k, v: sdpa_forward(q, k, v, mask), sdpa_backward, q, k, v,
                        names=["q", "k", "v"])


def test_mask_passed_as_trailing_input_to_gradcheck():
    q, k, v = _inputs(CASES[1], seed=4)
    check_gradients(sdpa_forward, sdpa_backward, q, k, v, causal_mask(3, 5))


def test_batched_padding_mask():
    q, k, v = _inputs(((2, 4, 3), (2, 4, 3), (2, 4, 2)), seed=5)
    mask = padding_mask([4, 2], 4)  # (2, 1, 4)
    out, cache = sdpa_forward(q, k, v, mask)
    assert (cache.weights[1, :, 2:] == 0).all()
    assert_close(out, loop_attention(q, k, v, mask)[0])
    check_gradients(lambda q, k, v: sdpa_forward(q, k, v, mask), sdpa_backward, q, k, v)


def test_fully_masked_query_gives_zeros_everywhere():
    q, k, v = _inputs(((3, 2), (4, 2), (4, 3)), seed=6)
    mask = np.ones((3, 4), dtype=bool)
    mask[1] = False  # query 1 may attend to nothing
    out, cache = sdpa_forward(q, k, v, mask)
    assert (out[1] == 0).all() and (cache.weights[1] == 0).all()
    dq, dk, dv = sdpa_backward(np.ones_like(out), cache)
    assert (dq[1] == 0).all() and np.isfinite(dq).all()
    float_mask = np.where(mask, 0.0, -np.inf)
    out_f, _ = sdpa_forward(q, k, v, float_mask)
    assert_close(out_f, out)
    check_gradients(lambda q, k, v: sdpa_forward(q, k, v, mask), sdpa_backward, q, k, v)


def test_causal_outputs_ignore_future_tokens():
    q, k, v = _inputs(((5, 3), (5, 3), (5, 2)), seed=7)
    out, _ = sdpa_forward(q, k, v, causal_mask(5))
    k2, v2 = k.copy(), v.copy()
    k2[3:] += 10.0
    v2[3:] -= 5.0
    out2, _ = sdpa_forward(q, k2, v2, causal_mask(5))
    assert_close(out2[:3], out[:3], what="outputs before the changed tokens")
    assert not np.allclose(out2[3:], out[3:])


def test_permutation_equivariance_without_mask():
    q, k, v = _inputs(((6, 3), (6, 3), (6, 2)), seed=8)
    perm = np.random.default_rng(9).permutation(6)
    out, _ = sdpa_forward(q, k, v)
    out_qperm, _ = sdpa_forward(q[perm], k, v)
    out_kvperm, _ = sdpa_forward(q, k[perm], v[perm])
    assert_close(out_qperm, out[perm], what="permuting queries permutes outputs")
    assert_close(out_kvperm, out, what="permuting key/value pairs changes nothing")


def test_scale_is_one_over_sqrt_dk():
    q, k, v = _inputs(((2, 4), (3, 4), (3, 1)), seed=10)
    _, cache = sdpa_forward(q, k, v)
    scores = q @ k.T / math.sqrt(4)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    assert_close(cache.weights, expected / expected.sum(-1, keepdims=True))


def test_large_scores_stay_finite():
    q, k, v = _inputs(((2, 4, 8), (2, 4, 8), (2, 4, 8)), seed=11)
    for dtype in (np.float64, np.float32):
        out, cache = sdpa_forward((q * 1e4).astype(dtype), (k * 1e4).astype(dtype), v.astype(dtype))
        grads = sdpa_backward(np.ones_like(out), cache)
        assert np.isfinite(out).all() and all(np.isfinite(g).all() for g in grads)


def test_dtypes_and_no_mutation():
    q, k, v = _inputs(CASES[1], seed=12)
    copies = [a.copy() for a in (q, k, v)]
    mask = causal_mask(3, 5)
    mask_copy = mask.copy()
    out, cache = sdpa_forward(q, k, v, mask)
    sdpa_backward(np.ones_like(out), cache)
    for a, c in zip((q, k, v, mask), copies + [mask_copy]):
        np.testing.assert_array_equal(a, c)
    out32, cache32 = sdpa_forward(*(a.astype(np.float32) for a in (q, k, v)), mask)
    assert out32.dtype == np.float32 and cache32.weights.dtype == np.float32
    assert all(g.dtype == np.float32 for g in sdpa_backward(np.ones_like(out32), cache32))
    assert_close(out32, out, rtol=1e-5, atol=1e-5)
    out_int, _ = sdpa_forward(np.ones((2, 2), int), np.ones((2, 2), int), np.ones((2, 2), int))
    assert out_int.dtype == np.float64


def test_gradcheck_catches_missing_scale_and_ignored_mask():
    q, k, v = _inputs(((3, 4), (4, 4), (4, 2)), seed=13)
    mask = causal_mask(3, 4)

    def backward_without_scale(dout, cache):
        dq, dk, dv = sdpa_backward(dout, cache)
        return dq / cache.scale, dk / cache.scale, dv  # forgets the 1/sqrt(d_k)

    def backward_ignoring_mask(dout, cache):
        # recomputes the weights without the mask: masked keys wrongly get gradient
        _, unmasked = sdpa_forward(cache.q, cache.k, cache.v)
        return sdpa_backward(dout, unmasked)

    assert not gradcheck(sdpa_forward, backward_without_scale, q, k, v, mask).ok
    assert not gradcheck(sdpa_forward, backward_ignoring_mask, q, k, v, mask).ok
    assert gradcheck(sdpa_forward, sdpa_backward, q, k, v, mask).ok


@pytest.mark.parametrize("shapes, mask, error, words", [
    (((3, 4), (3, 5), (3, 4)), None, ValueError, ["q", "(3, 4)", "k", "(3, 5)", "d_k"]),
    (((3, 4), (3, 4), (2, 4)), None, ValueError, ["k", "v", "n_k", "(2, 4)"]),
    (((4,), (3, 4), (3, 4)), None, ValueError, ["q", "(4,)"]),
    (((2, 3, 4), (3, 3, 4), (3, 3, 4)), None, ValueError, ["batch", "(2,)", "(3,)"]),
    (((3, 4), (5, 4), (5, 2)), np.ones((3, 4), bool), ValueError, ["mask", "(3, 4)", "(3, 5)"]),
    (((3, 4), (5, 4), (5, 2)), np.ones((2, 3, 5), bool), ValueError, ["mask", "(2, 3, 5)"]),
    (((3, 4), (5, 4), (5, 2)), np.ones((3, 5), int), TypeError, ["mask", "astype(bool)"]),
    (((3, 4), (5, 4), (5, 2)), np.full((3, 5), np.nan), ValueError, ["mask", "NaN"]),
    (((3, 4), (5, 4), (5, 2)), np.full((3, 5), np.inf), ValueError, ["mask", "infinity"]),
])
def test_bad_input(shapes, mask, error, words):
    q, k, v = _inputs(shapes)
    with pytest.raises(error) as info:
        sdpa_forward(q, k, v, mask)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_bad_values():
    q, k, v = _inputs(((3, 4), (3, 4), (3, 4)))
    with pytest.raises(ValueError, match="k contains NaN"):
        sdpa_forward(q, np.where(k > 0, np.nan, k), v)
    with pytest.raises(TypeError, match="v"):
        sdpa_forward(q, k, v.astype(complex))
    with pytest.raises(TypeError, match="q"):
        sdpa_forward([["a"]], k, v)
    _, cache = sdpa_forward(q, k, v)
    with pytest.raises(ValueError, match="dout"):
        sdpa_backward(np.ones((2, 4)), cache)


def test_float64_mask_on_float32_scores_does_not_warn_or_upcast():
    q, k, v = (a.astype(np.float32) for a in _inputs(((3, 4), (5, 4), (5, 2)), seed=14))
    mask = np.zeros((3, 5))
    mask[:, 3:] = -1e300  # becomes -inf in float32: blocked, as meant, and no overflow warning
    out, cache = sdpa_forward(q, k, v, mask)
    assert out.dtype == np.float32 and (cache.weights[:, 3:] == 0).all()


def test_backward_with_no_keys_gives_zero_gradients():
    """n_k = 0: every query sees nothing, output 0, and the branch guarding the empty
    softmax backward returns zeros of the right shapes."""
    q, k, v = np.ones((3, 4)), np.ones((0, 4)), np.ones((0, 2))
    out, cache = sdpa_forward(q, k, v)
    assert out.shape == (3, 2) and not out.any()
    dq, dk, dv = sdpa_backward(np.ones((3, 2)), cache)
    assert (dq.shape, dk.shape, dv.shape) == ((3, 4), (0, 4), (0, 2)) and not dq.any()


@pytest.mark.parametrize("which", ["k", "v"])
def test_one_dimensional_keys_or_values_are_rejected(which):
    args = {"q": np.ones((3, 4)), "k": np.ones((3, 4)), "v": np.ones((3, 2))}
    args[which] = np.ones(4)
    with pytest.raises(ValueError, match=rf"^{which} must have shape \(\.\.\., n_k, d_[kv]\) \(at least 2 axes\)"):
        sdpa_forward(args["q"], args["k"], args["v"])


def test_queries_of_width_zero_are_rejected():
    with pytest.raises(ValueError) as info:
        sdpa_forward(np.ones((3, 0)), np.ones((2, 0)), np.ones((2, 2)))
    assert str(info.value) == "d_k must be positive: q has shape (3, 0)"


def test_mask_with_batch_axes_that_only_v_carries():
    """The weights widen to the mask's batch axes (here 2, carried by v and the mask only)."""
    rng = np.random.default_rng(23)
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((2, 5, 2))
    for mask in (rng.random((2, 3, 5)) < 0.7, rng.standard_normal((2, 3, 5))):
        mask[..., 0] = True if mask.dtype == bool else 0.0
        out, cache = sdpa_forward(q, k, v, mask)
        ref_out, ref_weights = loop_attention(q, k, v, mask)
        assert_close(out, ref_out)
        assert_close(cache.weights, ref_weights)


def test_float64_mask_is_rounded_to_float32_before_it_is_added():
    """float32 scores + float64 mask: the mask is cast first (float32 work throughout), so
    the result has the same bits as passing the mask in float32."""
    rng = np.random.default_rng(24)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((20, 4), (30, 4), (30, 3)))
    mask = 3 * rng.standard_normal((20, 30))
    out64, cache64 = sdpa_forward(q, k, v, mask)
    out32, cache32 = sdpa_forward(q, k, v, mask.astype(np.float32))
    np.testing.assert_array_equal(cache64.weights, cache32.weights)
    np.testing.assert_array_equal(out64, out32)


@pytest.mark.parametrize("mask", [False, True])
def test_float32_overflow_names_float32_and_the_fix(mask):
    big = 1e19 if mask else 1e20  # scores of 1e38 are finite (the mask pushes them over), 1e40 are not
    q, k = np.full((1, 1), big, np.float32), np.full((2, 1), big, np.float32)
    m = np.array([[0.0, 3e38]], np.float32) if mask else None
    with np.errstate(all="raise"), pytest.raises(FloatingPointError) as info:
        sdpa_forward(q, k, np.ones((2, 2), np.float32), m)
    assert "the largest finite float32, 3.403e+38" in str(info.value)
    assert str(info.value).endswith("; scale the inputs down or compute in float64")

    with pytest.raises(ValueError, match=r"^q must have shape \(\.\.\., n_q, d_k\) \(at least 2 axes\), got shape \(4,\)$"):
        sdpa_forward(np.ones(4), np.ones((3, 4)), np.ones((3, 2)))


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_batch_axes_that_do_not_broadcast_are_named(which):
    shapes = {"q": (3, 2, 4), "k": (3, 5, 4), "v": (3, 5, 2)}
    shapes[which] = (2,) + shapes[which][1:]
    q, k, v = (np.ones(shapes[n]) for n in "qkv")
    batches = ", ".join(f"{n} {shapes[n][:1]}" for n in "qkv")
    with pytest.raises(ValueError) as info:
        sdpa_forward(q, k, v)
    assert str(info.value) == f"batch dimensions (all but the last two axes) do not broadcast: {batches}"


@pytest.mark.parametrize("wide", ["q", "k", "v"])
def test_one_float64_input_makes_the_computation_float64(wide):
    arrays = dict(zip("qkv", _inputs(((3, 4), (5, 4), (5, 2)), seed=21)))
    args = {n: a if n == wide else a.astype(np.float32) for n, a in arrays.items()}
    out, cache = sdpa_forward(args["q"], args["k"], args["v"])
    assert out.dtype == cache.weights.dtype == np.float64
    assert_close(out, loop_attention(arrays["q"], arrays["k"], arrays["v"])[0], rtol=1e-6, atol=1e-7)


def test_overflowing_scores_of_both_signs_raise_without_a_warning():
    """+inf and -inf products in one score give NaN (an 'invalid' warning): reported as the overflow."""
    q = np.full((2, 4), 1e200)
    k = np.full((3, 4), 1e200) * np.array([1.0, -1.0, 1.0, -1.0])
    message = (r"^overflow in the attention scores q k\^T / sqrt\(d_k\): the result exceeds the largest finite"
               r" float64, 1\.798e\+308 \(largest \|q\| = 1e\+200, largest \|k\| = 1e\+200\); scale the inputs down$")
    with np.errstate(all="raise"), pytest.raises(FloatingPointError, match=message):
        sdpa_forward(q, k, np.ones((3, 2)))


def test_a_float_mask_that_overflows_the_scores_is_named():
    mask = np.zeros((1, 2))
    mask[0, 1] = 1e308  # finite scores of 1e308 plus 1e308
    message = r"^overflow in the scores q k\^T / sqrt\(d_k\) \+ mask \(largest mask value 1e\+308\): "
    with np.errstate(all="raise"), pytest.raises(FloatingPointError, match=message):
        sdpa_forward(np.full((1, 1), 1e154), np.full((2, 1), 1e154), np.ones((2, 2)), mask)


def test_scale_option():
    q, k, v = _inputs(((2, 3, 4), (2, 5, 4), (2, 5, 3)), seed=25)
    out, cache = sdpa_forward(q, k, v, scale=0.3)
    scores = q @ k.swapaxes(-1, -2) * 0.3
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    assert cache.scale == 0.3
    assert_close(out, weights @ v, what="scale 0.3")
    np.testing.assert_array_equal(sdpa_forward(q, k, v, scale=None)[0], sdpa_forward(q, k, v)[0])
    check_gradients(lambda q, k, v: sdpa_forward(q, k, v, scale=0.3), sdpa_backward, q, k, v, names=["q", "k", "v"])
    with pytest.raises(ValueError, match="^scale must be a positive real number or None, got 0.0$"):
        sdpa_forward(q, k, v, scale=0.0)
    with pytest.raises(TypeError, match="^scale must be a positive real number or None, got True$"):
        sdpa_forward(q, k, v, scale=True)
