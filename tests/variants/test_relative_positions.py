"""The relative positions added to the scores (issue 48): ALiBi, T5's bucketed bias and
Transformer-XL's relative attention within one segment, each against a plain loop written from
its paper's formula and its backward against finite differences (float64). The comparisons with
transformers' BLOOM and T5 are in tests/interop/test_relative_positions_against_transformers.py."""
import math

import numpy as np
import pytest

from attention_ref.variants.alibi import alibi_backward, alibi_forward, alibi_positions, alibi_slopes
from attention_ref.variants.relative_xl import (relative_shift, relative_shift_backward_formula, relative_xl_positions,
                                                relative_xl_scores_backward, relative_xl_scores_forward)
from attention_ref.variants.t5_bias import t5_bias_backward, t5_bias_forward, t5_buckets
from _helpers import assert_close, check_gradients


# ---- ALiBi ----

def _slopes_by_the_paper(h):
    """Press et al.'s rule, written from the paper's text: a geometric sequence starting at and
    multiplied by 2^(-8/h) for a power of two h; otherwise the closest power of two's slopes, then
    every other slope of twice that many heads."""
    def geometric(n):
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]
    if math.log2(h).is_integer():
        return geometric(h)
    p = 2 ** math.floor(math.log2(h))
    return geometric(p) + geometric(2 * p)[0::2][:h - p]


@pytest.mark.parametrize("h", [1, 2, 3, 5, 8, 12, 16, 20, 24, 112])
def test_alibi_slopes_follow_the_paper_for_any_head_count(h):
    assert_close(alibi_slopes(h), _slopes_by_the_paper(h), rtol=1e-14, atol=0, what=f"slopes, {h} heads")


def test_alibi_slopes_of_eight_and_twelve_heads_by_hand():
    assert alibi_slopes(8).tolist() == [2.0 ** -k for k in range(1, 9)]
    assert_close(alibi_slopes(12)[8:], [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5], rtol=1e-15, atol=0)


def _alibi_loop(scores, slopes, kpos, qpos):
    out = scores.copy()
    for index in np.ndindex(scores.shape):
        *b, h, i, j = index
        out[index] += -slopes[h] * (qpos[tuple(b)][i] - kpos[tuple(b)][j])  # -m_h (i - j)
    return out


def test_alibi_forward_matches_the_papers_loop():
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((2, 3, 4, 5))
    kpos = np.tile(np.arange(5.0), (2, 1))
    qpos = kpos[:, 1:]  # the last four positions query
    out, _ = alibi_forward(scores, alibi_slopes(3), kpos, qpos)
    assert_close(out, _alibi_loop(scores, alibi_slopes(3), kpos, qpos), what="ALiBi, the paper's form")


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_alibi_keys_only_form_gives_the_same_softmax_on_a_left_padded_batch():
    """BLOOM's m_h p_j differs from m_h (p_j - p_i) by a constant per row: the weights agree."""
    rng = np.random.default_rng(1)
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    pos = alibi_positions(mask)
    assert pos.tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    scores = rng.standard_normal((2, 4, 5, 5))
    allowed = (mask[:, None, None, :] == 1) & np.tri(5, dtype=bool)
    allowed[0, :, :2] = True  # the pad queries' rows: keep them finite
    slopes = alibi_slopes(4)
    keys_only, _ = alibi_forward(np.where(allowed, scores, -np.inf), slopes, pos)
    paper, _ = alibi_forward(np.where(allowed, scores, -np.inf), slopes, pos, pos)
    assert_close(_softmax(keys_only), _softmax(paper), what="softmax of the two forms")
    assert not np.allclose(keys_only[np.isfinite(keys_only)], paper[np.isfinite(paper)])  # the scores differ


def test_alibi_backward_gradcheck_and_float32():
    rng = np.random.default_rng(2)
    kpos = np.arange(4.0)
    check_gradients(lambda s: alibi_forward(s, alibi_slopes(2), kpos), alibi_backward,
                    rng.standard_normal((3, 2, 4, 4)), names=["scores"])
    out, _ = alibi_forward(rng.standard_normal((2, 4, 4)).astype(np.float32), alibi_slopes(2), kpos)
    assert out.dtype == np.float32


