"""multi_head_attention_forward / _backward, both strategies, and the layer class."""
import numpy as np
import pytest

from attention_ref import (
    MultiHeadAttention,
    causal_mask,
    multi_head_attention_backward as mha_backward,
    multi_head_attention_forward as mha_forward,
    multi_head_attention_separate_heads_backward as sep_backward,
    multi_head_attention_separate_heads_forward as sep_forward,
    padding_mask,
)
from _helpers import assert_close, check_gradients, random_params
from _reference import loop_multi_head

# name: (query shape, key shape, value shape, num_heads, d_k, d_v, mask kind, bias)
CONFIGS = {
    "self, unbatched, 1 head": ((4, 6), (4, 6), (4, 6), 1, 6, 6, None, True),
    "self, batched, 3 heads, causal": ((2, 4, 6), (2, 4, 6), (2, 4, 6), 3, 2, 2, "causal", True),
    "cross, n_q != n_k, widths differ": ((2, 3, 6), (2, 5, 4), (2, 5, 7), 2, 3, 2, None, True),
    "d_k != d_v, no bias, padding": ((2, 4, 5), (2, 4, 5), (2, 4, 5), 2, 3, 4, "padding", False),
    "document shape d_model=3 h=2": ((1, 3), (1, 3), (1, 3), 2, 2, 2, None, False),
    "float mask, 4-d batch": ((2, 1, 3, 4), (2, 1, 3, 4), (2, 1, 3, 4), 2, 2, 3, "float", True),
}


def _setup(name, seed=0):
    q_shape, k_shape, v_shape, h, d_k, d_v, mask_kind, bias = CONFIGS[name]
    rng = np.random.default_rng(seed)
    query = rng.standard_normal(q_shape)
    key = query if q_shape == k_shape == v_shape and name.startswith("self") else rng.standard_normal(k_shape)
    value = key if name.startswith("self") else rng.standard_normal(v_shape)
    params = random_params(rng, q_shape[-1], h, d_k, d_v, kdim=k_shape[-1], vdim=v_shape[-1], bias=bias)
    n_q, n_k = q_shape[-2], k_shape[-2]
    if mask_kind == "causal":
        mask = causal_mask(n_q, n_k)
    elif mask_kind == "padding":
        mask = padding_mask([n_k, 2], n_k)  # (2, 1, n_k): the second sequence has 2 tokens
    elif mask_kind == "float":
        mask = np.where(rng.random((n_q, n_k)) < 0.3, -np.inf, rng.standard_normal((n_q, n_k)))
        mask[:, 0] = 0.0
    else:
        mask = None
    return query, key, value, params, h, mask


@pytest.mark.parametrize("name", CONFIGS)
def test_forward_matches_loop(name):
    query, key, value, params, h, mask = _setup(name)
    out, cache = mha_forward(query, key, value, params, h, mask)
    ref_out, ref_w = loop_multi_head(query, key, value, params, h, mask)
    assert_close(out, ref_out, what="multi-head output")
    assert_close(cache.weights, ref_w, what="multi-head weights")
    assert cache.weights.shape == np.broadcast_shapes(query.shape[:-2], key.shape[:-2]) + (h, query.shape[-2], key.shape[-2])


@pytest.mark.parametrize("name", CONFIGS)
def test_backward_gradcheck(name):
    query, key, value, params, h, mask = _setup(name, seed=1)
    check_gradients(mha_forward, mha_backward, query, key, value, params, h, mask,
                    names=["query", "key", "value", "params"])


@pytest.mark.parametrize("name", CONFIGS)
def test_separate_heads_strategy_agrees(name):
    query, key, value, params, h, mask = _setup(name, seed=2)
    out, cache = mha_forward(query, key, value, params, h, mask)
    out_sep, cache_sep = sep_forward(query, key, value, params, h, mask)
    assert_close(out_sep, out, what="separate-heads vs parallel output")
    assert_close(cache_sep.weights, cache.weights, what="separate-heads vs parallel weights")
    dout = np.random.default_rng(3).standard_normal(out.shape)
    for a, b in zip(mha_backward(dout, cache)[:3], sep_backward(dout, cache_sep)[:3]):
        assert_close(a, b, what="input gradients of the two strategies")
    ga, gb = mha_backward(dout, cache)[3], sep_backward(dout, cache_sep)[3]
    assert ga.keys() == gb.keys() == params.keys()
    for n in ga:
        assert_close(ga[n], gb[n], what=f"grads[{n}] of the two strategies")
    check_gradients(sep_forward, sep_backward, query, key, value, params, h, mask)


