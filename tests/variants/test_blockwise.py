"""Blockwise (flash) attention against the plain path, finite differences and bad input."""
import tracemalloc

import numpy as np
import pytest

from attention_ref import (
    causal_mask,
    flash_attention_backward,
    flash_attention_forward,
    local_window_mask,
    padding_mask,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from attention_ref.variants.blockwise import _key_blocks, visited_tiles
from tests._helpers import assert_close, check_gradients


def plain(q, k, v, mask=None, causal=False, window=None):
    """The plain path with the combined mask built explicitly."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    rule = np.ones((n_q, n_k), dtype=bool)
    if causal:
        rule &= causal_mask(n_q, n_k)
    if window is not None:
        rule &= local_window_mask(n_q, window, n_k)
    if mask is None:
        full = rule
    elif mask.dtype == bool:
        full = mask & rule
    else:
        full = np.where(rule, mask, -np.inf)
    return scaled_dot_product_attention_forward(q, k, v, full)


SHAPES = [  # q shape, k shape, v shape
    ((7, 4), (7, 4), (7, 3)),
    ((2, 3, 10, 4), (2, 3, 13, 4), (2, 3, 13, 5)),
    ((2, 1, 9, 3), (1, 3, 9, 3), (1, 3, 9, 2)),  # batch axes broadcast
    ((3, 12, 4), (3, 5, 4), (3, 5, 4)),  # n_q > n_k
]


@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 0, 2, 50])
@pytest.mark.parametrize("block_size", [1, 3, 4, 128])
def test_matches_plain_path(shapes, causal, window, block_size):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in shapes)
    out, cache = flash_attention_forward(q, k, v, causal=causal, block_size=block_size, window=window)
    ref, ref_cache = plain(q, k, v, causal=causal, window=window)
    assert_close(out, ref, what="out")
    dout = rng.standard_normal(out.shape)
    for name, g, r in zip(("dq", "dk", "dv"), flash_attention_backward(dout, cache),
                          scaled_dot_product_attention_backward(dout, ref_cache)):
        assert_close(g, r, what=name)


@pytest.mark.parametrize("kind", ["bool", "float", "padding", "row"])
def test_caller_mask_read_by_tiles(kind):
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((2, 2, 9, 4)), rng.standard_normal((2, 2, 11, 4)), rng.standard_normal((2, 2, 11, 3))
    if kind == "bool":
        mask = rng.random((2, 2, 9, 11)) > 0.3
        mask[0, 0, 4] = False  # a query with no allowed key: zero output and gradient
    elif kind == "float":
        mask = np.where(rng.random((9, 11)) > 0.3, 0.5 * rng.standard_normal((9, 11)), -np.inf)
    elif kind == "padding":
        mask = padding_mask(np.array([11, 6]), 11)[:, None]  # (2, 1, 1, 11)
    else:
        mask = rng.random(11) > 0.4  # (Nk,) broadcast over queries
    for causal, window in [(False, None), (True, None), (False, 3), (True, 2)]:
        out, cache = flash_attention_forward(q, k, v, mask, causal=causal, block_size=4, window=window)
        ref, ref_cache = plain(q, k, v, mask, causal=causal, window=window)
        assert_close(out, ref, what=f"out ({kind}, causal={causal}, window={window})")
        dout = rng.standard_normal(out.shape)
        for g, r in zip(flash_attention_backward(dout, cache), scaled_dot_product_attention_backward(dout, ref_cache)):
            assert_close(g, r, what=f"gradient ({kind})")
        assert np.isfinite(cache.lse[np.isfinite(cache.lse)]).all()
    if kind == "bool":
        assert np.all(out[0, 0, 4] == 0)


@pytest.mark.parametrize("causal, window, block_size", [(False, None, 2), (True, None, 3), (False, 1, 2), (True, 2, 4)])
@pytest.mark.parametrize("shapes", [((5, 3), (5, 3), (5, 2)), ((2, 4, 3), (2, 6, 3), (2, 6, 4))])
def test_gradcheck(shapes, causal, window, block_size):
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(s) for s in shapes)
    check_gradients(lambda q, k, v: flash_attention_forward(q, k, v, causal=causal, block_size=block_size, window=window),
                    flash_attention_backward, q, k, v, names=["q", "k", "v"])


def test_gradcheck_with_float_mask():
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((4, 3)), rng.standard_normal((6, 3)), rng.standard_normal((6, 2))
    mask = 0.3 * rng.standard_normal((4, 6))
    check_gradients(lambda q, k, v: flash_attention_forward(q, k, v, mask, block_size=2),
                    flash_attention_backward, q, k, v, names=["q", "k", "v"])


def test_cache_holds_nothing_quadratic():
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((2, 40, 4)), rng.standard_normal((2, 40, 4)), rng.standard_normal((2, 40, 4))
    _, cache = flash_attention_forward(q, k, v, block_size=8)
    for field, value in cache._asdict().items():
        if isinstance(value, np.ndarray):
            assert value.shape[-1] != 40 or field in ("row_max", "log_row_sum"), field  # no (.., Nq, Nk) array
    assert cache.lse.shape == (2, 40)


def test_causal_and_window_skip_blocks():
    n, b = 64, 8
    visited = [len(_key_blocks(qs, qs + b, n, n, b, False, None)) for qs in range(0, n, b)]
    assert visited == [8] * 8
    visited = [len(_key_blocks(qs, qs + b, n, n, b, True, None)) for qs in range(0, n, b)]
    assert visited == [1, 2, 3, 4, 5, 6, 7, 8]  # blocks entirely in the future are skipped
    visited = [len(_key_blocks(qs, qs + b, n, n, b, False, 3)) for qs in range(0, n, b)]
    assert max(visited) == 3  # the band of width 2*3+1 touches at most 3 blocks of 8


def test_float32_stays_float32_and_inputs_untouched():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 9, 4)).astype(np.float32) for _ in range(3))
    copies = [a.copy() for a in (q, k, v)]
    out, cache = flash_attention_forward(q, k, v, causal=True, block_size=4)
    grads = flash_attention_backward(np.ones_like(out), cache)
    assert out.dtype == np.float32 and all(g.dtype == np.float32 for g in grads)
    for a, c in zip((q, k, v), copies):
        np.testing.assert_array_equal(a, c)
    ref, _ = scaled_dot_product_attention_forward(q, k, v, causal_mask(9))
    assert_close(out, ref, rtol=1e-5, atol=1e-6, what="float32 out")


def test_memory_stays_linear():
    """At n = 2048 one head's n x n float64 scores would be 32 MiB; blockwise stays far below."""
    n, d = 2048, 16
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))
    dout = rng.standard_normal((n, d))
    tracemalloc.start()
    try:
        out, cache = flash_attention_forward(q, k, v, causal=True, block_size=128)
        flash_attention_backward(dout, cache)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    quadratic = n * n * 8
    assert peak < quadratic / 8, f"peak {peak / 2**20:.1f} MiB vs n^2 scores {quadratic / 2**20:.0f} MiB"


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"block_size": 0}, ValueError, "^block_size must be a positive integer, got 0$"),
    ({"block_size": 2.0}, TypeError, "^block_size must be a positive integer, got 2.0$"),
    ({"window": -1}, ValueError, "window"),
    ({"window": 1.5}, TypeError, "window"),
    ({"causal": "yes"}, TypeError, "causal"),
    ({"mask": np.ones((4, 5), dtype=bool)}, ValueError, "mask"),
    ({"mask": np.ones((3, 6), dtype=int)}, TypeError, "mask"),
])
def test_bad_options(kwargs, exc, match):
    q, k, v = np.ones((3, 2)), np.ones((6, 2)), np.ones((6, 2))
    with pytest.raises(exc, match=match):
        flash_attention_forward(q, k, v, **kwargs)


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"d_k.*\(3, 2\).*\(4, 3\)"):
        flash_attention_forward(np.ones((3, 2)), np.ones((4, 3)), np.ones((4, 3)))
    with pytest.raises(ValueError, match="n_k"):
        flash_attention_forward(np.ones((3, 2)), np.ones((4, 2)), np.ones((5, 2)))
    with pytest.raises(TypeError, match="q"):
        flash_attention_forward(np.array([["a"]]), np.ones((4, 2)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="NaN"):
        flash_attention_forward(np.full((3, 2), np.nan), np.ones((4, 2)), np.ones((4, 2)))
    _, cache = flash_attention_forward(np.ones((3, 2)), np.ones((4, 2)), np.ones((4, 2)))
    with pytest.raises(ValueError, match=r"dout.*\(3, 2\)"):
        flash_attention_backward(np.ones((2, 2)), cache)


def test_scalar_and_huge_float_masks():
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 6, 3)).astype(np.float32) for _ in range(3))
    out, _ = flash_attention_forward(q, k, v, np.float32(0.5), block_size=4)  # a 0-d mask: the same bias everywhere
    ref, _ = scaled_dot_product_attention_forward(q, k, v)
    assert_close(out, ref, rtol=1e-5, atol=1e-6, what="scalar mask")
    huge = np.where(causal_mask(6), 0.0, -1e300)  # float64 mask; -1e300 overflows float32 to -inf, as meant
    out, _ = flash_attention_forward(q, k, v, huge, block_size=4)
    ref, _ = scaled_dot_product_attention_forward(q, k, v, causal_mask(6))
    assert_close(out, ref, rtol=1e-5, atol=1e-6, what="-1e300 mask")


