"""The grouped-heads path's ``scores`` hook (Gemma 2's soft cap goes through it): the hooked
attention against a plain loop, the identity hook against the unhooked path, and every gradient
against finite differences (the hook's backward between the softmax's and the scale's)."""
import math

import numpy as np
import pytest

from attention_ref._pair_checks import check_multi_head_inputs
from attention_ref.core.masks import causal_mask
from attention_ref.nn.soft_cap import SoftCapScores
from attention_ref.variants.grouped_heads import (hooked_attention_backward_formula, hooked_attention_formula,
                                                  multi_head_attention_backward_formula,
                                                  multi_head_attention_formula)
from _helpers import assert_close, check_gradients


class Identity:
    def forward(self, S):
        return S, None

    def backward(self, dC, cache):
        return dC


def _inputs(seed=0, h=4, hkv=2, n=5, d=8, dh=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, n, d))
    p = {"W_q": rng.standard_normal((d, h * dh)), "W_k": rng.standard_normal((d, hkv * dh)),
         "W_v": rng.standard_normal((d, hkv * dh)), "W_o": rng.standard_normal((h * dh, d))}
    return x, p, h, hkv


def _attend(x, p, h, hkv, mask, hook, scale=0.6):
    inputs = check_multi_head_inputs(x, x, x, p, h, mask, hkv)
    return multi_head_attention_formula(inputs, tuple(p), scale=scale, scores=hook)


def loop_capped(x, p, h, hkv, mask, cap, scale):
    """Each head, each query: scores, cap * tanh(s / cap), the mask, softmax, the weighted values."""
    dh = p["W_q"].shape[1] // h
    Q, K, V = x @ p["W_q"], x @ p["W_k"], x @ p["W_v"]
    out = np.zeros(x.shape[:-1] + (h * dh,))
    for b in range(x.shape[0]):
        for i in range(h):
            j = i // (h // hkv)
            q, k, v = Q[b, :, i * dh:(i + 1) * dh], K[b, :, j * dh:(j + 1) * dh], V[b, :, j * dh:(j + 1) * dh]
            for n in range(x.shape[1]):
                s = np.array([cap * math.tanh(scale * float(q[n] @ k[m]) / cap) for m in range(x.shape[1])])
                s = np.where(mask[n], s, -np.inf)
                w = np.exp(s - s.max())
                out[b, n, i * dh:(i + 1) * dh] = (w / w.sum()) @ v
    return out @ p["W_o"]


@pytest.mark.parametrize("cap", [0.5, 3.0])
def test_soft_capped_grouped_attention_matches_a_loop(cap):
    x, p, h, hkv = _inputs()
    mask = causal_mask(x.shape[1])
    y, _ = _attend(x, p, h, hkv, mask, SoftCapScores(cap))
    assert_close(y, loop_capped(x, p, h, hkv, mask, cap, 0.6), what="capped grouped attention")


@pytest.mark.parametrize("hkv", [1, 2, 4])
def test_identity_hook_equals_the_unhooked_path(hkv):
    x, p, h, _ = _inputs(1, hkv=hkv)
    mask = causal_mask(x.shape[1])
    y, cache = _attend(x, p, h, hkv, mask, Identity())
    y0, cache0 = _attend(x, p, h, hkv, mask, None)
    assert_close(y, y0, rtol=1e-13, atol=1e-13, what="forward")
    dy = np.random.default_rng(2).standard_normal(y.shape)
    for a, b in zip(multi_head_attention_backward_formula(dy, cache)[:3],
                    multi_head_attention_backward_formula(dy, cache0)[:3]):
        assert_close(a, b, rtol=1e-12, atol=1e-12, what="backward")


@pytest.mark.parametrize("float_mask", [False, True])
def test_hooked_grouped_path_gradcheck(float_mask):
    x, p, h, hkv = _inputs(3)
    mask = causal_mask(x.shape[1])
    if float_mask:  # a float mask added after the cap
        mask = np.where(mask, 0.25 * np.random.default_rng(4).standard_normal(mask.shape), -np.inf)
    names = ["x", *p]

    def forward(x, *weights):
        return _attend(x, dict(zip(p, weights)), h, hkv, mask, SoftCapScores(1.5))

    def backward(dy, cache):
        dq, dk, dv, grads = multi_head_attention_backward_formula(dy, cache)
        return (dq + dk + dv, *(grads[n] for n in p))

    check_gradients(forward, backward, x, *p.values(), names=names)


def test_hooked_attention_pair_gradcheck():
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 1, 6, 5)), rng.standard_normal((2, 1, 6, 5))
    hook = SoftCapScores(0.8)

    def forward(q, k, v):
        out, cache, hook_cache = hooked_attention_formula(q, k, v, None, None, hook)
        return out, (cache, hook_cache)

    def backward(dout, caches):
        return hooked_attention_backward_formula(dout, caches[0], hook, caches[1])

    check_gradients(forward, backward, q, k, v, names=["q", "k", "v"])
