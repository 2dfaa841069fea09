"""Rotary position embedding: a loop from the formula, relative positions, norms, gradients."""
import numpy as np
import pytest

from attention_ref import rope_backward, rope_forward
from tests._helpers import assert_close, check_gradients


def loop_rope(x, positions, base=10000.0):
    """Rotate pair (2i, 2i+1) of the vector at position p by p * base^(-2i/d), scalar by scalar.

    ``positions`` is broadcast against ``x.shape[:-1]``: (n,) or batched such as (..., n).
    """
    y = np.empty_like(x)
    d = x.shape[-1]
    positions = np.broadcast_to(positions, x.shape[:-1])
    for idx in np.ndindex(x.shape[:-1]):
        p = positions[idx]
        for i in range(d // 2):
            angle = p * base ** (-2 * i / d)
            a, b = x[idx + (2 * i,)], x[idx + (2 * i + 1,)]
            y[idx + (2 * i,)] = a * np.cos(angle) - b * np.sin(angle)
            y[idx + (2 * i + 1,)] = a * np.sin(angle) + b * np.cos(angle)
    return y


@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 6, 8)])
@pytest.mark.parametrize("positions", [None, "offset", "real"])
@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_matches_loop(shape, positions, base):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    n = shape[-2]
    pos = {None: None, "offset": np.arange(n) + 17, "real": rng.uniform(-3, 50, n)}[positions]
    y, _ = rope_forward(x, pos, base=base, layout="interleaved")
    assert_close(y, loop_rope(x, np.arange(n) if pos is None else pos, base), what="rotated x")


def test_position_zero_is_identity():
    x = np.random.default_rng(1).standard_normal((3, 6))
    y, _ = rope_forward(x, np.zeros(3, dtype=int), layout="interleaved")
    assert_close(y, x, what="no rotation at position 0")


def test_score_depends_only_on_offset():
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((1, 16)), rng.standard_normal((1, 16))

    def score(m, n):
        qm, _ = rope_forward(q, np.array([m]), layout="interleaved")
        kn, _ = rope_forward(k, np.array([n]), layout="interleaved")
        return float(qm[0] @ kn[0])

    for m, n in [(0, 0), (5, 2), (2, 5), (40, 33)]:
        for shift in (1, 7, 1000):
            assert abs(score(m, n) - score(m + shift, n + shift)) < 1e-10
    assert abs(score(5, 2) - score(2, 5)) > 1e-3  # but the sign of the offset matters


def test_norms_preserved():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 9, 8))
    y, _ = rope_forward(x, layout="interleaved")
    assert_close(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), what="norms")


@pytest.mark.parametrize("shape, positions", [((4, 2), None), ((2, 5, 6), np.array([3, 0, 9, 1, 4])),
                                              ((2, 3, 4), np.array([[0, 1, 2], [5, 6, 7]]))])
def test_gradcheck(shape, positions):
    x = np.random.default_rng(4).standard_normal(shape)
    check_gradients(lambda x: rope_forward(x, positions, layout="interleaved"), rope_backward, x, names=["x"])


def test_float32_and_input_untouched():
    x = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32)
    copy = x.copy()
    y, cache = rope_forward(x, np.arange(4) + 0.5, layout="interleaved")
    assert y.dtype == np.float32 and rope_backward(np.ones_like(y), cache).dtype == np.float32
    np.testing.assert_array_equal(x, copy)
    assert_close(y, loop_rope(x.astype(np.float64), np.arange(4) + 0.5), rtol=1e-5, atol=1e-6, what="float32")


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"even.*\(3, 5\)"):
        rope_forward(np.ones((3, 5)))
    with pytest.raises(ValueError, match=r"^positions of shape \(4,\) does not fit x of shape \(3, 4\): expected \(3,\)"):
        rope_forward(np.ones((3, 4)), np.arange(4))
    with pytest.raises(ValueError, match="base"):
        rope_forward(np.ones((3, 4)), base=-1.0)
    with pytest.raises(TypeError, match="base"):
        rope_forward(np.ones((3, 4)), base="big")
    with pytest.raises(TypeError, match="positions"):
        rope_forward(np.ones((3, 4)), np.array([True, False, True]))
    with pytest.raises(ValueError, match="x"):
        rope_forward(np.ones(4))
    _, cache = rope_forward(np.ones((3, 4)))
    with pytest.raises(ValueError, match="dy"):
        rope_backward(np.ones((3, 6)), cache)


@pytest.mark.parametrize("shape, positions_shape", [((2, 3, 6, 8), (2, 1, 6)), ((2, 3, 6, 8), (1, 3, 6)),
                                                    ((4, 5, 2), (4, 5)), ((2, 3, 6, 8), (1, 1, 6)),
                                                    ((2, 3, 6, 8), (6,)), ((2, 3, 6, 8), (1,)),
                                                    ((2, 3, 6, 8), (1, 6))])
def test_batched_positions_match_loop(shape, positions_shape):
    rng = np.random.default_rng(6)
    x = rng.standard_normal(shape)
    positions = rng.uniform(-5, 200, positions_shape)
    y, cache = rope_forward(x, positions, layout="interleaved")
    assert_close(y, loop_rope(x, positions), what="rotated x")
    dy = rng.standard_normal(shape)
    assert_close(rope_backward(dy, cache), loop_rope(dy, -positions), what="dx = R(-p) dy")


@pytest.mark.parametrize("bad_shape", [(2, 3, 4), (1, 3, 4), (3, 2), (4, 4)])
def test_backward_rejects_gradients_of_another_shape(bad_shape):
    _, cache = rope_forward(np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"dy must have shape \(3, 4\)"):
        rope_backward(np.ones(bad_shape), cache)


