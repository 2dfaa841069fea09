"""attention_ref.documents.head_scores: each score against a plain loop over (row, head, query), the
bracket and newline rules on hand-checked strings, and the errors."""
import numpy as np
import pytest

from attention_ref.documents import head_scores as hs


def _weights(rng, B, H, T):
    """Random causal attention (B, H, T, T): rows sum to 1, nothing above the diagonal."""
    w = rng.random((B, H, T, T)) * np.tril(np.ones((T, T)))
    return w / w.sum(axis=-1, keepdims=True)


def _loop_mean(weights, pick):
    """Per head: mean over (b, t) with a picked key set of the weight on those keys; pick(b, t) -> list of keys."""
    B, H, T, _ = weights.shape
    out = []
    for h in range(H):
        vals = [sum(weights[b, h, t, j] for j in pick(b, t)) for b in range(B) for t in range(T) if pick(b, t)]
        out.append(np.mean(vals))
    return np.array(out)


def test_previous_token_scores_against_a_loop():
    w = _weights(np.random.default_rng(0), 3, 4, 7)
    expected = _loop_mean(w, lambda b, t: [t - 1] if t >= 1 else [])
    np.testing.assert_allclose(hs.previous_token_scores(w), expected, rtol=1e-12)
    np.testing.assert_allclose(hs.current_token_scores(w), _loop_mean(w, lambda b, t: [t]), rtol=1e-12)


def test_induction_scores_against_a_loop():
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 4, (3, 10))  # a small vocabulary: many repeats, several earlier copies
    w = _weights(rng, 3, 2, 10)
    expected = _loop_mean(w, lambda b, t: [j for j in range(1, t + 1) if ids[b, j - 1] == ids[b, t]])
    np.testing.assert_allclose(hs.induction_scores(w, ids), expected, rtol=1e-12)


def test_a_perfect_induction_pattern_scores_one_and_a_previous_token_head_zero():
    ids = np.array([[5, 6, 7, 5, 6, 7]])
    T = 6
    w = np.zeros((1, 2, T, T))
    w[0, 1, 0, 0] = 1.0
    w[0, 1, np.arange(1, T), np.arange(T - 1)] = 1.0  # head 1: the previous token
    w[0, 0] = np.eye(T)
    for t in range(3, T):  # head 0: after the earlier copy (t - 3 + 1)
        w[0, 0, t] = 0.0
        w[0, 0, t, t - 2] = 1.0
    np.testing.assert_allclose(hs.induction_scores(w, ids), [1.0, 0.0])
    np.testing.assert_allclose(hs.previous_token_scores(w)[1], 1.0)


def test_bracket_and_newline_rules_on_a_line_of_code():
    text = b"f(a[1], b)\n  x"
    # positions:     0123456789, then the newline at 10 and "  x" at 11..13
    assert hs.open_bracket_positions(text).tolist() == [-1, -1, 1, 1, 3, 3, 1, 1, 1, 1, -1, -1, -1, -1]
    assert hs.last_newline_positions(text).tolist() == [-1] * 11 + [10, 10, 10]
    w = _weights(np.random.default_rng(2), 1, 3, len(text))
    keys = hs.open_bracket_positions(text)
    expected = _loop_mean(w, lambda b, t: [keys[t]] if keys[t] >= 0 else [])
    np.testing.assert_allclose(hs.bracket_scores(w, [text]), expected, rtol=1e-12)
    keys = hs.last_newline_positions(text)
    expected = _loop_mean(w, lambda b, t: [keys[t]] if keys[t] >= 0 else [])
    np.testing.assert_allclose(hs.line_start_scores(w, text), expected, rtol=1e-12)


def test_uniform_attention_scores_its_baseline():
    T = 9
    w = np.tril(np.ones((T, T)))
    w = (w / w.sum(axis=-1, keepdims=True))[None, None]  # (1, 1, T, T), evenly spread
    assert hs.previous_token_scores(w)[0] == pytest.approx(hs.uniform_baseline(np.arange(T) - 1), rel=1e-12)
    text = b"(ab[c]d)e"
    assert hs.bracket_scores(w, text)[0] == pytest.approx(hs.uniform_baseline(hs.open_bracket_positions(text)),
                                                          rel=1e-12)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="weights must be"):
        hs.previous_token_scores(np.ones((3, 4)))
    with pytest.raises(ValueError, match="ids has 5 positions, weights 4"):
        hs.induction_scores(np.ones((1, 1, 4, 4)) / 4, np.zeros((1, 5), int))
    with pytest.raises(ValueError, match="no token occurs twice"):
        hs.induction_scores(np.ones((1, 1, 4, 4)) / 4, np.arange(4)[None])
    with pytest.raises(ValueError, match="no query has a key"):
        hs.bracket_scores(np.ones((1, 1, 3, 3)) / 3, b"abc")
    with pytest.raises(TypeError, match="texts must be bytes"):
        hs.line_start_scores(np.ones((1, 1, 3, 3)) / 3, "a\nb")
