"""Multi-head latent attention (nn/mla.py): the forward against a loop over tokens and heads written
from the description, its backward against finite differences in float64 (with and without a
query compression, RoPE pairs interleaved or half), and the absorbed decoding step with a cache of
the latent against the plain forward on its outputs."""
import math

import numpy as np
import pytest

from attention_ref.nn.mla import LatentCache, MLAShape, mla_backward, mla_decode_absorbed, mla_forward, \
    mla_param_shapes
from _helpers import assert_close, check_gradients

D = 12
SHAPES = [MLAShape(3, None, 5, 4, 4, 3), MLAShape(2, 6, 5, 2, 4, 5, interleaved=False, scale=0.3),
          MLAShape(3, 6, 5, 4, 4, 3, scale=0.4, rope_factor=1.3)]  # YaRN's factor on cos and sin
IDS = ["no-q-lora-interleaved", "q-lora-half", "rope-factor"]


def _params(shape, rng):
    return {name: (1.0 + rng.random(s) if name.endswith("norm.weight") else 0.5 * rng.standard_normal(s))
            for name, s in mla_param_shapes(D, shape).items()}


def _theta(shape):
    dr = shape.qk_rope_head_dim
    return 10.0 ** (-np.arange(0, dr, 2) / dr)


def _rms(v, w, eps):
    return [v[i] / math.sqrt(sum(a * a for a in v) / len(v) + eps) * w[i] for i in range(len(v))]


