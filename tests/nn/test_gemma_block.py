"""Gemma 3's block ((1 + w) norms before and after each sub-layer, per-head (1 + w) q/k norms,
query_pre_attn_scalar, sliding layers, GeGLU): against a plain per-head loop written from the
formulas, by gradcheck, decoding in any split against the forward, float32 kept, names checked."""
import math

import numpy as np
import pytest

from attention_ref.nn.gemma_block import (GEMMA2_PARAM_NAMES, GEMMA_PARAM_NAMES, gemma_block_backward, gemma_block_decode_step,
                                          gemma_block_forward, init_gemma_block_params)
from attention_ref.nn.rope_scaling import rope_frequencies
from attention_ref.variants.kv_cache import KVCache
from _helpers import assert_close, check_gradients


def _params(d, h, hkv, d_head, seed, qk_norm=True):
    rng = np.random.default_rng(seed)
    p = init_gemma_block_params(d, h, 2 * d, num_kv_heads=hkv, d_head=d_head, seed=seed, qk_norm=qk_norm)
    return {k: v * 10 if v.ndim == 2 else v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}


def _grms(row, w, eps):
    return (1.0 + w) * row / math.sqrt(sum(v * v for v in row) / len(row) + eps)


def _rope(X, theta):
    out, half = X.copy(), X.shape[1] // 2
    for n in range(X.shape[0]):
        for i in range(half):
            c, s = math.cos(n * theta[i]), math.sin(n * theta[i])
            out[n, i], out[n, i + half] = X[n, i] * c - X[n, i + half] * s, X[n, i] * s + X[n, i + half] * c
    return out


def _gelu_tanh(a):
    return 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a ** 3)))


def loop_block(x, p, h, hkv, d_head, theta, eps, window, scale, cap=None):
    """One sequence (N, D), every step written out from the formulas."""
    n = x.shape[0]
    rows = lambda X, name: np.array([_grms(r, p[name], eps) for r in X])  # noqa: E731
    z = rows(x, "input_norm.weight")
    Q, K, V = (z @ p[f"self_attn.W_{c}"] for c in "qkv")
    heads = []
    for i in range(h):
        j = i // (h // hkv)
        q, k = Q[:, i * d_head:(i + 1) * d_head], K[:, j * d_head:(j + 1) * d_head]
        if "self_attn.q_norm.weight" in p:  # Gemma 3
            q, k = rows(q, "self_attn.q_norm.weight"), rows(k, "self_attn.k_norm.weight")
        q, k, v = _rope(q, theta), _rope(k, theta), V[:, j * d_head:(j + 1) * d_head]
        o = np.zeros((n, d_head))
        for a in range(n):
            keys = [b for b in range(n) if b <= a and (window is None or a - window < b)]
            s = np.array([q[a] @ k[b] * scale for b in keys])
            s = s if cap is None else cap * np.tanh(s / cap)  # Gemma 2: soft-capped before the softmax
            w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            o[a] = sum(wb * v[b] for wb, b in zip(w, keys))
        heads.append(o)
    hidden = x + rows(np.concatenate(heads, axis=1) @ p["self_attn.W_o"], "post_attention_norm.weight")
    u = rows(hidden, "pre_feedforward_norm.weight")
    m = (_gelu_tanh(u @ p["mlp.W_gate"]) * (u @ p["mlp.W_up"])) @ p["mlp.W_down"]
    return hidden + rows(m, "post_feedforward_norm.weight")


CASES = {  # (h, hkv, d_head, rope scaling, sliding window, scale, Gemma 2's score cap: no q/k norms)
    "global": (4, 2, 2, None, None, 0.7, None),
    "sliding": (4, 1, 4, None, 2, 0.3, None),
    "wide-heads-linear": (2, 2, 6, {"rope_type": "linear", "factor": 2.0}, None, None, None),
    "sliding-wide": (2, 1, 6, None, 3, 0.5, None),
    "gemma2-global-capped": (4, 2, 2, None, None, 0.7, 2.0),  # a cap of 2: the scores reach it, tanh bends them
    "gemma2-sliding-capped": (2, 1, 6, None, 3, None, 1.5),
}


def _kwargs(case):
    h, hkv, _, scaling, window, scale, cap = CASES[case]
    return {"num_kv_heads": hkv, "rope_base": 50.0, "eps": 1e-5, "rope_scaling": scaling, "sliding_window": window,
            "scale": scale, "attn_softcap": cap}


def _case_params(case, seed):
    h, hkv, d_head, *_, cap = CASES[case]
    return _params(8, h, hkv, d_head, seed, qk_norm=cap is None)