def test_key_bias_gradient_is_zero():
    """b_k shifts every score of a query row by the same q.b_k, which softmax ignores."""
    query, key, value, params, h, mask = _setup("self, batched, 3 heads, causal", seed=4)
    out, cache = mha_forward(query, key, value, params, h, mask)
    grads = mha_backward(np.random.default_rng(5).standard_normal(out.shape), cache)[3]
    assert np.abs(grads["b_k"]).max() < 1e-12 * np.abs(grads["b_q"]).max()
    shifted = dict(params, b_k=params["b_k"] + 3.0)
    assert_close(mha_forward(query, key, value, shifted, h, mask)[0], out, rtol=1e-10, atol=1e-12)


def test_grads_mirror_params_keys_including_none_biases():
    query, key, value, params, h, _ = _setup("cross, n_q != n_k, widths differ", seed=6)
    params = dict(params, b_q=None)
    del params["b_o"]
    out, cache = mha_forward(query, key, value, params, h)
    grads = mha_backward(np.ones_like(out), cache)[3]
    assert list(grads) == list(params) and grads["b_q"] is None


def test_mask_applies_to_every_head():
    query, key, value, params, h, _ = _setup("self, batched, 3 heads, causal", seed=7)
    _, cache = mha_forward(query, key, value, params, h, causal_mask(4))
    upper = ~causal_mask(4)
    assert (cache.weights[..., upper] == 0).all()
    np.testing.assert_allclose(cache.weights.sum(-1), 1.0, rtol=1e-12)


def test_self_attention_is_permutation_equivariant():
    query, _, _, params, h, _ = _setup("self, batched, 3 heads, causal", seed=8)
    perm = np.random.default_rng(9).permutation(4)
    out, _ = mha_forward(query, query, query, params, h)
    out_p, _ = mha_forward(query[:, perm], query[:, perm], query[:, perm], params, h)
    assert_close(out_p, out[:, perm])


def test_float32_stays_float32_and_nothing_is_modified():
    query, key, value, params, h, mask = _setup("cross, n_q != n_k, widths differ", seed=10)
    p32 = {n: a.astype(np.float32) for n, a in params.items()}
    before = {n: a.copy() for n, a in p32.items()}
    q32 = query.astype(np.float32)
    q_before = q32.copy()
    out, cache = mha_forward(q32, key.astype(np.float32), value.astype(np.float32), p32, h)
    dq, dk, dv, grads = mha_backward(np.ones_like(out), cache)
    assert out.dtype == np.float32 and dq.dtype == dk.dtype == dv.dtype == np.float32
    assert all(g.dtype == np.float32 for g in grads.values())
    np.testing.assert_array_equal(q32, q_before)
    for n in p32:
        np.testing.assert_array_equal(p32[n], before[n])
    out64, _ = mha_forward(query, key, value, params, h)
    assert_close(out, out64, rtol=1e-4, atol=1e-4)


def test_large_inputs_stay_finite():
    query, key, value, params, h, mask = _setup("self, batched, 3 heads, causal", seed=11)
    out, cache = mha_forward(query * 1e4, query * 1e4, query * 1e4, params, h, mask)
    grads = mha_backward(np.ones_like(out), cache)
    assert np.isfinite(out).all() and all(np.isfinite(g).all() for g in grads[:3])


def _good():
    rng = np.random.default_rng(12)
    return rng.standard_normal((2, 3, 6)), random_params(rng, 6, 2, 3, 3)


