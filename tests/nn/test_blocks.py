"""Add & Norm and the Transformer encoder/decoder blocks.

Forwards against a plain-loop implementation written from the formulas (one batch
element, one position, one head at a time); backwards with the whole block gradient-
checked at once through its flat, dotted parameter dict.
"""
import math

import numpy as np
import pytest

from attention_ref import (
    TransformerDecoderBlock,
    TransformerEncoderBlock,
    add_norm_backward,
    add_norm_forward,
    decoder_block_backward,
    decoder_block_forward,
    encoder_block_backward,
    encoder_block_forward,
    init_decoder_block_params,
    init_encoder_block_params,
    residual_backward,
    residual_forward,
)
from attention_ref.nn.feed_forward import feed_forward_backward, feed_forward_forward
from tests._helpers import assert_close, check_gradients

# ---------------------------------------------------------------- plain-loop references


def _ln_loop(row, gamma, beta, eps=1e-5):
    d = len(row)
    mu = sum(row) / d
    var = sum((v - mu) ** 2 for v in row) / d
    return np.array([gamma[j] * (row[j] - mu) / math.sqrt(var + eps) + beta[j] for j in range(d)])


def _ffn_loop(row, p, activation):
    def act(h):
        if activation == "relu":
            return max(h, 0.0)
        return 0.5 * h * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
    hidden = [act(sum(row[i] * p["ffn.W_1"][i, f] for i in range(len(row))) + p["ffn.b_1"][f])
              for f in range(p["ffn.W_1"].shape[1])]
    return np.array([sum(hidden[f] * p["ffn.W_2"][f, o] for f in range(len(hidden))) + p["ffn.b_2"][o]
                     for o in range(p["ffn.W_2"].shape[1])])


def _attn_loop(xq, xkv, p, prefix, h, allowed):
    """Multi-head attention for one sequence: queries xq (n, d), keys/values xkv (m, dm)."""
    W = {n: p[f"{prefix}.W_{n}"] for n in "qkvo"}
    b = {n: p[f"{prefix}.b_{n}"] for n in "qkvo"}
    d_k = W["q"].shape[1] // h
    Q, K, V = xq @ W["q"] + b["q"], xkv @ W["k"] + b["k"], xkv @ W["v"] + b["v"]
    concat = np.zeros((len(xq), W["o"].shape[0]))
    for head in range(h):
        cols = slice(head * d_k, (head + 1) * d_k)
        for i in range(len(xq)):
            scores = [Q[i, cols] @ K[j, cols] / math.sqrt(d_k) if allowed[i][j] else -math.inf
                      for j in range(len(xkv))]
            top = max(scores)
            e = [math.exp(s - top) for s in scores]
            w = [v / sum(e) for v in e]
            concat[i, cols] = sum(w[j] * V[j, cols] for j in range(len(xkv)))
    return concat @ W["o"] + b["o"]


def _sublayer_loop(x, f, p, ln, norm_first):
    """Post-norm LN(x + f(x)) or pre-norm x + f(LN(x)), row by row for the norms."""
    g, bt = p[f"{ln}.gamma"], p[f"{ln}.beta"]
    if norm_first:
        return x + f(np.array([_ln_loop(r, g, bt) for r in x]))
    s = f(x)
    return np.array([_ln_loop(x[i] + s[i], g, bt) for i in range(len(x))])


def _encoder_loop(x, p, h, allowed, norm_first, activation):
    out = []
    for seq in x.reshape(-1, *x.shape[-2:]):  # one batch element at a time
        a = _sublayer_loop(seq, lambda z: _attn_loop(z, z, p, "self_attn", h, allowed), p, "ln1", norm_first)
        y = _sublayer_loop(a, lambda z: np.array([_ffn_loop(r, p, activation) for r in z]), p, "ln2", norm_first)
        out.append(y)
    return np.array(out).reshape(x.shape)