# --- regressions: float masks read tile by tile, extreme masks, memory budget ---

def _forward_peak(q, k, v, mask):
    """Peak bytes tracemalloc sees during one forward (inputs and mask allocated before)."""
    tracemalloc.start()
    try:
        _, cache = flash_attention_forward(q, k, v, mask, block_size=64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, cache


@pytest.mark.parametrize("mask_dtype", [np.float32, np.float64])
def test_float_mask_is_not_copied_or_scanned_whole(mask_dtype):
    """A float mask adds at most a few tiles to the peak: no n_q x n_k array of flash's own."""
    n, d, block = 1024, 16, 64
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(3))
    mask = np.where(causal_mask(n), 0.0, -np.inf).astype(mask_dtype)  # (n, n): 4 or 8 MiB
    base, _ = _forward_peak(q, k, v, None)
    peak, cache = _forward_peak(q, k, v, mask)
    tile = block * block * 8  # one float64 tile: 32 KiB
    assert peak - base < 8 * tile, f"mask added {(peak - base) / 2**10:.0f} KiB (n x n is {mask.nbytes / 2**10:.0f} KiB)"
    assert cache.mask is mask  # the caller's array, not a copy


@pytest.mark.parametrize("bad, match", [(np.nan, "mask.*NaN"), (np.inf, "mask.*infinity")])
def test_bad_float_mask_value_raises_naming_mask(bad, match):
    q = np.random.default_rng(9).standard_normal((10, 3))
    mask = np.zeros((10, 10))
    mask[7, 8] = bad  # in the last tile visited for block_size=4
    with pytest.raises(ValueError, match=match):
        flash_attention_forward(q, q, q, mask, block_size=4)