def test_float32_stays_float32_with_float64_positions():
    """Angles are computed in float64 (accuracy at large positions); cos, sin and y are float32."""
    x = np.ones((3, 4), np.float32)
    y, cache = rope_forward(x, np.array([0.5, 1e5, 3.0]))
    assert y.dtype == cache.cos.dtype == cache.sin.dtype == np.float32


def _llama_rope(x, positions, base=10000.0):
    """transformers' formula, written out: x * cos + rotate_half(x) * sin, each angle twice."""
    d = x.shape[-1]
    inv_freq = 1.0 / base ** (np.arange(0, d, 2) / d)  # (D/2,)
    freqs = np.asarray(positions, dtype=np.float64)[..., None] * inv_freq  # (..., N, D/2)
    emb = np.concatenate([freqs, freqs], axis=-1)  # (..., N, D)
    rotate_half = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * np.cos(emb) + rotate_half * np.sin(emb)


@pytest.mark.parametrize("shape, positions", [((6, 8), None), ((2, 3, 5, 4), np.array([0, 4, 1, 7, 2.5])),
                                              ((2, 5, 16), np.arange(100, 105))])
def test_half_layout_is_llamas_rotate_half(shape, positions):
    x = np.random.default_rng(11).standard_normal(shape)
    y, cache = rope_forward(x, positions, layout="half")
    assert cache.layout == "half"
    pos = np.arange(shape[-2]) if positions is None else positions
    assert_close(y, _llama_rope(x, pos), rtol=1e-13, atol=1e-13, what="rotate-half RoPE")


def test_half_layout_gradcheck_and_offset_property():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 5, 6))
    check_gradients(lambda x: rope_forward(x, np.array([0, 3, 1, 7, 2]), layout="half"), rope_backward, x, names=["x"])
    q, k = rng.standard_normal((2, 1, 8))
    scores = []
    for m in (0, 5, 11):
        qm, _ = rope_forward(q, np.array([m]), layout="half")
        kn, _ = rope_forward(k, np.array([m + 3]), layout="half")
        scores.append((qm @ kn.T).item())
    np.testing.assert_allclose(scores, scores[0], rtol=1e-12)


def test_the_two_layouts_are_a_permutation_of_each_other():
    """Interleaved pairs (2i, 2i+1) are half pairs (i, i + D/2) after reordering the features."""
    x = np.random.default_rng(13).standard_normal((4, 8))
    order = np.concatenate([np.arange(0, 8, 2), np.arange(1, 8, 2)])  # even features, then odd
    y_half, _ = rope_forward(x[:, order], layout="half")
    y_inter, _ = rope_forward(x, layout="interleaved")
    assert_close(y_half, y_inter[:, order], what="layouts")


def test_bad_layout():
    with pytest.raises(ValueError, match=r"^layout must be one of \('interleaved', 'half'\), got 'rotate'$"):
        rope_forward(np.ones((2, 4)), layout="rotate")


def test_default_layout_is_transformers_llama():
    """Since 0.4.0 the default pairs (i, i + D/2), as transformers' Llama (it was interleaved)."""
    x = np.random.default_rng(14).standard_normal((2, 5, 8))
    y, cache = rope_forward(x, np.arange(3, 8))
    assert cache.layout == "half"
    assert_close(y, _llama_rope(x, np.arange(3, 8)), rtol=1e-13, atol=1e-13, what="default layout")


@pytest.mark.parametrize("x_shape, positions_shape, hint", [
    ((4, 4, 6, 8), (4, 6), r"positions\[:, None, :\]"),  # B == H: would broadcast as per head without the check
    ((2, 3, 6, 8), (2, 6), r"positions\[:, None, :\]"),
    ((2, 3, 5, 6, 8), (2, 6), r"positions\[:, None, None, :\]"),
    ((3, 6, 8), (5,), r"expected \(6,\)"),
    ((3, 6, 8), (1, 3, 6), r"2 axes"),
])
def test_positions_that_do_not_fit_what_they_rotate_are_refused(x_shape, positions_shape, hint):
    with pytest.raises(ValueError, match=r"^positions of shape .* does not fit x of shape .*" + hint):
        rope_forward(np.ones(x_shape), np.zeros(positions_shape))


@pytest.mark.parametrize("same_positions", [True, False])
def test_rotary_hook_shares_the_angles_of_q_and_k_only_at_the_same_positions(same_positions):
    """RotaryHalf with given frequencies rotates k with q's cosines and sines when both are at the
    same positions (one array): bit for bit what rotating k on its own gives."""
    from attention_ref.variants.rope import RotaryHalf, rope_angles

    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 5, 8)).astype(np.float32)  # (B, H, N, Dh)
    k = rng.standard_normal((2, 2, 5, 8)).astype(np.float32)  # (B, Hkv, N, Dh)
    positions = np.arange(3, 8)[None, None, :]  # (1, 1, N): a decoding step's, one per row
    k_positions = positions if same_positions else positions.copy()
    theta = 10000.0 ** (-np.arange(0, 8, 2) / 8)
    q_rot, k_rot, (q_cache, k_cache) = RotaryHalf(positions, k_positions, 10000.0, theta).forward(q, k)
    angles = rope_angles(positions, 8)  # the same frequencies, from the base
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    half = 4
    first, second = k[..., :half], k[..., half:]
    expected_k = np.concatenate([first * cos - second * sin, first * sin + second * cos], -1)
    np.testing.assert_array_equal(k_rot, expected_k)
    np.testing.assert_array_equal(k_cache.cos, q_cache.cos)
    assert k_rot.dtype == np.float32 and (k_cache.cos is q_cache.cos) == same_positions
