"""The chain of oracles, last link: ``attention_ref.fast`` answers to ``attention_ref.core``.

(``tests/_reference.py``'s plain loops check ``core/`` in ``tests/core/``.) Over one shape
matrix (unbatched, batched, broadcast batch axes, masks of both kinds with batch axes,
grouped-query heads, a head mask, empty axes) and both dtypes, every fast forward and
backward is compared with the reference's. The arithmetic differs in places (``dq`` and
``dk`` are scaled after the products; ``dk`` is summed over blocks of query rows), so the bound is the one
flash-attention's tests set for their kernels: the fast path's error against a float64
truth is at most twice the reference's own error, plus a few units of the dtype's rounding
(``_within_twice_the_reference``). In float64 the two paths must agree to 1e-12. The
backward is run with query-row blocks of a few rows and cache blocks of a few numbers, so
the blocked code runs on these small arrays; gradcheck runs through both paths.
"""
import numpy as np
import pytest

import attention_ref as ar
from attention_ref import core, fast
from attention_ref.fast import attention as fast_attention
from attention_ref.fast import row_blocks
from _helpers import assert_close, check_gradients, random_params


@pytest.fixture(params=["one block", "tiny blocks"])
def blocks(request, monkeypatch):
    """Run the fast path in one piece, and with blocks of a few rows (the blocked code)."""
    if request.param == "tiny blocks":
        monkeypatch.setattr(row_blocks, "BLOCK_ELEMENTS", 7)
        monkeypatch.setattr(fast_attention, "QUERY_BLOCK_ELEMENTS", 10)
    return request.param


def _within_twice_the_reference(fast_value, core_value, truth, dtype, what):
    """flash-attention's rule: |fast - truth| <= 2 |core - truth| + 8 eps max|truth|."""
    fast_value, core_value = np.asarray(fast_value), np.asarray(core_value)
    assert fast_value.shape == core_value.shape == truth.shape, what
    assert fast_value.dtype == core_value.dtype == dtype, f"{what}: {fast_value.dtype}, {core_value.dtype}"
    if not truth.size:
        return
    if dtype == np.float64:  # no wider truth at hand: the two paths agree to 1e-12
        assert_close(fast_value, core_value, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(truth).max()), what=what)
        return
    fast_error = np.abs(fast_value - truth).max()
    core_error = np.abs(core_value - truth).max()
    slack = 8 * np.finfo(dtype).eps * max(1.0, np.abs(truth).max())
    assert fast_error <= 2 * core_error + slack, \
        f"{what}: fast error {fast_error:.3e} > 2 x reference error {core_error:.3e} + {slack:.1e}"


# (q, k, v shapes, mask shape or None, mask kind): the attention's shape matrix
ATTENTION_CASES = [
    ((4, 3), (5, 3), (5, 2), None, None),                          # unbatched
    ((2, 3, 6, 4), (2, 3, 7, 4), (2, 3, 7, 5), None, None),        # batch and heads
    ((2, 6, 4), (7, 4), (7, 3), (6, 7), "bool"),                   # keys/values shared by the batch
    ((2, 1, 6, 4), (1, 3, 7, 4), (2, 3, 7, 2), (2, 1, 6, 7), "bool"),  # broadcast batch, mask with batch axes
    ((3, 5, 4), (3, 5, 4), (3, 5, 4), (3, 5, 5), "float"),         # float mask with a batch axis
    ((6, 4), (7, 4), (2, 7, 3), (2, 6, 7), "float"),               # v and the mask add a batch axis
    ((2, 2, 3, 6, 4), (2, 2, 1, 7, 4), (2, 2, 1, 7, 3), (6, 7), "bool"),  # grouped-query layout
    ((0, 6, 4), (0, 7, 4), (0, 7, 3), None, None),                 # an empty batch
    ((2, 0, 4), (2, 7, 4), (2, 7, 3), None, None),                 # no queries
    ((2, 6, 4), (2, 0, 4), (2, 0, 3), None, None),                 # no keys
]


def _mask(shape, kind, rng):
    if shape is None:
        return None
    keep = rng.random(shape) < 0.7
    keep[..., 0] = True
    if shape[-2] > 1:
        keep[..., 1, :] = False  # a query with no allowed key
    if kind == "bool":
        return keep
    return np.where(keep, 0.3 * rng.standard_normal(shape), -np.inf)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[4]}")