def test_float_mask_too_large_for_float32_raises():
    q = np.ones((3, 2), np.float32)
    with pytest.raises(ValueError, match="^mask holds values too large for float32$"):
        flash_attention_forward(q, q, q, np.full((3, 3), 1e300), block_size=2)


@pytest.mark.parametrize("dtype, big", [(np.float32, 3e38), (np.float64, 1e308)])
def test_extreme_finite_masks_agree_with_plain_path_without_warnings(dtype, big):
    """Scores near the dtype's limits: s - m and s - lse overflow to -inf (weight 0), silently."""
    rng = np.random.default_rng(10)
    q = rng.standard_normal((10, 4)).astype(dtype)
    masks = [np.where(np.eye(10, dtype=bool), big, -big).astype(dtype),
             np.where(np.arange(10) % 2 == 0, big / 3, -big).astype(dtype)[None, :].repeat(10, 0)]
    for mask in masks:
        out, cache = flash_attention_forward(q, q, q, mask, block_size=3)  # warnings are errors
        ref, ref_cache = scaled_dot_product_attention_forward(q, q, q, mask)
        assert np.isfinite(out).all()
        assert_close(out, ref, rtol=1e-5, atol=1e-6, what="out")
        dout = rng.standard_normal(out.shape).astype(dtype)
        for g, r in zip(flash_attention_backward(dout, cache), scaled_dot_product_attention_backward(dout, ref_cache)):
            assert np.isfinite(g).all()
            assert_close(g, r, rtol=1e-5, atol=1e-5, what="gradient")