def _rot(v, angle_of_pair, interleaved, factor=1.0):
    """v rotated pair by pair: pairs (2i, 2i+1) or (i, i + d/2), times ``factor``."""
    d, out = len(v), list(v)
    for i in range(d // 2):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + d // 2)
        c, s = factor * math.cos(angle_of_pair[i]), factor * math.sin(angle_of_pair[i])
        out[a], out[b] = v[a] * c - v[b] * s, v[a] * s + v[b] * c
    return out


def _mla_loop(x, p, shape, theta, positions):
    """One sequence (N, D), token by token and head by head."""
    H, rq, r = shape.num_heads, shape.q_lora_rank, shape.kv_lora_rank
    dn, dr, dv = shape.qk_nope_head_dim, shape.qk_rope_head_dim, shape.v_head_dim
    scale = shape.scale or 1 / math.sqrt(dn + dr)
    N = len(x)
    qs, ks, vs = [], [], []
    for t in range(N):
        angle = [positions[t] * th for th in theta]
        q = x[t] @ p["W_q"] if rq is None else np.array(_rms(list(x[t] @ p["W_q_a"]), p["q_a_norm.weight"],
                                                             shape.eps)) @ p["W_q_b"]
        ckv = x[t] @ p["W_kv_a"]
        c_hat = np.array(_rms(list(ckv[:r]), p["kv_a_norm.weight"], shape.eps))
        k_pe = _rot(list(ckv[r:]), angle, shape.interleaved, shape.rope_factor)
        kv = c_hat @ p["W_kv_b"]
        q_t, k_t, v_t = [], [], []
        for h in range(H):
            qh = q[h * (dn + dr):(h + 1) * (dn + dr)]
            q_t.append(list(qh[:dn]) + _rot(list(qh[dn:]), angle, shape.interleaved, shape.rope_factor))
            kvh = kv[h * (dn + dv):(h + 1) * (dn + dv)]
            k_t.append(list(kvh[:dn]) + k_pe)
            v_t.append(kvh[dn:])
        qs.append(q_t), ks.append(k_t), vs.append(v_t)
    y = []
    for t in range(N):
        o = []
        for h in range(H):
            s = [scale * sum(a * b for a, b in zip(qs[t][h], ks[j][h])) for j in range(t + 1)]
            m = max(s)
            e = [math.exp(v - m) for v in s]
            o += list(sum(e[j] / sum(e) * vs[j][h] for j in range(t + 1)))
        y.append(np.array(o) @ p["W_o"])
    return np.array(y)


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_mla_matches_loop(shape):
    rng = np.random.default_rng(0)
    p = _params(shape, rng)
    x = rng.standard_normal((2, 5, D))
    positions = np.arange(3, 8)
    y, _ = mla_forward(x, p, shape, _theta(shape), positions)
    for b in range(2):
        assert_close(y[b], _mla_loop(x[b], p, shape, _theta(shape), positions), what=f"row {b}")


def test_the_layout_matters():
    """The same weights with the pairs of the other layout give other outputs."""
    rng = np.random.default_rng(1)
    shape = SHAPES[0]
    p, x = _params(shape, rng), rng.standard_normal((1, 4, D))
    y, _ = mla_forward(x, p, shape, _theta(shape), np.arange(4))
    y_half, _ = mla_forward(x, p, shape._replace(interleaved=False), _theta(shape), np.arange(4))
    assert np.abs(y - y_half).max() > 1e-3


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_mla_backward_gradcheck(shape):
    rng = np.random.default_rng(2)
    p, x = _params(shape, rng), rng.standard_normal((2, 4, D))
    theta, positions = _theta(shape), np.arange(1, 5)
    mask = np.array([True, True, False, True])[None, None, None, :]  # one key hidden from every query
    check_gradients(lambda x, p: mla_forward(x, p, shape, theta, positions, mask), mla_backward, x, p,
                    names=["x", "params"])


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_absorbed_decoding_equals_the_plain_form(shape):
    """A prompt of 3 tokens, then 3 steps of one token: each step's output equals the plain forward's at
    its position; the cache holds r + dr numbers per token."""
    rng = np.random.default_rng(3)
    p, x = _params(shape, rng), rng.standard_normal((2, 6, D))
    theta = _theta(shape)
    full, _ = mla_forward(x, p, shape, theta, np.arange(6))
    y, latent = mla_decode_absorbed(x[:, :3], p, shape, theta, np.arange(3))
    assert_close(y, full[:, :3], rtol=1e-11, atol=1e-11, what="prompt")
    for t in range(3, 6):
        y, latent = mla_decode_absorbed(x[:, t:t + 1], p, shape, theta, np.array([t]), latent)
        assert_close(y, full[:, t:t + 1], rtol=1e-11, atol=1e-11, what=f"step {t}")
    assert latent.c_hat.shape == (2, 6, shape.kv_lora_rank) and latent.k_pe.shape == (2, 6, shape.qk_rope_head_dim)


def test_absorbed_decoding_of_a_left_padded_batch():
    """Per-row positions (B, n) and a key mask: a row padded on the left by 2 gives, at every real token, the
    plain forward of its real tokens alone (positions from 0); prompt then two steps."""
    shape = SHAPES[2]
    rng = np.random.default_rng(5)
    p, x = _params(shape, rng), rng.standard_normal((2, 7, D))
    theta = _theta(shape)
    keep = np.ones((2, 7), bool)
    keep[0, :2] = False
    positions = np.where(keep, np.cumsum(keep, axis=1) - 1, 1)  # (B, T): each row counts its real tokens
    y, latent = mla_decode_absorbed(x[:, :5], p, shape, theta, positions[:, :5], mask=keep[:, None, None, :5])
    steps = [y]
    for t in (5, 6):
        y, latent = mla_decode_absorbed(x[:, t:t + 1], p, shape, theta, positions[:, t:t + 1], latent,
                                        mask=keep[:, None, None, :t + 1])
        steps.append(y)
    y = np.concatenate(steps, axis=1)
    for b in range(2):
        alone, _ = mla_forward(x[b:b + 1, keep[b]], p, shape, theta, np.arange(keep[b].sum()))
        assert_close(y[b, keep[b]], alone[0], rtol=1e-11, atol=1e-11, what=f"row {b}")
    with pytest.raises(ValueError, match=r"^mask must be broadcastable to \(B, 1, n, T \+ n\)"):
        mla_decode_absorbed(x[:, :2], p, shape, theta, np.arange(2), mask=np.ones((2, 1, 1, 3), bool))
    with pytest.raises(ValueError, match=r"^positions must have shape \(2,\) \(one per token of x\) or \(2, 2\)"):
        mla_decode_absorbed(x[:, :2], p, shape, theta, np.zeros((3, 2)))


def test_float32_stays_float32_and_bad_inputs_are_named():
    shape = SHAPES[1]
    rng = np.random.default_rng(4)
    p = {k: v.astype(np.float32) for k, v in _params(shape, rng).items()}
    x = rng.standard_normal((1, 3, D)).astype(np.float32)
    y, cache = mla_forward(x, p, shape, _theta(shape), np.arange(3))
    dx, g = mla_backward(np.ones_like(y), cache)
    assert y.dtype == dx.dtype == np.float32 and all(v.dtype == np.float32 for v in g.values())
    with pytest.raises(ValueError, match=r"^params\['W_kv_b'\] must have shape \(5, 14\), got \(5, 13\)$"):
        mla_forward(x, {**p, "W_kv_b": p["W_kv_b"][:, 1:]}, shape, _theta(shape), np.arange(3))
    with pytest.raises(ValueError, match=r"^params must hold exactly"):
        mla_forward(x, {k: v for k, v in p.items() if k != "W_q_a"}, shape, _theta(shape), np.arange(3))
    with pytest.raises(ValueError, match=r"^shape.qk_rope_head_dim must be even"):
        mla_forward(x, p, shape._replace(qk_rope_head_dim=3), _theta(shape), np.arange(3))
    with pytest.raises(ValueError, match=r"^theta must have shape \(2,\)"):
        mla_forward(x, p, shape, np.ones(3), np.arange(3))
    with pytest.raises(ValueError, match=r"^latent must be a LatentCache"):
        mla_decode_absorbed(x, p, shape, _theta(shape), np.arange(3), LatentCache(np.zeros((2, 1, 5)),
                                                                                  np.zeros((2, 1, 4))))