@pytest.mark.parametrize("change, error, words", [
    (lambda x, p: (x, x, x, p, 4), ValueError, ["W_q", "num_heads=4"]),
    (lambda x, p: (x, x[..., :5], x, p, 2), ValueError, ["key", "(2, 3, 5)", "W_k"]),
    (lambda x, p: (x, x, x[:, :2], p, 2), ValueError, ["key", "value", "n_k"]),
    (lambda x, p: (x, x, x, dict(p, W_o=p["W_o"][:4]), 2), ValueError, ["W_o", "rows"]),
    (lambda x, p: (x, x, x, dict(p, W_k=p["W_k"][:, :4]), 2), ValueError, ["W_k", "columns"]),
    (lambda x, p: (x, x, x, dict(p, b_v=p["b_v"][:2]), 2), ValueError, ["b_v", "(6,)"]),
    (lambda x, p: (x, x, x, dict(p, Wq=p["W_q"]), 2), ValueError, ["unknown", "Wq"]),
    (lambda x, p: (x, x, x, {k: v for k, v in p.items() if k != "W_v"}, 2), ValueError, ["missing", "W_v"]),
    (lambda x, p: (x, x, x, [p["W_q"]], 2), TypeError, ["params"]),
    (lambda x, p: (x, x, x, p, 0), ValueError, ["num_heads"]),
    (lambda x, p: (x, x, x, p, 2.0), TypeError, ["num_heads"]),
    (lambda x, p: (x, x, x, p, 2, np.ones((3, 4), bool)), ValueError, ["mask", "(3, 4)", "(2, 3, 3)"]),
    (lambda x, p: (x[0, 0], x, x, p, 2), ValueError, ["query", "(6,)"]),
    (lambda x, p: (x, x[:1].repeat(3, 0), x[:1].repeat(3, 0), p, 2), ValueError, ["batch", "(2,)", "(3,)"]),
    (lambda x, p: (x.astype(str), x, x, p, 2), TypeError, ["query"]),
    (lambda x, p: (x, x, x * np.nan, p, 2), ValueError, ["value", "NaN"]),
    (lambda x, p: (x, x, x, dict(p, W_q=p["W_q"] * np.inf), 2), ValueError, ["params['W_q']", "infinity"]),
    (lambda x, p: (x, x, x, dict(p, b_o=p["b_o"] * 1j), 2), TypeError, ["params['b_o']"]),
])
def test_bad_input(change, error, words):
    x, p = _good()
    with pytest.raises(error) as info:
        mha_forward(*change(x, p))
    for w in words:
        assert w in str(info.value), str(info.value)


def test_bad_input_to_separate_heads_strategy_is_checked_the_same_way():
    x, p = _good()
    with pytest.raises(ValueError, match="num_heads=4"):
        sep_forward(x, x, x, p, 4)


class TestLayer:
    def test_seeded_initialisation_is_deterministic(self):
        a = MultiHeadAttention(8, 2, seed=3)
        b = MultiHeadAttention(8, 2, seed=3)
        c = MultiHeadAttention(8, 2, seed=4)
        assert all(np.array_equal(a.params[n], b.params[n]) for n in a.params)
        assert not np.array_equal(a.params["W_q"], c.params["W_q"])
        assert a.parameter_count() == 4 * 8 * 8 + 4 * 8
        assert MultiHeadAttention(8, 4, bias=False).parameter_count() == 4 * 8 * 8

    def test_self_attention_backward_returns_dx_and_stores_grads(self):
        layer = MultiHeadAttention(6, 3, seed=0)
        x = np.random.default_rng(1).standard_normal((2, 4, 6))
        out = layer.forward(x, mask=causal_mask(4))
        dout = np.random.default_rng(2).standard_normal(out.shape)
        dx = layer.backward(dout)
        out_f, cache = mha_forward(x, x, x, layer.params, 3, causal_mask(4))
        dq, dk, dv, grads = mha_backward(dout, cache)
        assert_close(out, out_f)
        assert_close(dx, dq + dk + dv)
        assert layer.grads.keys() == layer.params.keys()
        check_gradients(lambda x: (layer.forward(x), None), lambda d, _: layer.backward(d), x)

    def test_cross_attention_backward_returns_three_gradients(self):
        layer = MultiHeadAttention(6, 2, kdim=4, vdim=5, d_k=3, d_v=2, seed=0)
        rng = np.random.default_rng(3)
        q, k, v = rng.standard_normal((3, 6)), rng.standard_normal((5, 4)), rng.standard_normal((5, 5))
        out = layer(q, k, v)
        assert out.shape == (3, 6)
        grads = layer.backward(np.ones_like(out))
        assert [g.shape for g in grads] == [(3, 6), (5, 4), (5, 5)]

    def test_strategies_agree(self):
        x = np.random.default_rng(4).standard_normal((2, 5, 8))
        par = MultiHeadAttention(8, 4, seed=9)
        sep = MultiHeadAttention(8, 4, seed=9, strategy="separate")
        assert_close(sep.forward(x, mask=causal_mask(5)), par.forward(x, mask=causal_mask(5)))
        dout = np.ones((2, 5, 8))
        assert_close(sep.backward(dout), par.backward(dout))
        for n in par.grads:
            assert_close(sep.grads[n], par.grads[n])

    def test_float32_layer(self):
        layer = MultiHeadAttention(4, 2, seed=0, dtype=np.float32)
        out = layer.forward(np.ones((3, 4), np.float32))
        assert out.dtype == np.float32 and layer.backward(np.ones_like(out)).dtype == np.float32

    @pytest.mark.parametrize("kwargs, error, word", [
        ({"d_model": 5, "num_heads": 2}, ValueError, "not divisible"),
        ({"d_model": 4, "num_heads": 0}, ValueError, "num_heads"),
        ({"d_model": 4, "num_heads": 2, "strategy": "fast"}, ValueError, "strategy"),
        ({"d_model": 4, "num_heads": 2, "dtype": int}, TypeError, "dtype"),
        ({"d_model": 4, "num_heads": 4, "num_kv_heads": 3}, ValueError, "num_kv_heads"),
    ])
    def test_bad_construction(self, kwargs, error, word):
        with pytest.raises(error, match=word):
            MultiHeadAttention(**kwargs)

    def test_d_model_not_divisible_is_fine_with_explicit_head_widths(self):
        layer = MultiHeadAttention(5, 2, d_k=3, d_v=2, seed=0)
        assert layer.forward(np.ones((2, 5))).shape == (2, 5)

    def test_backward_before_forward(self):
        with pytest.raises(RuntimeError, match="before forward"):
            MultiHeadAttention(4, 2).backward(np.ones((1, 4)))