def test_memory_budget_of_the_benchmark_claim():
    """docs/variants_costs.md: forward + backward at n = 8192, h = 4, d = 64, float32, causal
    stays under 96 MiB beyond the inputs. That size takes 4 s single-threaded but tens of
    seconds when OpenBLAS threads compete on a busy machine, so it is checked at n = 4096,
    h = 1 against the proportional budget 96 / 2 / 4 = 12 MiB: everything flash allocates
    beyond its inputs is O(h n d) (out, dq, dk, dv: 4 h n d itemsize bytes, plus (h, n) row
    statistics) or O(h B^2) for a tile, so the budget scales with h n (the tiles' share,
    h B^2 itemsize = 64 KiB per tile array here, shrinks with h and does not grow with n)."""
    h, n, d = 1, 4096, 64
    rng = np.random.default_rng(11)
    q, k, v, dout = (rng.standard_normal((h, n, d)).astype(np.float32) for _ in range(4))
    tracemalloc.start()
    try:
        out, cache = flash_attention_forward(q, k, v, causal=True)
        grads = flash_attention_backward(dout, cache)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.dtype == np.float32 and all(g.dtype == np.float32 for g in grads)
    assert peak < 96 * 2**20 * (n / 8192) * (h / 4), f"peak {peak / 2**20:.1f} MiB"
    assert peak >= 4 * q.nbytes  # out and three gradients are allocated: the measurement is live


@pytest.mark.parametrize("n_q, n_k, block_size, causal, window, expected",
                         [(300, 300, 64, False, None, 5 * 5), (300, 300, 64, True, None, 5 * 6 // 2),
                          (1000, 1000, 50, False, 20, 3 * 20 - 2), (7, 12, 3, True, None, None)])  # 3 per block, 2 at the ends
def test_visited_tiles_are_the_tiles_computed(monkeypatch, n_q, n_k, block_size, causal, window, expected):
    """visited_tiles lists exactly the tiles whose scores the forward and the backward compute."""
    import attention_ref.variants.blockwise as flash

    computed = []
    original = flash._scores

    def counting(q_blk, k, mask, qs, qe, ks, ke, *rest):
        computed.append((qs, ks))
        return original(q_blk, k, mask, qs, qe, ks, ke, *rest)

    monkeypatch.setattr(flash, "_scores", counting)
    rng = np.random.default_rng(12)
    q, k, v = rng.standard_normal((n_q, 2)), rng.standard_normal((n_k, 2)), rng.standard_normal((n_k, 2))
    out, cache = flash.flash_attention_forward(q, k, v, causal=causal, block_size=block_size, window=window)
    tiles = flash.visited_tiles(n_q, n_k, block_size, causal, window)
    assert computed == tiles
    flash.flash_attention_backward(np.ones_like(out), cache)
    assert computed == tiles + tiles
    if expected is not None:
        assert len(tiles) == expected


def test_the_log_sum_exp_it_keeps_is_that_of_the_full_rows():
    """row_max + log_row_sum = log sum_j exp(q_i . k_j / sqrt(d_k)), whatever the tiling."""
    rng = np.random.default_rng(12)
    q, k, v = rng.standard_normal((5, 3)), rng.standard_normal((7, 3)), rng.standard_normal((7, 2))
    _, cache = flash_attention_forward(q, k, v, block_size=2)
    scores = q @ k.T / np.sqrt(3)  # (5, 7)
    lse = np.log(np.exp(scores).sum(axis=-1))  # (5,)
    assert_close(np.ravel(cache.row_max + cache.log_row_sum), lse, what="log-sum-exp")


def test_window_visits_exactly_the_tiles_that_hold_an_allowed_score():
    """Tiles of 2 over n = 8 with |i - j| <= 1: a tile is visited iff one of its scores is
    allowed, checked against the mask itself."""
    n, block, w = 8, 2, 1
    allowed = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :]) <= w  # (n, n)
    expected = [(qs, ks) for qs in range(0, n, block) for ks in range(0, n, block)
                if allowed[qs:qs + block, ks:ks + block].any()]
    assert visited_tiles(n, n, block_size=block, window=w) == expected
    assert len(expected) == 3 * (n // block) - 2  # the band: the diagonal and its two neighbours


def _allowed(n_q, n_k, causal, window):
    """The causal / window rule score by score: query i sits at position i + n_k - n_q."""
    position = np.arange(n_q)[:, None] + n_k - n_q  # (Nq, 1)
    key = np.arange(n_k)[None, :]  # (1, Nk)
    allowed = np.ones((n_q, n_k), bool)
    if causal:
        allowed &= key <= position
    if window is not None:
        allowed &= np.abs(position - key) <= window
    return allowed


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 0, 1, 2, 3, 4])
@pytest.mark.parametrize("block", [1, 2, 3, 4])
def test_tiles_and_their_structural_masks_match_the_rule_score_by_score(causal, window, block):
    """Over n_q, n_k from 1 to 9 (queries before, after and beside the keys): the visited
    tiles are exactly those holding an allowed score, and a tile's structural mask is
    None exactly when every score in it is allowed (otherwise it is the rule itself)."""
    from attention_ref.variants.blockwise import _structural_keep

    for n_q in (1, 2, 3, 5, 8, 9):
        for n_k in (1, 2, 3, 5, 8, 9):
            allowed = _allowed(n_q, n_k, causal, window)
            expected = [(qs, ks) for qs in range(0, n_q, block) for ks in range(0, n_k, block)
                        if allowed[qs:qs + block, ks:ks + block].any()]
            assert visited_tiles(n_q, n_k, block, causal, window) == expected, (n_q, n_k)
            for qs, ks in expected:
                qe, ke = min(qs + block, n_q), min(ks + block, n_k)
                tile = allowed[qs:qe, ks:ke]
                keep = _structural_keep(qs, qe, ks, ke, n_q, n_k, causal, window)
                if tile.all():
                    assert keep is None, (n_q, n_k, qs, ks)
                else:
                    np.testing.assert_array_equal(keep, tile)