def test_attention_fast_answers_to_core(case, dtype, blocks):
    q_shape, k_shape, v_shape, mask_shape, kind = case
    rng = np.random.default_rng(sum(q_shape) + sum(v_shape))
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in (q_shape, k_shape, v_shape))
    mask = _mask(mask_shape, kind, rng)
    out_c, cache_c = core.scaled_dot_product_attention_forward(q, k, v, mask)
    out_f, cache_f = fast.scaled_dot_product_attention_forward_fast(q, k, v, mask)
    dout = rng.standard_normal(out_c.shape).astype(dtype)
    grads_c = core.scaled_dot_product_attention_backward(dout, cache_c)
    grads_f = fast.scaled_dot_product_attention_backward_fast(dout, cache_f)
    wide = [a.astype(np.float64) for a in (q, k, v, dout)]
    truth_out, truth_cache = core.scaled_dot_product_attention_forward(*wide[:3], mask)
    truth_grads = core.scaled_dot_product_attention_backward(wide[3], truth_cache)
    for name, f, c, t in zip(("out", "weights", "dq", "dk", "dv"),
                             (out_f, cache_f.weights, *grads_f), (out_c, cache_c.weights, *grads_c),
                             (truth_out, truth_cache.weights, *truth_grads)):
        _within_twice_the_reference(f, c, t, dtype, f"{name} ({blocks})")


@pytest.mark.parametrize("case", [c for c in ATTENTION_CASES if 0 not in c[0] + c[1]],
                         ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[4]}")
@pytest.mark.parametrize("path", ["core", "fast"])
def test_attention_gradcheck_on_both_paths(case, path, blocks):
    q_shape, k_shape, v_shape, mask_shape, kind = case
    rng = np.random.default_rng(sum(k_shape))
    q, k, v = (rng.standard_normal(s) for s in (q_shape, k_shape, v_shape))
    mask = _mask(mask_shape, kind, rng)
    forward, backward = {"core": (core.scaled_dot_product_attention_forward, core.scaled_dot_product_attention_backward),
                         "fast": (fast.scaled_dot_product_attention_forward_fast,
                                  fast.scaled_dot_product_attention_backward_fast)}[path]
    check_gradients(lambda q, k, v: forward(q, k, v, mask), backward, q, k, v, names=["q", "k", "v"])


# (batch, n_q, n_k, heads, kv heads, head mask, mask shape, kind): multi-head's shape matrix
MULTI_HEAD_CASES = [
    ((), 5, 5, 2, 2, False, None, None),
    ((2,), 5, 6, 4, 4, True, (5, 6), "bool"),
    ((2,), 5, 6, 4, 2, False, (2, 5, 6), "float"),   # grouped-query, mask with a batch axis
    ((2, 3), 4, 4, 3, 1, True, (3, 4, 4), "bool"),   # multi-query, two batch axes
    ((0,), 5, 6, 2, 1, False, None, None),           # an empty batch
]


def _multi_head_pair(path, plain, monkeypatch):
    """(forward, backward) of multi-head attention on one path. The plain layer: the core's and
    the fast module's pairs. Grouped heads or a head mask: the public pair (the grouped steps of
    attention_ref.variants.grouped_heads) on the reference, or with every piece on the fast path."""
    if plain:
        if path == "fast":
            return fast.multi_head_attention_forward_fast, fast.multi_head_attention_backward_fast
        return core.multi_head_attention_forward, core.multi_head_attention_backward
    from attention_ref.fast import dispatch

    def forward(*args, **kwargs):
        if path == "fast":
            with monkeypatch.context() as m:
                m.setattr(dispatch, "FAST_MIN_ELEMENTS", 0)
                return ar.multi_head_attention_forward(*args, **kwargs)
        with ar.reference_only():
            return ar.multi_head_attention_forward(*args, **kwargs)

    def backward(dout, cache):
        if path == "fast":
            with monkeypatch.context() as m:
                m.setattr(dispatch, "FAST_MIN_ELEMENTS", 0)
                return ar.multi_head_attention_backward(dout, cache)
        with ar.reference_only():
            return ar.multi_head_attention_backward(dout, cache)
    return forward, backward


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", MULTI_HEAD_CASES, ids=str)
def test_multi_head_fast_answers_to_core(case, dtype, blocks, monkeypatch):
    batch, n_q, n_k, h, hkv, with_head_mask, mask_shape, kind = case
    rng = np.random.default_rng(n_q + 10 * h + hkv)
    d_model = 6
    query = rng.standard_normal(batch + (n_q, d_model)).astype(dtype)
    key = rng.standard_normal(batch + (n_k, d_model)).astype(dtype)
    value = rng.standard_normal(batch + (n_k, d_model)).astype(dtype)
    p = random_params(rng, d_model, h, 3, 2, num_kv_heads=hkv, dtype=dtype)
    head_mask = rng.random(h).astype(dtype) if with_head_mask else None
    mask = _mask(mask_shape, kind, rng)
    plain = hkv == h and head_mask is None
    kwargs = {} if plain else dict(num_kv_heads=hkv, head_mask=head_mask)
    core_forward, core_backward = _multi_head_pair("core", plain, monkeypatch)
    fast_forward, fast_backward = _multi_head_pair("fast", plain, monkeypatch)
    out_c, cache_c = core_forward(query, key, value, p, h, mask, **kwargs)
    out_f, cache_f = fast_forward(query, key, value, p, h, mask, **kwargs)
    dout = rng.standard_normal(out_c.shape).astype(dtype)
    *inputs_c, grads_c = core_backward(dout, cache_c)
    *inputs_f, grads_f = fast_backward(dout, cache_f)
    wide = {n: a.astype(np.float64) for n, a in p.items()}
    if not plain:
        kwargs["head_mask"] = None if head_mask is None else head_mask.astype(np.float64)
    truth_out, truth_cache = core_forward(query.astype(np.float64), key.astype(np.float64), value.astype(np.float64),
                                          wide, h, mask, **kwargs)
    *truth_inputs, truth_grads = core_backward(dout.astype(np.float64), truth_cache)
    assert list(grads_f) == list(grads_c) == list(truth_grads)
    pairs = [("out", out_f, out_c, truth_out), ("weights", cache_f.weights, cache_c.weights, truth_cache.weights)]
    pairs += [(n, f, c, t) for n, f, c, t in zip(("dquery", "dkey", "dvalue"), inputs_f, inputs_c, truth_inputs)]
    pairs += [(n, grads_f[n], grads_c[n], truth_grads[n]) for n in grads_c]
    for name, f, c, t in pairs:
        _within_twice_the_reference(f, c, t, dtype, f"{name} ({blocks})")