def _decoder_loop(x, memory, p, h, norm_first, activation):
    n, m = x.shape[-2], memory.shape[-2]
    causal = [[j <= i for j in range(n)] for i in range(n)]
    everything = [[True] * m for _ in range(n)]
    out = []
    for seq, mem in zip(x.reshape(-1, *x.shape[-2:]), memory.reshape(-1, *memory.shape[-2:])):
        h1 = _sublayer_loop(seq, lambda z: _attn_loop(z, z, p, "self_attn", h, causal), p, "ln1", norm_first)
        h2 = _sublayer_loop(h1, lambda z: _attn_loop(z, mem, p, "cross_attn", h, everything), p, "ln2", norm_first)
        y = _sublayer_loop(h2, lambda z: np.array([_ffn_loop(r, p, activation) for r in z]), p, "ln3", norm_first)
        out.append(y)
    return np.array(out).reshape(x.shape)


def _randomise(params, rng):
    """Non-trivial values for every parameter (biases, gamma and beta away from 0 and 1)."""
    out = {}
    for k, v in params.items():
        if k.endswith("gamma"):
            out[k] = 1.0 + 0.3 * rng.standard_normal(v.shape)
        elif v.ndim == 1:
            out[k] = 0.2 * rng.standard_normal(v.shape)
        else:
            out[k] = v + 0.1 * rng.standard_normal(v.shape)
    return out


# ---------------------------------------------------------------- Add & Norm


def test_add_norm_is_layer_norm_of_the_sum_and_gradchecks():
    rng = np.random.default_rng(0)
    x, s = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    g, b = 1 + rng.standard_normal(4), rng.standard_normal(4)
    y, _ = add_norm_forward(x, s, g, b)
    ref = np.array([_ln_loop(r, g, b) for r in (x + s).reshape(-1, 4)]).reshape(x.shape)
    assert_close(y, ref, what="add_norm")
    check_gradients(add_norm_forward, add_norm_backward, x, s, g, b, names=["x", "s", "gamma", "beta"])
    with pytest.raises(ValueError, match=r"same shape.*x \(2, 3, 4\) and sublayer_out \(3, 4\)"):
        add_norm_forward(x, s[0], g, b)


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_both_placements_gradcheck(norm_first):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4))
    ffn = {"W_1": rng.standard_normal((4, 6)), "b_1": rng.standard_normal(6),
           "W_2": rng.standard_normal((6, 4)), "b_2": rng.standard_normal(4)}
    g, b = 1 + rng.standard_normal(4), rng.standard_normal(4)

    def forward(x, ffn, g, b):
        return residual_forward(x, lambda z: feed_forward_forward(z, ffn, "gelu"), g, b, norm_first=norm_first)

    def backward(dy, cache):
        return residual_backward(dy, cache, feed_forward_backward)

    p = {f"ffn.{k}": v for k, v in ffn.items()} | {"ln.gamma": g, "ln.beta": b}
    y, _ = forward(x, ffn, g, b)
    ref = np.array([_sublayer_loop(seq, lambda z: np.array([_ffn_loop(r, p, "gelu") for r in z]), p, "ln",
                                   norm_first) for seq in x])
    assert_close(y, ref, what="residual sub-layer")
    check_gradients(forward, backward, x, ffn, g, b, names=["x", "ffn", "gamma", "beta"])


# ---------------------------------------------------------------- encoder block

ENCODER_CASES = [  # (x shape, heads, d_ff, norm_first, activation, mask)
    ((3, 4), 2, 8, False, "relu", None),
    ((2, 3, 4), 2, 6, True, "gelu", None),
    ((2, 4, 6), 3, 5, False, "gelu", "padding"),
    ((2, 3, 4), 1, 8, True, "relu", "padding"),
]


def _encoder_setup(shape, h, d_ff, seed=0):
    rng = np.random.default_rng(seed)
    p = _randomise(init_encoder_block_params(shape[-1], h, d_ff, seed=seed), rng)
    x = rng.standard_normal(shape)
    return x, p


def _padding(shape):
    """Batch element b may attend to its first n - b keys; (B, 1, N) or (1, N)."""
    n = shape[-2]
    lengths = n - np.arange(shape[0] if len(shape) == 3 else 1)
    allowed = np.arange(n) < lengths[:, None]  # (B, N)
    return allowed[:, None, :] if len(shape) == 3 else allowed