def test_default_tile_is_128():
    assert visited_tiles(256, 256) == [(0, 0), (0, 128), (128, 0), (128, 128)]
    rng = np.random.default_rng(13)
    q, k, v = rng.standard_normal((130, 2)), rng.standard_normal((130, 2)), rng.standard_normal((130, 2))
    assert flash_attention_forward(q, k, v)[1].block_size == 128


@pytest.mark.parametrize("mask_shape", [(5, 1), (1, 2), (5, 2), (2,), (1,)])
def test_masks_with_broadcast_axes_are_cut_into_tiles(mask_shape):
    """A mask axis of size 1 is shared by every tile; any other is sliced (size 2 included)."""
    rng = np.random.default_rng(14)
    q, k, v = rng.standard_normal((5, 3)), rng.standard_normal((2, 3)), rng.standard_normal((2, 4))
    mask = rng.standard_normal(mask_shape)
    out, _ = flash_attention_forward(q, k, v, mask=mask, block_size=1)
    expected, _ = scaled_dot_product_attention_forward(q, k, v, mask)
    assert_close(out, expected)


def test_float_mask_of_zeros_and_ones_warns_naming_mask_and_empty_masks_are_fine():
    rng = np.random.default_rng(15)
    q, k, v = rng.standard_normal((3, 2)), rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    with pytest.warns(UserWarning, match=r"^mask is a float mask of 0s and 1s"):
        flash_attention_forward(q, k, v, mask=causal_mask(3).astype(float))
    out, _ = flash_attention_forward(q, k[:0], v[:0], mask=np.zeros((3, 0)))  # no keys: all zeros
    assert out.shape == (3, 2) and not out.any()