def test_layer_repr_shows_its_sizes_and_rebuilds_an_equal_layer():
    layer = MultiHeadAttention(8, 4, num_kv_heads=2, kdim=6, bias=False, dtype=np.float32)
    text = repr(layer)
    assert text == ("MultiHeadAttention(d_model=8, num_heads=4, num_kv_heads=2, d_k=2, d_v=2, kdim=6,"
                    " vdim=8, bias=False, dtype='float32', strategy='parallel')")
    rebuilt = eval(text, {"MultiHeadAttention": MultiHeadAttention})  # the repr is a constructor call
    assert {n: p.shape for n, p in rebuilt.params.items()} == {n: p.shape for n, p in layer.params.items()}
    assert repr(MultiHeadAttention(6, 2, d_k=5, d_v=3, strategy="separate")) == (
        "MultiHeadAttention(d_model=6, num_heads=2, num_kv_heads=2, d_k=5, d_v=3, kdim=6, vdim=6,"
        " bias=True, dtype='float64', strategy='separate')")


def test_query_of_width_zero_runs_forward_and_backward():
    import attention_ref as ar

    params = {f"W_{n}": np.ones((0, 4)) for n in "qkv"}
    params["W_o"] = np.ones((4, 4))
    x = np.ones((2, 0))
    out, cache = ar.multi_head_attention_forward(x, x, x, params, 2)
    dquery, dkey, dvalue, grads = ar.multi_head_attention_backward(np.ones_like(out), cache)
    assert out.shape == (2, 4) and dquery.shape == dkey.shape == dvalue.shape == (2, 0)
    assert grads["W_q"].shape == (0, 4)


@pytest.mark.parametrize("which", ["key", "value"])
def test_one_dimensional_key_or_value_is_rejected(which):
    x = np.ones((3, 4))
    params = {f"W_{n}": np.ones((4, 4)) for n in "qkvo"}
    args = {"query": x, "key": x, "value": x, which: np.ones(4)}
    with pytest.raises(ValueError, match=rf"^{which} must have shape .* \(at least 2 axes\), got shape \(4,\)"):
        mha_forward(args["query"], args["key"], args["value"], params, 2)


