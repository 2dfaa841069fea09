"""Linear attention against a plain loop from the formula, finite differences and bad input."""
import numpy as np
import pytest

from attention_ref import linear_attention_backward, linear_attention_forward
from attention_ref.variants.linear_attention import DEN_EPS, FEATURE_MAPS
from tests._helpers import assert_close, check_gradients


def phi_loop(x, feature_map):
    """The feature maps written out scalar by scalar."""
    out = np.empty_like(x)
    for idx, value in np.ndenumerate(x):
        if feature_map == "elu":
            out[idx] = value + 1.0 if value > 0 else np.exp(value)
        else:
            out[idx] = np.log1p(np.exp(value))
    return out


def loop_linear_attention(q, k, v, causal, feature_map):
    """out_i = sum_j (phi(q_i).phi(k_j)) v_j / (sum_j phi(q_i).phi(k_j) + DEN_EPS), j allowed."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    fq, fk = phi_loop(q, feature_map), phi_loop(k, feature_map)
    out = np.zeros(np.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (n_q, v.shape[-1]))
    for b in np.ndindex(out.shape[:-2]):
        for i in range(n_q):
            last = i + n_k - n_q if causal else n_k - 1
            weights = np.array([fq[b][i] @ fk[b][j] for j in range(last + 1)])
            out[b][i] = (weights[:, None] * v[b][: last + 1]).sum(axis=0) / (weights.sum() + DEN_EPS)
    return out


CASES = [  # q, k, v shapes, causal
    ((6, 3), (6, 3), (6, 2), False),
    ((2, 5, 3), (2, 7, 3), (2, 7, 4), False),
    ((2, 6, 3), (2, 6, 3), (2, 6, 2), True),
    ((2, 4, 3), (2, 7, 3), (2, 7, 4), True),  # n_q < n_k: queries are the last positions
]


@pytest.mark.parametrize("q_shape, k_shape, v_shape, causal", CASES)
@pytest.mark.parametrize("feature_map", sorted(FEATURE_MAPS))
def test_matches_loop(q_shape, k_shape, v_shape, causal, feature_map):
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal(q_shape), rng.standard_normal(k_shape), rng.standard_normal(v_shape)
    out, _ = linear_attention_forward(q, k, v, causal=causal, feature_map=feature_map)
    assert_close(out, loop_linear_attention(q, k, v, causal, feature_map), what="out")


@pytest.mark.parametrize("q_shape, k_shape, v_shape, causal", CASES)
@pytest.mark.parametrize("feature_map", sorted(FEATURE_MAPS))
def test_gradcheck(q_shape, k_shape, v_shape, causal, feature_map):
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal(q_shape), rng.standard_normal(k_shape), rng.standard_normal(v_shape)
    check_gradients(lambda q, k, v: linear_attention_forward(q, k, v, causal=causal, feature_map=feature_map),
                    linear_attention_backward, q, k, v, names=["q", "k", "v"])


def test_gradcheck_broadcast_batch():
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((2, 1, 4, 3)), rng.standard_normal((3, 4, 3)), rng.standard_normal((3, 4, 2))
    for causal in (False, True):
        check_gradients(lambda q, k, v: linear_attention_forward(q, k, v, causal=causal),
                        linear_attention_backward, q, k, v, names=["q", "k", "v"])


def test_causal_is_blind_to_the_future_and_weights_are_convex():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((8, 4)) for _ in range(3))
    out, _ = linear_attention_forward(q, k, v, causal=True)
    k2, v2 = k.copy(), v.copy()
    k2[5:], v2[5:] = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    out2, _ = linear_attention_forward(q, k2, v2, causal=True)
    assert_close(out[:5], out2[:5], what="outputs before the change")
    assert not np.allclose(out[5:], out2[5:])
    # the first query sees only the first key, with weight 1 (up to the floor DEN_EPS)
    w = phi_loop(q[0], "elu") @ phi_loop(k[0], "elu")
    assert_close(out[0], v[0] * w / (w + DEN_EPS), what="first causal output")
    # positive weights summing to 1 without the floor: each output, rescaled by
    # (den + DEN_EPS) / den, lies inside the values' bounding box
    full, cache = linear_attention_forward(q, k, v)
    full = full * (cache.den / (cache.den - DEN_EPS))[:, None]
    assert (full <= v.max(axis=0) + 1e-12).all() and (full >= v.min(axis=0) - 1e-12).all()


def test_float32_and_inputs_untouched():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((5, 4)).astype(np.float32) for _ in range(3))
    copies = [a.copy() for a in (q, k, v)]
    for causal in (False, True):
        out, cache = linear_attention_forward(q, k, v, causal=causal)
        grads = linear_attention_backward(np.ones_like(out), cache)
        assert out.dtype == np.float32 and all(g.dtype == np.float32 for g in grads)
    for a, c in zip((q, k, v), copies):
        np.testing.assert_array_equal(a, c)


def test_large_inputs_do_not_overflow():
    q = np.array([[800.0, -800.0]])
    k = np.array([[700.0, -900.0], [-1.0, 2.0]])
    v = np.array([[1.0], [2.0]])
    out, cache = linear_attention_forward(q, k, v)
    assert np.isfinite(out).all()
    assert all(np.isfinite(g).all() for g in linear_attention_backward(np.ones_like(out), cache))


def test_bad_inputs():
    with pytest.raises(ValueError, match="feature_map"):
        linear_attention_forward(np.ones((3, 2)), np.ones((3, 2)), np.ones((3, 2)), feature_map="relu")
    with pytest.raises(TypeError, match="causal"):
        linear_attention_forward(np.ones((3, 2)), np.ones((3, 2)), np.ones((3, 2)), causal=1)
    with pytest.raises(ValueError, match=r"n_q <= n_k.*\(4, 2\).*\(3, 2\)"):
        linear_attention_forward(np.ones((4, 2)), np.ones((3, 2)), np.ones((3, 2)), causal=True)
    with pytest.raises(ValueError, match="d_k"):
        linear_attention_forward(np.ones((3, 2)), np.ones((3, 4)), np.ones((3, 2)))
    with pytest.raises(TypeError, match="v"):
        linear_attention_forward(np.ones((3, 2)), np.ones((3, 2)), np.ones((3, 2), dtype=bool))
    _, cache = linear_attention_forward(np.ones((3, 2)), np.ones((3, 2)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="dout"):
        linear_attention_backward(np.ones((3, 3)), cache)


# --- regressions: the normaliser floor DEN_EPS ---

@pytest.mark.parametrize("dtype, value", [(np.float32, -60.0), (np.float64, -380.0)])
@pytest.mark.parametrize("causal", [False, True])
def test_underflowing_normaliser_gives_finite_output_without_warning(dtype, value, causal):
    """phi(q).phi(k) underflows to 0 in floating point; the floor keeps out = 0 / DEN_EPS finite."""
    q = k = np.full((2, 4), value, dtype)
    v = np.ones((2, 3), dtype)
    out, cache = linear_attention_forward(q, k, v, causal=causal)  # warnings are errors
    assert out.dtype == dtype and np.isfinite(out).all()
    grads = linear_attention_backward(np.ones_like(out), cache)
    assert all(g.dtype == dtype and np.isfinite(g).all() for g in grads)


def test_no_keys_gives_zeros_like_the_plain_path():
    out, cache = linear_attention_forward(np.ones((3, 2)), np.ones((0, 2)), np.ones((0, 4)))
    assert out.shape == (3, 4) and np.all(out == 0)
    dq, dk, dv = linear_attention_backward(np.ones((3, 4)), cache)
    assert np.all(dq == 0) and dk.shape == (0, 2) and dv.shape == (0, 4)


def test_floor_is_the_documented_constant():
    """out = num / (den + DEN_EPS): the floor changes a normal-range result by ~DEN_EPS / den only."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((4, 3)) for _ in range(3))
    out, cache = linear_attention_forward(q, k, v)
    fq, fk = phi_loop(q, "elu"), phi_loop(k, "elu")
    weights = fq @ fk.T  # (Nq, Nk), phi(q_i).phi(k_j)
    exact_den = weights.sum(axis=1)
    assert_close(cache.den, exact_den + DEN_EPS, what="stored normaliser")
    assert_close(out * (exact_den + DEN_EPS)[:, None] / exact_den[:, None],
                 (weights / exact_den[:, None]) @ v, what="out without the floor")
    assert 1e-9 < np.abs(out - (weights / exact_den[:, None]) @ v).max() < 1e-5  # the floor is felt, slightly


def test_causal_backward_with_no_queries_gives_zero_gradients():
    """n_q = 0 with keys: the keys before the first query see no query at all."""
    import attention_ref as ar

    q, k, v = np.zeros((0, 3)), np.ones((2, 3)), np.ones((2, 2))
    out, cache = ar.linear_attention_forward(q, k, v, causal=True)
    dq, dk, dv = ar.linear_attention_backward(np.zeros_like(out), cache)
    assert (dq.shape, dk.shape, dv.shape) == ((0, 3), (2, 3), (2, 2))
    assert not dk.any() and not dv.any()