def test_float64_mask_far_below_float32_blocks_silently():
    rng = np.random.default_rng(16)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((4, 2), (4, 2), (4, 3)))
    mask = np.zeros((4, 4))
    mask[:, 1] = -1e300  # -inf in float32: blocked, as meant
    with np.errstate(all="raise"):
        out, cache = flash_attention_forward(q, k, v, mask=mask, block_size=2)
        expected, _ = scaled_dot_product_attention_forward(q, k, v, mask)
    assert out.dtype == np.float32
    assert_close(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask", [False, True])
def test_overflowing_scores_are_named(mask):
    """The tile check of the scores, and of scores plus a float mask, both signs at once."""
    if mask:
        q, k, m = np.full((1, 1), 1e154), np.full((2, 1), 1e154), np.array([[0.0, 1e308]])
        message = r"^overflow in the scores q k\^T / sqrt\(d_k\) \+ mask: the result exceeds the largest finite float64"
    else:
        q, k, m = np.full((2, 4), 1e200), np.full((3, 4), 1e200) * np.array([1.0, -1.0, 1.0, -1.0]), None
        message = r"^overflow in the attention scores q k\^T / sqrt\(d_k\): the result exceeds the largest finite float64"
    v = np.ones((k.shape[0], 2))
    with np.errstate(all="raise"), pytest.raises(FloatingPointError, match=message + r".*\(largest \|q\| = .*, largest \|k\| = .*\)"):
        flash_attention_forward(q, k, v, mask=m, block_size=1)


def test_float32_work_never_makes_a_float64_array(monkeypatch):
    """Every array NumPy hands back inside the forward and backward of float32 inputs is
    float32 (running maxima, sums, accumulators, cache): no silent float64 upcast."""
    import types

    import attention_ref.variants.blockwise as flash

    made = []

    def recording(fn):
        def call(*args, **kwargs):
            result = fn(*args, **kwargs)
            for r in result if isinstance(result, tuple) else (result,):
                if isinstance(r, np.ndarray) and r.dtype.kind == "f":
                    made.append((fn.__name__, r.dtype))
            return result
        return call

    proxy = types.SimpleNamespace(**{name: recording(getattr(np, name)) if callable(getattr(np, name)) and
                                     not isinstance(getattr(np, name), type) else getattr(np, name)
                                     for name in dir(np) if not name.startswith("_")})
    monkeypatch.setattr(flash, "np", proxy)
    rng = np.random.default_rng(17)
    q, k, v = (rng.standard_normal((2, 7, 4)).astype(np.float32) for _ in range(3))
    mask = rng.standard_normal((7, 7)).astype(np.float32)
    out, cache = flash.flash_attention_forward(q, k, v, mask=mask, causal=True, block_size=3)
    grads = flash.flash_attention_backward(np.ones_like(out), cache)
    assert made and {dtype for _, dtype in made} == {np.dtype(np.float32)}, sorted(set(made))
    assert cache.row_max.dtype == cache.log_row_sum.dtype == np.float32
    assert all(g.dtype == np.float32 for g in grads)


def test_float64_upstream_gradient_is_used_in_the_forward_dtype():
    """dout in float64 for a float32 forward: the same bits as passing it in float32."""
    rng = np.random.default_rng(18)
    q, k, v = (rng.standard_normal((5, 3)).astype(np.float32) for _ in range(3))
    out, cache = flash_attention_forward(q, k, v, block_size=2)
    dout = rng.standard_normal(out.shape)
    for g64, g32 in zip(flash_attention_backward(dout, cache),
                        flash_attention_backward(dout.astype(np.float32), cache)):
        assert g64.dtype == np.float32
        np.testing.assert_array_equal(g64, g32)



def test_each_query_keeps_its_own_running_maximum():
    """Rows of very different scale in one tile: a maximum shared by the tile (1e5 against 1)
    would underflow the small row's exp to 0; per-row maxima keep it exact."""
    rng = np.random.default_rng(19)
    q = rng.standard_normal((2, 4))
    q[0] *= 1e5 / np.abs(q[0]).max()  # scores around 1e5 next to scores around 1: exp(1 - 1e5) = 0
    k, v = rng.standard_normal((3, 4)), rng.standard_normal((3, 2))
    out, _ = flash_attention_forward(q, k, v, block_size=2)
    expected, _ = scaled_dot_product_attention_forward(q, k, v)
    assert_close(out, expected)