def test_heads_of_width_one():
    """d_k = d_v = 1 (as many heads as features): the loop reference and the gradients."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 5, 4))
    params = random_params(rng, 4, 4, 1, 1)
    out, _ = mha_forward(x, x, x, params, 4)
    ref_out, _ = loop_multi_head(x, x, x, params, 4)
    assert_close(out, ref_out, what="out, d_k = 1")
    check_gradients(mha_forward, mha_backward, x, x, x, params, 4,
                    names=["query", "key", "value", "params"])


def _messages_cases():
    x = np.ones((2, 3, 6))
    p = random_params(np.random.default_rng(12), 6, 2, 3, 3)
    nb = {k: v for k, v in p.items() if not k.startswith("b")}
    all_shapes = "{'W_q': (6, 6), 'b_q': (6,), 'W_k': (6, 6), 'b_k': (6,), 'W_v': (6, 6), 'b_v': (6,), 'W_o': (6, 6), 'b_o': (6,)}"
    return [
        (lambda: mha_forward(x, x, x, [1], 2), TypeError,
         "params must be a dict with keys ('W_q', 'b_q', 'W_k', 'b_k', 'W_v', 'b_v', 'W_o', 'b_o'), got list"),
        (lambda: mha_forward(x, x, x, dict(p, W_q=np.ones(6)), 2), ValueError,
         "params['W_q'] must be a 2-D matrix, got shape (6,)"),
        (lambda: mha_forward(x, x, x, dict(nb, W_q=np.ones((6, 0)), W_k=np.ones((6, 0))), 2), ValueError,
         "params['W_q'] has no columns (d_k = 0); parameter shapes:"
         " {'W_q': (6, 0), 'W_k': (6, 0), 'W_v': (6, 6), 'W_o': (6, 6)}"),
        (lambda: mha_forward(x, x, x, dict(nb, W_v=np.ones((6, 5)), W_o=np.ones((4, 6))), 2), ValueError,
         "params['W_v'] has 5 columns, not divisible by num_kv_heads=2; parameter shapes:"
         " {'W_q': (6, 6), 'W_k': (6, 6), 'W_v': (6, 5), 'W_o': (4, 6)}"),
        (lambda: mha_forward(x, x, x, dict(nb, W_o=np.ones((4, 6))), 2), ValueError,
         "params['W_o'] must have num_heads*d_v = 2*3 = 6 rows, got 4; parameter shapes:"
         " {'W_q': (6, 6), 'W_k': (6, 6), 'W_v': (6, 6), 'W_o': (4, 6)}"),
        (lambda: mha_forward(x, x, x, dict(nb, W_k=np.ones((6, 3)), W_v=np.ones((6, 2)), W_o=np.ones((3, 6))), 2,
                             num_kv_heads=1), ValueError,
         "params['W_o'] must have num_heads*d_v = 2*2 = 4 rows, got 3; parameter shapes:"
         " {'W_q': (6, 6), 'W_k': (6, 3), 'W_v': (6, 2), 'W_o': (3, 6)}"),
        (lambda: mha_forward(x, np.ones((2, 4, 5)), np.ones((2, 4, 6)), dict(p, W_k=np.ones((7, 6))), 2), ValueError,
         "key of shape (2, 4, 5) has last dimension 5, but params['W_k'] of shape (7, 6) expects 7"),
        *[(lambda b=b: mha_forward(x, x, x, dict(p, **{b: np.ones(5)}), 2), ValueError,
           f"params['{b}'] must have shape (6,) to match params['W_{b[-1]}'], got (5,); parameter shapes: "
           + all_shapes.replace(f"'{b}': (6,)", f"'{b}': (5,)")) for b in ("b_q", "b_k", "b_v", "b_o")],
        (lambda: mha_forward(x, x, x, p, 0), ValueError, "num_heads must be a positive integer, got 0"),
        (lambda: mha_forward(x, x, x, p, 2, num_kv_heads=0), ValueError,
         "num_kv_heads must be a positive integer, got 0"),
        (lambda: mha_forward(x.astype(str), x, x, p, 2), TypeError, "query must hold real numbers, got array of dtype <U32"),
        (lambda: mha_forward(x, x.astype(str), x, p, 2), TypeError, "key must hold real numbers, got array of dtype <U32"),
        (lambda: mha_forward(x, x, x.astype(str), p, 2), TypeError, "value must hold real numbers, got array of dtype <U32"),
        (lambda: mha_forward(np.ones(6), x, x, p, 2), ValueError,
         "query must have shape (..., n_q, d_model) (at least 2 axes), got shape (6,)"),
        (lambda: mha_forward(x, np.ones(6), x, p, 2), ValueError,
         "key must have shape (..., n_k, d_key_in) (at least 2 axes), got shape (6,)"),
        (lambda: mha_forward(x, x, np.ones(6), p, 2), ValueError,
         "value must have shape (..., n_k, d_value_in) (at least 2 axes), got shape (6,)"),
        (lambda: mha_forward(x, np.ones((3, 3, 6)), np.ones((3, 3, 6)), p, 2), ValueError,
         "batch dimensions of query, key and value do not broadcast: query (2,), key (3,), value (3,)"),
    ]


@pytest.mark.parametrize("case", range(len(_messages_cases())))
def test_error_messages_are_exact(case):
    call, error, message = _messages_cases()[case]
    with pytest.raises(error) as info:
        call()
    assert str(info.value).startswith(message), str(info.value)
    if "parameter shapes" in message or "must be a" in message or "must have shape" in message:
        assert str(info.value) == message



@pytest.mark.parametrize("wide", ["query", "key", "value", "params"])
def test_one_float64_input_makes_the_layer_float64(wide):
    x, p = _good()
    args = {"query": x, "key": x + 1, "value": x - 1, "params": p}
    narrow = {n: ({k: v.astype(np.float32) for k, v in a.items()} if n == "params" else a.astype(np.float32))
              for n, a in args.items()}
    mixed = {n: args[n] if n == wide else narrow[n] for n in args}
    out, cache = mha_forward(mixed["query"], mixed["key"], mixed["value"], mixed["params"], 2)
    assert out.dtype == cache.attention.weights.dtype == np.float64
    ref, _ = mha_forward(*(mixed[n].astype(np.float64) if n != "params" else
                           {k: v.astype(np.float64) for k, v in mixed[n].items()} for n in args), 2)
    assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_float64_mask_is_rounded_to_float32_before_it_is_added():
    x, p = _good()
    x32, p32 = x.astype(np.float32), {k: v.astype(np.float32) for k, v in p.items()}
    mask = 3 * np.random.default_rng(13).standard_normal((2, 3, 3))  # per batch item
    out64, _ = mha_forward(x32, x32, x32, p32, 2, mask)
    out32, _ = mha_forward(x32, x32, x32, p32, 2, mask.astype(np.float32))
    np.testing.assert_array_equal(out64, out32)


def test_batched_mask_reaches_every_head_of_its_own_batch_item():
    """A (B, Nq, Nk) mask: item b's mask applies to every head of item b, and only there."""
    x, p = _good()
    mask = np.ones((2, 3, 3), bool)
    mask[1, :, 2] = False  # item 1 may not attend to key 2
    out, cache = mha_forward(x, x, x, p, 2, mask)
    assert (cache.attention.weights[1, ..., 2] == 0).all() and (cache.attention.weights[0, ..., 2] > 0).all()
    ref, _ = loop_multi_head(x, x, x, p, 2, mask)
    assert_close(out, ref)