@pytest.mark.parametrize("case", CASES)
def test_block_matches_the_loop(case):
    h, hkv, d_head, scaling, window, scale, cap = CASES[case]
    p = _case_params(case, seed=1)
    x = np.random.default_rng(2).standard_normal((2, 5, 8))
    y, cache = gemma_block_forward(x, p, h, **_kwargs(case))
    theta = rope_frequencies(d_head, 50.0, scaling)
    for b in range(2):
        assert_close(y[b], loop_block(x[b], p, h, hkv, d_head, theta, 1e-5, window,
                                      d_head ** -0.5 if scale is None else scale, cap), what=f"{case} block")
    _, grads = gemma_block_backward(np.ones_like(y), cache)
    assert tuple(grads) == (GEMMA_PARAM_NAMES if cap is None else GEMMA2_PARAM_NAMES)


@pytest.mark.parametrize("case", CASES)
def test_block_gradcheck(case):
    h = CASES[case][0]
    p = _case_params(case, seed=3)
    x = np.random.default_rng(4).standard_normal((2, 5, 8))
    check_gradients(lambda x, p: gemma_block_forward(x, p, h, **_kwargs(case)), gemma_block_backward, x, p,
                    names=["x", "params"])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("splits", [(1,) * 6, (4, 1, 1), (2, 3, 1)])
def test_decoding_in_any_split_is_the_forward(case, splits):
    h = CASES[case][0]
    p = _case_params(case, seed=5)
    x = np.random.default_rng(6).standard_normal((2, 6, 8))
    full, _ = gemma_block_forward(x, p, h, **_kwargs(case))
    cache, outs, start = KVCache(), [], 0
    for t in splits:
        outs.append(gemma_block_decode_step(x[:, start:start + t], p, h, cache, **_kwargs(case)))
        start += t
    assert_close(np.concatenate(outs, axis=1), full, what="decoded rows")


def test_float32_stays_float32():
    p = {k: v.astype(np.float32) for k, v in _params(8, 2, 1, 4, seed=8).items()}
    x = np.random.default_rng(9).standard_normal((3, 8)).astype(np.float32)
    with np.errstate(all="raise"):
        y, cache = gemma_block_forward(x, p, 2, sliding_window=2)
        dx, grads = gemma_block_backward(np.ones_like(y), cache)
        p2 = {k: v for k, v in p.items() if "q_norm" not in k and "k_norm" not in k}
        y2, cache2 = gemma_block_forward(x, p2, 2, sliding_window=2, attn_softcap=50.0)  # Gemma 2
        dx2, grads2 = gemma_block_backward(np.ones_like(y2), cache2)
    assert y.dtype == dx.dtype == np.float32 and all(g.dtype == np.float32 for g in grads.values())
    assert y2.dtype == dx2.dtype == np.float32 and all(g.dtype == np.float32 for g in grads2.values())


def test_the_params_are_checked_by_name():
    p = _params(8, 2, 2, 4, seed=7)
    with pytest.raises(ValueError, match=r"missing \['pre_feedforward_norm.weight'\]"):
        gemma_block_forward(np.ones((3, 8)), {k: v for k, v in p.items() if k != "pre_feedforward_norm.weight"}, 2)
    with pytest.raises(ValueError, match=r"unknown \['self_attn.b_q'\]"):
        gemma_block_forward(np.ones((3, 8)), {**p, "self_attn.b_q": np.zeros(8)}, 2)
    with pytest.raises(ValueError, match=r"params\['post_feedforward_norm.weight'\] must have shape \(8,\)"):
        gemma_block_forward(np.ones((3, 8)), {**p, "post_feedforward_norm.weight": np.ones(3)}, 2)
    with pytest.raises(ValueError, match=r"params\['self_attn.k_norm.weight'\] must have shape \(4,\)"):
        gemma_block_forward(np.ones((3, 8)), {**p, "self_attn.k_norm.weight": np.ones(3)}, 2)
    with pytest.raises(ValueError, match="RoPE type 'yarn' is not implemented"):
        gemma_block_forward(np.ones((3, 8)), p, 2, rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="sliding_window"):
        gemma_block_forward(np.ones((3, 8)), p, 2, sliding_window=0)
    x = np.ones((3, 8))
    before = {k: v.copy() for k, v in p.items()}
    gemma_block_forward(x, p, 2)
    assert all(np.array_equal(p[k], before[k]) for k in p) and np.all(x == 1)  # nothing modified in place