@pytest.mark.parametrize("shape,h,d_ff,norm_first,activation,mask", ENCODER_CASES)
def test_encoder_forward_matches_loop(shape, h, d_ff, norm_first, activation, mask):
    x, p = _encoder_setup(shape, h, d_ff)
    m = None if mask is None else _padding(shape)
    y, cache = encoder_block_forward(x, p, h, m, norm_first, activation=activation)
    if m is None:
        ref = _encoder_loop(x, p, h, np.ones((shape[-2], shape[-2]), bool), norm_first, activation)
    else:  # a different mask per batch element
        ref = np.array([_encoder_loop(x[b], p, h, np.broadcast_to(m[b], (shape[-2],) * 2), norm_first,
                                      activation) for b in range(shape[0])])
    assert_close(y, ref, rtol=1e-10, atol=1e-10, what="encoder block")
    assert cache.weights.shape == shape[:-2] + (h, shape[-2], shape[-2])


@pytest.mark.parametrize("shape,h,d_ff,norm_first,activation,mask", ENCODER_CASES)
def test_encoder_block_gradcheck_as_a_whole(shape, h, d_ff, norm_first, activation, mask):
    x, p = _encoder_setup(shape, h, d_ff, seed=1)
    m = None if mask is None else _padding(shape)
    check_gradients(lambda x, params: encoder_block_forward(x, params, h, m, norm_first, activation=activation),
                    encoder_block_backward, x, p, names=["x", "params"])


def test_encoder_head_mask_gradient():
    x, p = _encoder_setup((2, 3, 4), 2, 6, seed=2)
    hm = np.array([0.7, 1.3])

    def forward(hm):
        return encoder_block_forward(x, p, 2, head_mask=hm)

    def backward(dout, cache):
        return encoder_block_backward(dout, cache)[1]["self_attn.head_mask"]

    check_gradients(forward, backward, hm, names=["head_mask"])
    y_pruned, _ = encoder_block_forward(x, p, 2, head_mask=np.array([1.0, 0.0]))
    y_full, _ = encoder_block_forward(x, p, 2)
    assert not np.allclose(y_pruned, y_full)


def test_encoder_class_matches_functional_and_is_seedable():
    block = TransformerEncoderBlock(8, 2, 16, norm_first=True, activation="gelu", seed=3)
    again = TransformerEncoderBlock(8, 2, 16, norm_first=True, activation="gelu", seed=3)
    assert list(block.params) == list(again.params)
    for k in block.params:
        np.testing.assert_array_equal(block.params[k], again.params[k])
    assert {"self_attn.W_q", "ln1.gamma", "ffn.W_1", "ln2.beta"} <= set(block.params)
    x = np.random.default_rng(4).standard_normal((2, 5, 8))
    y = block(x)
    y_ref, cache = encoder_block_forward(x, block.params, 2, None, True, activation="gelu")
    assert_close(y, y_ref, what="class forward")
    dout = np.random.default_rng(5).standard_normal(y.shape)
    dx = block.backward(dout)
    dx_ref, grads_ref = encoder_block_backward(dout, cache)
    assert_close(dx, dx_ref, what="class backward")
    assert list(block.grads) == list(block.params)
    for k in grads_ref:
        assert_close(block.grads[k], grads_ref[k], what=k)


def test_encoder_bad_inputs():
    x, p = _encoder_setup((2, 3, 4), 2, 6)
    with pytest.raises(ValueError, match=r"unknown keys \['ffn.W_3'\]"):
        encoder_block_forward(x, {**p, "ffn.W_3": np.zeros((4, 4))}, 2)
    with pytest.raises(ValueError, match=r"unknown keys \['W_q'\]"):
        encoder_block_forward(x, {**p, "W_q": np.zeros((4, 4))}, 2)
    missing = {k: v for k, v in p.items() if k != "ln2.gamma"}
    with pytest.raises(ValueError, match=r"missing \['ln2.gamma'\]"):
        encoder_block_forward(x, missing, 2)
    with pytest.raises(ValueError, match="self_attn: .*not divisible by num_heads=3"):
        encoder_block_forward(x, p, 3)
    with pytest.raises(ValueError, match=r"ffn: .*params\['W_1'\]"):
        encoder_block_forward(x, {**p, "ffn.W_1": np.zeros((5, 6))}, 2)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., n, d_model\)"):
        encoder_block_forward(x[0, 0], p, 2)
    with pytest.raises(TypeError, match="num_heads must be a positive integer"):
        encoder_block_forward(x, p, 2.0)
    with pytest.raises(RuntimeError, match="before forward"):
        TransformerEncoderBlock(4, 2).backward(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="activation must be one of"):
        TransformerEncoderBlock(4, 2, activation="swish")
    with pytest.raises(TypeError, match="norm_first must be True or False"):
        TransformerDecoderBlock(4, 2, norm_first="pre")
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        TransformerDecoderBlock(4, 3)