@pytest.mark.parametrize("path", ["core", "fast"])
def test_multi_head_gradcheck_on_both_paths(path, blocks, monkeypatch):
    rng = np.random.default_rng(11)
    query, key, value = rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 7, 6)), rng.standard_normal((7, 6))
    mask = _mask((2, 5, 7), "bool", rng)
    for plain in (True, False):
        p = random_params(rng, 6, 4, 3, 2, num_kv_heads=4 if plain else 2)
        head_mask = rng.random(4)
        pair_forward, pair_backward = _multi_head_pair(path, plain, monkeypatch)
        names = list(p)

        def forward(query, key, value, head_mask, *weights):
            extra = {} if plain else dict(num_kv_heads=2, head_mask=head_mask)
            return pair_forward(query, key, value, dict(zip(names, weights)), 4, mask, **extra)

        def backward(dout, cache):
            dquery, dkey, dvalue, grads = pair_backward(dout, cache)
            dhm = np.zeros(4) if plain else grads["head_mask"]
            return (dquery, dkey, dvalue, dhm, *(grads[n] for n in names))

        if plain:  # no head mask: its gradient is 0, and finite differences agree
            check_gradients(forward, backward, query, key, value, np.ones(4), *p.values())
        else:
            check_gradients(forward, backward, query, key, value, head_mask, *p.values())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 4), (0, 4), (2, 0, 4)])
def test_linear_fast_answers_to_core(shape, dtype):
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(dtype)
    W, b = rng.standard_normal((4, 3)).astype(dtype), rng.standard_normal(3).astype(dtype)
    y_c, cache_c = core.linear_forward(x, W, b)
    y_f, cache_f = fast.linear_forward_fast(x, W, b)
    dy = rng.standard_normal(y_c.shape).astype(dtype)
    truth_y, truth_cache = core.linear_forward(x.astype(np.float64), W.astype(np.float64), b.astype(np.float64))
    truth = (truth_y, *core.linear_backward(dy.astype(np.float64), truth_cache))
    for name, f, c, t in zip(("y", "dx", "dW", "db"), (y_f, *fast.linear_backward_fast(dy, cache_f)),
                             (y_c, *core.linear_backward(dy, cache_c)), truth):
        _within_twice_the_reference(f, c, t, dtype, name)


def test_a_cache_made_by_one_path_works_in_the_other_backward():
    rng = np.random.default_rng(12)
    q, k, v, dout = (rng.standard_normal((2, 5, 4)) for _ in range(4))
    _, cache_c = core.scaled_dot_product_attention_forward(q, k, v)
    _, cache_f = fast.scaled_dot_product_attention_forward_fast(q, k, v)
    assert type(cache_c) is type(cache_f)
    for a, b in zip(core.scaled_dot_product_attention_backward(dout, cache_f),
                    fast.scaled_dot_product_attention_backward_fast(dout, cache_c)):
        assert_close(a, b, what="gradient from the other path's cache")


def test_overflow_is_named_alike_on_both_paths():
    q, k = np.full((2, 4), 1e200), np.full((3, 4), 1e200)
    messages = []
    for forward in (core.scaled_dot_product_attention_forward, fast.scaled_dot_product_attention_forward_fast):
        with np.errstate(all="raise"), pytest.raises(FloatingPointError) as info:
            forward(q, k, np.ones((3, 2)))
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert messages[0].startswith("overflow in the attention scores q k^T / sqrt(d_k)")


def test_the_top_level_pairs_are_the_dispatching_ones():
    assert ar.scaled_dot_product_attention_forward is fast.dispatch.scaled_dot_product_attention_forward
    assert ar.core.scaled_dot_product_attention_forward is core.attention.scaled_dot_product_attention_forward
    assert ar.scaled_dot_product_attention_forward is not ar.core.scaled_dot_product_attention_forward