def test_alibi_refuses_bad_input_by_name():
    with pytest.raises(ValueError, match="slopes"):
        alibi_forward(np.zeros((3, 2, 2)), alibi_slopes(2), np.arange(2.0))
    with pytest.raises(ValueError, match="key_positions"):
        alibi_forward(np.zeros((2, 2, 2)), alibi_slopes(2), np.arange(3.0))
    with pytest.raises(ValueError, match="attention_mask"):
        alibi_positions(np.array([0, 2]))
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)


# ---- T5 ----

def _bucket_by_the_formula(r, bidirectional, num_buckets, max_distance):
    """One distance r = j - i, as Raffel et al. describe it (the logarithm in float32, as T5's code)."""
    offset, b = 0, num_buckets
    if bidirectional:
        b //= 2
        offset = b if r > 0 else 0
        n = abs(r)
    else:
        n = max(-r, 0)
    e = b // 2
    if n < e:
        return offset + n
    x = np.float32(math.log(np.float32(n) / np.float32(e))) / np.float32(math.log(max_distance / e))
    return offset + min(e + int(np.float32(x * np.float32(b - e))), b - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20)])
def test_t5_buckets_match_the_formula(bidirectional, num_buckets, max_distance):
    buckets = t5_buckets(40, 200, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance,
                         offset=30)
    for i in range(40):
        for j in range(200):
            assert buckets[i, j] == _bucket_by_the_formula(j - (30 + i), bidirectional, num_buckets, max_distance)
    assert buckets.min() == 0 and buckets.max() <= num_buckets - 1
    if max_distance == 20:  # distances past max_distance both ways: the last bucket is reached
        assert buckets.max() == num_buckets - 1


def test_t5_bias_forward_matches_a_loop():
    rng = np.random.default_rng(3)
    table, scores = rng.standard_normal((8, 3)), rng.standard_normal((2, 3, 4, 6))
    buckets = t5_buckets(4, 6, bidirectional=True, num_buckets=8, max_distance=10)
    out, _ = t5_bias_forward(scores, table, buckets)
    loop = scores.copy()
    for b, h, i, j in np.ndindex(scores.shape):
        loop[b, h, i, j] += table[buckets[i, j], h]
    assert_close(out, loop, what="T5 bias")


def test_t5_bias_backward_gradcheck():
    rng = np.random.default_rng(4)
    buckets = t5_buckets(5, 5, bidirectional=False, num_buckets=6, max_distance=8)
    check_gradients(lambda s, t: t5_bias_forward(s, t, buckets), t5_bias_backward,
                    rng.standard_normal((2, 3, 5, 5)), rng.standard_normal((6, 3)), names=["scores", "table"])


def test_t5_table_gradient_sums_over_pairs_and_layers():
    """Two layers share one table: its gradient is the sum of the two layers' scatter-adds, and a
    bucket's entry is the sum of dout over the pairs in that bucket (checked by a loop)."""
    rng = np.random.default_rng(5)
    buckets = t5_buckets(4, 4, bidirectional=True, num_buckets=6, max_distance=8)
    table = rng.standard_normal((6, 2))

    def two_layers(scores, table):
        s1, c1 = t5_bias_forward(scores, table, buckets)
        s2, c2 = t5_bias_forward(np.tanh(s1), table, buckets)
        return s2, (c1, c2, s1)

    def two_layers_backward(dout, cache):
        c1, c2, s1 = cache
        dh, dt2 = t5_bias_backward(dout, c2)
        ds, dt1 = t5_bias_backward(dh * (1 - np.tanh(s1) ** 2), c1)
        return ds, dt1 + dt2

    check_gradients(two_layers, two_layers_backward, rng.standard_normal((2, 2, 4, 4)), table,
                    names=["scores", "table"])
    dout = rng.standard_normal((2, 2, 4, 4))
    _, cache = t5_bias_forward(np.zeros((2, 2, 4, 4)), table, buckets)
    _, dtable = t5_bias_backward(dout, cache)
    loop = np.zeros_like(table)
    for b, h, i, j in np.ndindex(dout.shape):
        loop[buckets[i, j], h] += dout[b, h, i, j]
    assert_close(dtable, loop, what="dtable")