# ---------------------------------------------------------------- decoder block

DECODER_CASES = [  # (x shape, memory shape, heads, d_ff, norm_first, activation)
    ((3, 4), (5, 4), 2, 6, False, "relu"),
    ((2, 3, 4), (2, 2, 6), 2, 5, True, "gelu"),
    ((2, 4, 6), (2, 3, 6), 3, 4, False, "gelu"),
]


def _decoder_setup(x_shape, m_shape, h, d_ff, seed=0):
    rng = np.random.default_rng(seed)
    p = init_decoder_block_params(x_shape[-1], h, d_ff, d_memory=m_shape[-1], seed=seed)
    return rng.standard_normal(x_shape), rng.standard_normal(m_shape), _randomise(p, rng)


@pytest.mark.parametrize("x_shape,m_shape,h,d_ff,norm_first,activation", DECODER_CASES)
def test_decoder_forward_matches_loop(x_shape, m_shape, h, d_ff, norm_first, activation):
    x, memory, p = _decoder_setup(x_shape, m_shape, h, d_ff)
    y, cache = decoder_block_forward(x, memory, p, h, norm_first=norm_first, activation=activation)
    assert_close(y, _decoder_loop(x, memory, p, h, norm_first, activation), rtol=1e-10, atol=1e-10,
                 what="decoder block")
    n, m = x_shape[-2], m_shape[-2]
    assert cache.cross_weights.shape == x_shape[:-2] + (h, n, m)
    assert np.all(cache.self_weights[..., np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] == 0)


@pytest.mark.parametrize("x_shape,m_shape,h,d_ff,norm_first,activation", DECODER_CASES)
def test_decoder_block_gradcheck_as_a_whole(x_shape, m_shape, h, d_ff, norm_first, activation):
    x, memory, p = _decoder_setup(x_shape, m_shape, h, d_ff, seed=1)
    check_gradients(lambda x, memory, params: decoder_block_forward(
                        x, memory, params, h, norm_first=norm_first, activation=activation),
                    decoder_block_backward, x, memory, p, names=["x", "memory", "params"])


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_shared_target_against_a_batch_of_memories(norm_first):
    # x (n, d) broadcasts against memory (B, m, d): the output is (B, n, d) and dx sums over B
    x, memory, p = _decoder_setup((3, 4), (2, 5, 4), 2, 6, seed=4)
    y, _ = decoder_block_forward(x, memory, p, 2, norm_first=norm_first)
    assert y.shape == (2, 3, 4)
    for b in range(2):
        assert_close(y[b], decoder_block_forward(x, memory[b], p, 2, norm_first=norm_first)[0],
                     what=f"batch element {b}")
    check_gradients(lambda x, memory, params: decoder_block_forward(x, memory, params, 2, norm_first=norm_first),
                    decoder_block_backward, x, memory, p, names=["x", "memory", "params"])


def test_decoder_is_causal_and_masks_combine():
    x, memory, p = _decoder_setup((2, 4, 4), (2, 3, 4), 2, 6)
    y, _ = decoder_block_forward(x, memory, p, 2)
    x2 = x.copy()
    x2[:, 2:] += 5.0  # change the future of positions 0 and 1
    y2, _ = decoder_block_forward(x2, memory, p, 2)
    assert_close(y2[:, :2], y[:, :2], what="outputs before the change")
    assert not np.allclose(y2[:, 2:], y[:, 2:])
    # an extra padding mask hiding key 1 combines with the causal one (bool and float alike)
    keep = np.array([True, False, True, True])
    _, c_bool = decoder_block_forward(x, memory, p, 2, mask=keep)
    _, c_float = decoder_block_forward(x, memory, p, 2, mask=np.where(keep, 0.0, -np.inf))
    w = c_bool.self_weights
    assert np.all(w[..., 1] == 0) and np.all(w[..., 2, 3] == 0)
    assert_close(c_float.self_weights, w, what="float mask = bool mask")
    # causal=False gives an ordinary (bidirectional) self-attention
    _, c_full = decoder_block_forward(x, memory, p, 2, causal=False)
    assert np.all(c_full.self_weights[..., 0, 3] > 0)


