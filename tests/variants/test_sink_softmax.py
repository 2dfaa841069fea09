"""sink_softmax_forward / sink_softmax_backward: gpt-oss's softmax with a learned sink per head."""
import math

import numpy as np
import pytest

from attention_ref.variants.sink_softmax import sink_softmax_backward, sink_softmax_forward
from _helpers import assert_close, check_gradients

SHAPES = [(1, 1, 1), (2, 3, 4), (2, 3, 4, 5), (2, 1, 2, 3, 6)]


def _loop(scores, sinks):
    """The formula, one row at a time: exp(s_j) / (exp(sigma_h) + sum_l exp(s_l))."""
    P = np.zeros_like(scores)
    for index in np.ndindex(scores.shape[:-1]):
        h = index[-2]
        row = scores[index]
        denominator = math.exp(sinks[h]) + sum(math.exp(s) for s in row if s != -np.inf)
        P[index] = [0.0 if s == -np.inf else math.exp(s) / denominator for s in row]
    return P


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_loop(shape):
    rng = np.random.default_rng(0)
    scores, sinks = 2 * rng.standard_normal(shape), rng.standard_normal(shape[-3])
    scores[rng.random(shape) < 0.3] = -np.inf
    P, cache = sink_softmax_forward(scores, sinks)
    assert_close(P, _loop(scores, sinks), what="sink softmax")
    assert_close(P.sum(-1) + cache.p_sink[..., 0], np.ones(shape[:-1]), what="rows with the sink sum to 1")


def test_large_scores_do_not_overflow():
    P, cache = sink_softmax_forward(np.array([[[1000.0, 999.0]]]), np.array([1001.0]))
    e = np.exp([-1.0, -2.0, 0.0])
    assert_close(P[0, 0], e[:2] / e.sum())
    assert_close(cache.p_sink[0, 0, 0], e[2] / e.sum())


def test_fully_masked_row_attends_to_nothing():
    scores = np.array([[[-np.inf, -np.inf], [0.5, -np.inf]]])  # (H=1, Nq=2, Nk=2)
    with np.errstate(all="raise"):
        P, cache = sink_softmax_forward(scores, np.array([0.25]))
        dscores, dsinks = sink_softmax_backward(np.array([[[3.0, -1.0], [2.0, 5.0]]]), cache)
    assert P[0, 0].tolist() == [0.0, 0.0] and cache.p_sink[0, 0, 0] == 1.0
    assert dscores[0, 0].tolist() == [0.0, 0.0]
    p = 1 / (1 + math.exp(0.25 - 0.5))  # the second row: weight on its one key
    assert_close(dsinks, [-(1 - p) * p * 2.0])  # only the second row's sink gets a gradient


@pytest.mark.parametrize("shape", SHAPES)
def test_backward_gradcheck(shape):
    rng = np.random.default_rng(1)
    scores, sinks = rng.standard_normal(shape), rng.standard_normal(shape[-3])
    check_gradients(sink_softmax_forward, sink_softmax_backward, scores, sinks, names=["scores", "sinks"])


def test_backward_with_masked_keys_gradcheck():
    rng = np.random.default_rng(2)
    keep = rng.random((2, 3, 4, 5)) < 0.7
    keep[0, 0, 0] = False  # one fully masked row
    sinks = rng.standard_normal(3)

    def forward(scores, sinks):
        return sink_softmax_forward(np.where(keep, scores, -np.inf), sinks)

    def backward(dP, cache):
        dscores, dsinks = sink_softmax_backward(dP, cache)
        assert np.all(dscores[~keep] == 0)
        return dscores, dsinks

    check_gradients(forward, backward, rng.standard_normal(keep.shape), sinks, names=["scores", "sinks"])


def test_the_sinks_gradient_by_hand():
    """One row, one key: P = sigmoid(s - sigma), so dsigma = -P (1 - P) dP."""
    _, cache = sink_softmax_forward(np.array([[[1.0]]]), np.array([0.0]))
    p = 1 / (1 + math.exp(-1.0))
    dscores, dsinks = sink_softmax_backward(np.array([[[1.0]]]), cache)
    assert_close(dscores, [[[p * (1 - p)]]])
    assert_close(dsinks, [-p * (1 - p)])