def test_t5_refuses_bad_input_by_name():
    with pytest.raises(ValueError, match="table"):
        t5_bias_forward(np.zeros((2, 3, 3)), np.zeros((4, 3)), np.zeros((3, 3), dtype=int))
    with pytest.raises(ValueError, match="buckets"):
        t5_bias_forward(np.zeros((2, 3, 3)), np.zeros((4, 2)), np.full((3, 3), 4))


# ---- Transformer-XL ----

def _xl_loop(q, k, R, W_R, u, v):
    """A_ij = q_i k_j + q_i W_R R_{i-j} + u k_j + v W_R R_{i-j}, one term at a time, per head."""
    *batch, h, n, dh = q.shape
    A = np.full(q.shape[:-1] + (n,), -np.inf)
    for index in np.ndindex(*batch, h):
        hd = index[-1]
        W = W_R[:, hd * dh:(hd + 1) * dh]
        for i in range(n):
            for j in range(i + 1):
                qi, kj, rij = q[index][i], k[index][j], R[i - j] @ W
                A[index][i, j] = qi @ kj + qi @ rij + u[hd] @ kj + v[hd] @ rij
    return A


def _xl_inputs(seed, batch=(2,), h=3, n=5, dh=4, d=6):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(batch + (h, n, dh)), rng.standard_normal(batch + (h, n, dh)),
            relative_xl_positions(n, d), rng.standard_normal((d, h * dh)), rng.standard_normal((h, dh)),
            rng.standard_normal((h, dh)))


@pytest.mark.parametrize("batch", [(), (2,), (2, 1)])
def test_relative_xl_scores_match_the_papers_four_terms(batch):
    q, k, R, W_R, u, v = _xl_inputs(6, batch)
    A, _ = relative_xl_scores_forward(q, k, R, W_R, u, v)
    assert_close(A, _xl_loop(q, k, R, W_R, u, v), what="Transformer-XL scores")


def test_relative_shift_moves_each_row_to_its_distances_and_back():
    n = 4
    x = np.arange(n * n, dtype=float).reshape(n, n)
    y = relative_shift(x)
    for i in range(n):
        for j in range(i + 1):
            assert y[i, j] == x[i, n - 1 - i + j]
    dy = np.random.default_rng(7).standard_normal((n, n))
    assert_close((relative_shift(x) * dy).sum(), (x * relative_shift_backward_formula(dy)).sum(), what="<Sx, dy> = <x, S^T dy>")


def test_relative_xl_positions_are_sines_then_cosines():
    R = relative_xl_positions(3, 4)
    assert_close(R[2], [math.sin(2), math.sin(2 / 100), math.cos(2), math.cos(2 / 100)])


def test_relative_xl_backward_gradcheck():
    q, k, R, W_R, u, v = _xl_inputs(8)

    def forward(q, k, W_R, u, v):
        A, cache = relative_xl_scores_forward(q, k, R, W_R, u, v)
        return np.where(np.isfinite(A), A, 0.0), cache  # the masked entries are constants

    check_gradients(forward, relative_xl_scores_backward, q, k, W_R, u, v, names=["q", "k", "W_R", "u", "v"])


def test_relative_xl_refuses_bad_input_by_name():
    q, k, R, W_R, u, v = _xl_inputs(9)
    with pytest.raises(ValueError, match="W_R"):
        relative_xl_scores_forward(q, k, R, W_R[:, 1:], u, v)
    with pytest.raises(ValueError, match="R must"):
        relative_xl_scores_forward(q, k, R[1:], W_R, u, v)
    with pytest.raises(ValueError, match="u must"):
        relative_xl_scores_forward(q, k, R, W_R, u[1:], v)