def test_decoder_bad_inputs():
    x, memory, p = _decoder_setup((2, 3, 4), (2, 5, 6), 2, 6)
    with pytest.raises(ValueError, match=r"cross_attn: key of shape \(2, 5, 4\)"):
        decoder_block_forward(x, memory[..., :4], p, 2)
    with pytest.raises(ValueError, match=r"memory_mask of shape \(4,\)"):
        decoder_block_forward(x, memory, p, 2, memory_mask=np.ones(4, bool))
    with pytest.raises(ValueError, match=r"memory must have shape \(\.\.\., m, d_memory\)"):
        decoder_block_forward(x, memory[0, 0], p, 2)
    with pytest.raises(TypeError, match="integer"):
        decoder_block_forward(x, memory, p, 2, mask=np.ones(3, int))


def test_decoder_memory_mask_and_class():
    block = TransformerDecoderBlock(4, 2, 8, d_memory=6, seed=7)
    again = TransformerDecoderBlock(4, 2, 8, d_memory=6, seed=7)
    assert all(np.array_equal(block.params[k], again.params[k]) for k in block.params)
    assert {"self_attn.W_q", "cross_attn.W_k", "ln3.gamma", "ffn.W_2"} <= set(block.params)
    assert block.params["cross_attn.W_k"].shape == (6, 4)
    rng = np.random.default_rng(8)
    x, memory = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 6))
    mm = np.array([True, True, False, True, False])
    y = block(x, memory, memory_mask=mm)
    assert np.all(block.cache.cross_weights[..., [2, 4]] == 0)
    y_ref, cache = decoder_block_forward(x, memory, block.params, 2, memory_mask=mm)
    assert_close(y, y_ref, what="class forward")
    dout = rng.standard_normal(y.shape)
    dx, dmemory = block.backward(dout)
    dx_ref, dmem_ref, grads_ref = decoder_block_backward(dout, cache)
    assert_close(dx, dx_ref, what="dx")
    assert_close(dmemory, dmem_ref, what="dmemory")
    assert np.all(dmemory[:, [2, 4]] == 0)  # masked memory positions get no gradient
    assert list(block.grads) == list(block.params)


def test_float32_blocks_stay_float32():
    enc = TransformerEncoderBlock(4, 2, 8, seed=0, dtype=np.float32)
    dec = TransformerDecoderBlock(4, 2, 8, seed=0, dtype=np.float32)
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    y = enc(x)
    z = dec(x, y)
    dx = enc.backward(np.ones_like(y))
    dxd, dm = dec.backward(np.ones_like(z))
    assert {a.dtype for a in (y, z, dx, dxd, dm)} == {np.dtype(np.float32)}
    assert all(g.dtype == np.float32 for g in list(enc.grads.values()) + list(dec.grads.values()))


@pytest.mark.parametrize("norm_first", [False, True])
def test_float32_block_with_float64_dout_stays_float32(norm_first):
    # a float64 upstream gradient must not promote dx or any parameter gradient
    enc = TransformerEncoderBlock(4, 2, 8, seed=0, dtype=np.float32, norm_first=norm_first)
    dec = TransformerDecoderBlock(4, 2, 8, seed=0, dtype=np.float32, norm_first=norm_first)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    y = enc(x)
    z = dec(x, y)
    dx = enc.backward(rng.standard_normal(y.shape))  # float64 dout
    dxd, dm = dec.backward(rng.standard_normal(z.shape))
    assert {a.dtype for a in (dx, dxd, dm)} == {np.dtype(np.float32)}
    assert {g.dtype for g in list(enc.grads.values()) + list(dec.grads.values())} == {np.dtype(np.float32)}
    # and residual_backward itself, with a float64 dy for a float32 sub-layer
    ffn = {k: v.astype(np.float32) for k, v in init_encoder_block_params(4, 2, 6, seed=2).items()
           if k.startswith("ffn.")}
    ffn = {k[len("ffn."):]: v for k, v in ffn.items()}
    y, cache = residual_forward(x, lambda z: feed_forward_forward(z, ffn), np.ones(4, np.float32),
                                np.zeros(4, np.float32), norm_first=norm_first)
    dx, grads, dgamma, dbeta = residual_backward(rng.standard_normal(y.shape), cache, feed_forward_backward)
    assert {a.dtype for a in (dx, dgamma, dbeta, *grads.values())} == {np.dtype(np.float32)}