@pytest.mark.parametrize("where, message", [
    ("key", "overflow in key W_k + b_k"),
    ("concat", "overflow in concat W_o + b_o"),
])
def test_projection_overflow_names_the_projection(where, message):
    x, p = _good()
    value = x
    if where == "key":
        p = dict(p, W_k=p["W_k"] * 1e306)
        x = x * 1e3
    else:  # heads of size ~100 times 1e308
        p = dict(p, W_o=np.full_like(p["W_o"], 1e308))
        value = np.abs(x) * 100
    with np.errstate(all="raise"), pytest.raises(FloatingPointError, match="^" + message.replace("+", r"\+")):
        mha_forward(x, x, value, p, 2)


def test_head_mask_errors_name_it():
    x, p = _good()
    with pytest.raises(TypeError, match="^head_mask must hold real numbers"):
        mha_forward(x, x, x, p, 2, head_mask=np.array(["a", "b"]))
    with pytest.raises(ValueError, match=r"^head_mask must have shape \(num_heads,\) = \(2,\), got \(3,\)$"):
        mha_forward(x, x, x, p, 2, head_mask=np.ones(3))


def test_scale_option_reaches_every_head():
    x, p = _good()
    out, cache = mha_forward(x, x, x, p, 2, scale=1.0)  # GPT-2's scale_attn_weights=False
    assert cache.attention.scale == 1.0
    heads = []
    for i in range(2):
        sl = slice(3 * i, 3 * (i + 1))
        Q, K, V = (x @ p[f"W_{n}"][:, sl] + p[f"b_{n}"][sl] for n in "qkv")
        s = Q @ K.swapaxes(-1, -2)
        w = np.exp(s - s.max(-1, keepdims=True))
        heads.append((w / w.sum(-1, keepdims=True)) @ V)
    assert_close(out, np.concatenate(heads, -1) @ p["W_o"] + p["b_o"])
    def self_attention_backward(dout, cache):
        dquery, dkey, dvalue, grads = mha_backward(dout, cache)
        return dquery + dkey + dvalue, grads

    check_gradients(lambda x, p: mha_forward(x, x, x, p, 2, scale=0.5), self_attention_backward, x, p)