def test_float32_stays_float32_and_inputs_are_left_alone():
    scores = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    sinks = np.zeros(2, np.float32)
    before = scores.copy()
    P, cache = sink_softmax_forward(scores, sinks)
    dscores, dsinks = sink_softmax_backward(np.ones_like(P), cache)
    assert P.dtype == dscores.dtype == dsinks.dtype == np.float32
    assert np.array_equal(scores, before)
    P[...] = 0  # the caller's copy: the backward is unchanged
    assert sink_softmax_backward(np.ones_like(P), cache)[0].tolist() == dscores.tolist()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"^sinks must have shape \(H,\) = \(2,\), one logit per head of scores"
                                         r" \(2, 3, 4\), got \(3,\)$"):
        sink_softmax_forward(np.zeros((2, 3, 4)), np.zeros(3))
    with pytest.raises(ValueError, match=r"^scores must have shape \(\.\.\., H, Nq, Nk\)"):
        sink_softmax_forward(np.zeros((3, 4)), np.zeros(3))
    with pytest.raises(ValueError, match=r"^sinks contains infinity"):
        sink_softmax_forward(np.zeros((1, 1, 1)), [-np.inf])
    with pytest.raises(ValueError, match=r"^scores contains infinity"):
        sink_softmax_forward(np.full((1, 1, 1), np.inf), [0.0])
    _, cache = sink_softmax_forward(np.zeros((1, 2, 3)), np.zeros(1))
    with pytest.raises(ValueError, match=r"^dP must have shape \(1, 2, 3\) \(the forward output's\), got \(2, 3\)$"):
        sink_softmax_backward(np.zeros((2, 3)), cache)


# ---- the multi-head layer's sinks= (gpt-oss's attention: grouped heads, a sink per query head)

def _attention_with_sinks(x, p, sinks, kv=None, window=None):
    from attention_ref.nn.multi_head_attention import causal_self_attention_formula

    return causal_self_attention_formula(x, p, 4, 2, kv=kv, window=window, sinks=sinks)


def _params(rng, D=6, Dh=3):
    return {"W_q": rng.standard_normal((D, 4 * Dh)), "W_k": rng.standard_normal((D, 2 * Dh)),
            "W_v": rng.standard_normal((D, 2 * Dh)), "W_o": rng.standard_normal((4 * Dh, D)),
            "b_q": rng.standard_normal(4 * Dh), "b_o": rng.standard_normal(D)}


@pytest.mark.parametrize("window", [None, 2])
def test_grouped_heads_with_sinks_match_a_loop_over_heads(window):
    """Query head h uses key/value head h // 2 and sink h: the plain per-head computation with
    sink_softmax_forward, a causal (windowed) mask, then W_o."""
    rng = np.random.default_rng(5)
    x, p, sinks = rng.standard_normal((2, 5, 6)), _params(rng), rng.standard_normal(4)
    out, _ = _attention_with_sinks(x, p, sinks, window=window)
    q = (x @ p["W_q"] + p["b_q"]).reshape(2, 5, 4, 3).transpose(0, 2, 1, 3)
    k = (x @ p["W_k"]).reshape(2, 5, 2, 3).transpose(0, 2, 1, 3)
    v = (x @ p["W_v"]).reshape(2, 5, 2, 3).transpose(0, 2, 1, 3)
    i, j = np.indices((5, 5))
    visible = (j <= i) & (True if window is None else j > i - window)
    heads = []
    for h in range(4):
        scores = np.where(visible, q[:, h] @ k[:, h // 2].swapaxes(-1, -2) / math.sqrt(3), -np.inf)
        P, _ = sink_softmax_forward(scores[:, None], sinks[h:h + 1])
        heads.append(P[:, 0] @ v[:, h // 2])
    expected = np.concatenate(heads, axis=-1) @ p["W_o"] + p["b_o"]
    assert_close(out, expected, what="grouped heads with sinks")


def test_grouped_heads_with_sinks_gradcheck():
    from attention_ref.variants.grouped_heads import multi_head_attention_backward_formula

    rng = np.random.default_rng(6)
    x, p, sinks = rng.standard_normal((2, 5, 6)), _params(rng), rng.standard_normal(4)

    def forward(x, p, sinks):
        return _attention_with_sinks(x, p, sinks, window=3)

    def backward(dout, cache):
        dq, dk, dv, grads = multi_head_attention_backward_formula(dout, cache)
        return dq + dk + dv, {n: grads[n] for n in p}, grads["sinks"]

    check_gradients(forward, backward, x, p, sinks, names=["x", "params", "sinks"])


def test_decoding_with_sinks_gives_the_forward_rows():
    from attention_ref.variants.kv_cache import KVCache

    rng = np.random.default_rng(7)
    x, p, sinks = rng.standard_normal((2, 5, 6)), _params(rng), rng.standard_normal(4)
    full, _ = _attention_with_sinks(x, p, sinks, window=2)
    kv = KVCache()
    steps = [_attention_with_sinks(x[:, :3], p, sinks, kv=kv, window=2)[0]]
    steps += [_attention_with_sinks(x[:, t:t + 1], p, sinks, kv=kv, window=2)[0] for t in (3, 4)]
    assert_close(np.concatenate(steps, axis=1), full, what="decoded rows")