@pytest.mark.parametrize("norm_first", [False, True])
def test_sublayer_output_width_is_checked(norm_first):
    # a sub-layer whose output is narrower than d_model must not broadcast into x + s
    x, p = _encoder_setup((2, 3, 4), 2, 6)
    with pytest.raises(ValueError, match=r"params\['ffn.W_2'\] must have 4 columns.*got shape \(6, 1\)"):
        encoder_block_forward(x, {**p, "ffn.W_2": np.zeros((6, 1)), "ffn.b_2": None}, 2, norm_first=norm_first)
    with pytest.raises(ValueError, match=r"params\['self_attn.W_o'\] must have 4 columns.*got shape \(4, 1\)"):
        encoder_block_forward(x, {**p, "self_attn.W_o": np.zeros((4, 1)), "self_attn.b_o": None}, 2,
                              norm_first=norm_first)
    with pytest.raises(ValueError, match=r"params\['ffn.b_2'\] must have shape \(4,\).*got shape \(1,\)"):
        encoder_block_forward(x, {**p, "ffn.b_2": np.zeros(1)}, 2, norm_first=norm_first)
    xd, memory, pd = _decoder_setup((2, 3, 4), (2, 5, 6), 2, 6)
    with pytest.raises(ValueError, match=r"params\['cross_attn.W_o'\] must have 4 columns.*\(4, 1\)"):
        decoder_block_forward(xd, memory, {**pd, "cross_attn.W_o": np.zeros((4, 1)), "cross_attn.b_o": None}, 2,
                              norm_first=norm_first)
    with pytest.raises(ValueError, match=r"params\['ffn.W_2'\] must have 4 columns.*\(6, 1\)"):
        decoder_block_forward(xd, memory, {**pd, "ffn.W_2": np.zeros((6, 1)), "ffn.b_2": None}, 2,
                              norm_first=norm_first)
    # residual_forward itself, with any sub-layer
    with pytest.raises(ValueError, match=r"sub-layer's output of shape \(2, 3, 1\).*width 4.*\(2, 3, 4\)"):
        residual_forward(x, lambda z: (z[..., :1], None), np.ones(4), np.zeros(4), norm_first=norm_first)


@pytest.mark.parametrize("key", ["ln1.gamma", "ln1.beta", "ln2.gamma", "ln2.beta"])
def test_layer_norm_shapes_are_checked_naming_the_key(key):
    x, p = _encoder_setup((2, 3, 4), 2, 6)
    for bad in (np.ones(5), np.ones((1, 4))):
        with pytest.raises(ValueError, match=rf"params\['{key}'\] must have shape \(4,\).*got shape"):
            encoder_block_forward(x, {**p, key: bad}, 2)
    with pytest.raises(TypeError, match=rf"params\['{key}'\] must hold real numbers"):
        encoder_block_forward(x, {**p, key: np.ones(4, bool)}, 2)
    xd, memory, pd = _decoder_setup((2, 3, 4), (2, 5, 6), 2, 6)
    dkey = key.replace("ln2", "ln3")
    with pytest.raises(ValueError, match=rf"params\['{dkey}'\] must have shape \(4,\)"):
        decoder_block_forward(xd, memory, {**pd, dkey: np.ones(5)}, 2)


def test_decoder_mask_lengths_are_checked():
    x, memory, p = _decoder_setup((2, 3, 4), (2, 5, 4), 2, 6)
    for causal in (True, False):
        with pytest.raises(ValueError, match=r"mask of shape \(4,\) does not broadcast.*\(2, 3, 3\)"):
            decoder_block_forward(x, memory, p, 2, mask=np.ones(4, bool), causal=causal)
        with pytest.raises(ValueError, match=r"mask of shape \(2, 2\) does not broadcast"):
            decoder_block_forward(x, memory, p, 2, mask=np.zeros((2, 2)), causal=causal)
    with pytest.raises(ValueError, match=r"memory_mask of shape \(3,\) does not broadcast.*\(2, 3, 5\)"):
        decoder_block_forward(x, memory, p, 2, memory_mask=np.ones(3, bool))
    with pytest.raises(TypeError, match="memory_mask must be boolean"):
        decoder_block_forward(x, memory, p, 2, memory_mask=np.ones(5, int))


def test_functional_blocks_reject_non_bool_flags():
    x, p = _encoder_setup((2, 3, 4), 2, 6)
    for bad in ("post", "pre", 1, None):
        with pytest.raises(TypeError, match="norm_first must be True or False"):
            encoder_block_forward(x, p, 2, norm_first=bad)
    xd, memory, pd = _decoder_setup((2, 3, 4), (2, 5, 4), 2, 6)
    with pytest.raises(TypeError, match="norm_first must be True or False"):
        decoder_block_forward(xd, memory, pd, 2, norm_first="post")
    for bad in ("no", 0, None):
        with pytest.raises(TypeError, match="causal must be True or False"):
            decoder_block_forward(xd, memory, pd, 2, causal=bad)
    y, _ = encoder_block_forward(x, p, 2, norm_first=np.bool_(True))  # NumPy bools are bools
    assert_close(y, encoder_block_forward(x, p, 2, norm_first=True)[0], what="np.bool_ flag")


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_gradcheck_with_padding_and_memory_masks(norm_first):
    x, memory, p = _decoder_setup((2, 4, 4), (2, 3, 6), 2, 5, seed=3)
    keep = np.array([[True, True, False, True], [True, True, True, False]])[:, None, :]  # (B, 1, N)
    mem_keep = np.array([[True, False, True], [True, True, False]])[:, None, :]  # (B, 1, M)
    for mask, memory_mask in ((keep, mem_keep), (np.where(keep, 0.0, -np.inf), np.where(mem_keep, 0.0, -1.5))):
        check_gradients(lambda x, memory, params: decoder_block_forward(
                            x, memory, params, 2, mask, memory_mask, norm_first, activation="gelu"),
                        decoder_block_backward, x, memory, p, names=["x", "memory", "params"])
    _, cache = decoder_block_forward(x, memory, p, 2, keep, mem_keep, norm_first)
    assert np.all(cache.self_weights[0, :, :, 2] == 0) and np.all(cache.cross_weights[0, ..., 1] == 0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_inputs_not_modified(norm_first):
    x, memory, p = _decoder_setup((2, 3, 4), (2, 2, 4), 2, 6)
    copies = (x.copy(), memory.copy(), {k: v.copy() for k, v in p.items()})
    y, cache = decoder_block_forward(x, memory, p, 2, norm_first=norm_first)
    dout = np.ones_like(y)
    decoder_block_backward(dout, cache)
    np.testing.assert_array_equal(x, copies[0])
    np.testing.assert_array_equal(memory, copies[1])
    for k in p:
        np.testing.assert_array_equal(p[k], copies[2][k])
    np.testing.assert_array_equal(dout, np.ones_like(y))
    xe, pe = _encoder_setup((2, 3, 4), 2, 6)
    copies = (xe.copy(), {k: v.copy() for k, v in pe.items()})
    y, cache = encoder_block_forward(xe, pe, 2, _padding(xe.shape), norm_first)
    dout = np.ones_like(y)
    encoder_block_backward(dout, cache)
    np.testing.assert_array_equal(xe, copies[0])
    for k in pe:
        np.testing.assert_array_equal(pe[k], copies[1][k])
    np.testing.assert_array_equal(dout, np.ones_like(y))


def test_block_reprs_show_their_sizes_and_rebuild_equal_blocks():
    enc = TransformerEncoderBlock(8, 2, activation="gelu", norm_first=True, dtype=np.float32)
    assert repr(enc) == ("TransformerEncoderBlock(d_model=8, num_heads=2, d_ff=32, activation='gelu',"
                         " norm_first=True, eps=1e-05, dtype='float32')")
    dec = TransformerDecoderBlock(8, 4, 16, d_memory=6)
    assert repr(dec) == ("TransformerDecoderBlock(d_model=8, num_heads=4, d_ff=16, d_memory=6,"
                         " activation='relu', norm_first=False, eps=1e-05, dtype='float64')")
    for block in (enc, dec):
        rebuilt = eval(repr(block), {type(block).__name__: type(block)})  # the repr is a constructor call
        assert {n: (p.shape, p.dtype) for n, p in rebuilt.params.items()} == \
            {n: (p.shape, p.dtype) for n, p in block.params.items()}
