"""gated_attention_forward / gated_attention_backward: Qwen3-Next's full-attention layer (gated query
projection, (1 + w) q/k norms per head, partial RoPE, grouped heads, sigmoid output gate) as steps of
pairs; gradients against finite differences, a plain loop, and decoding with the cache against the sequence."""
import numpy as np
import pytest

from attention_ref.nn.gated_attention import GatedAttentionShape, gated_attention_backward, gated_attention_forward
from _helpers import assert_close, check_gradients

SHAPE = GatedAttentionShape(num_heads=4, num_kv_heads=2, head_dim=6, rotary_dim=2, rope_theta=100.0, eps=1e-6)
D = 5


def attention_params(rng, shape=SHAPE, d=D):
    h, hkv, dh = shape[:3]
    return {"W_q": 0.5 * rng.standard_normal((d, 2 * h * dh)), "W_k": 0.5 * rng.standard_normal((d, hkv * dh)),
            "W_v": 0.5 * rng.standard_normal((d, hkv * dh)), "W_o": 0.5 * rng.standard_normal((h * dh, d)),
            "q_norm.weight": 0.1 * rng.standard_normal(dh), "k_norm.weight": 0.1 * rng.standard_normal(dh)}


def _loop(x, p, shape):
    """One batch row, head and query at a time, from the formulas."""
    h, hkv, dh, r, base, eps = shape
    out = np.zeros(x.shape)
    theta = base ** (-np.arange(0, r, 2) / r)

    def norm(u, w):
        return u / np.sqrt(np.mean(u ** 2) + eps) * (1 + w)

    def rope(u, pos):
        u = u.copy()
        half = r // 2
        a, b = u[:half].copy(), u[half:r].copy()
        u[:half] = a * np.cos(pos * theta) - b * np.sin(pos * theta)
        u[half:r] = b * np.cos(pos * theta) + a * np.sin(pos * theta)
        return u

    for bi in range(x.shape[0]):
        T = x.shape[1]
        qg = (x[bi] @ p["W_q"]).reshape(T, h, 2 * dh)
        k = (x[bi] @ p["W_k"]).reshape(T, hkv, dh)
        v = (x[bi] @ p["W_v"]).reshape(T, hkv, dh)
        merged = np.zeros((T, h * dh))
        for head in range(h):
            j = head // (h // hkv)
            for t in range(T):
                q = rope(norm(qg[t, head, :dh], p["q_norm.weight"]), t)
                keys = np.array([rope(norm(k[s, j], p["k_norm.weight"]), s) for s in range(t + 1)])
                scores = keys @ q / np.sqrt(dh)
                w = np.exp(scores - scores.max())
                w /= w.sum()
                o = w @ v[:t + 1, j]
                merged[t, head * dh:(head + 1) * dh] = o / (1 + np.exp(-qg[t, head, dh:]))
        out[bi] = merged @ p["W_o"]
    return out


def test_forward_matches_loop():
    rng = np.random.default_rng(0)
    x, p = rng.standard_normal((2, 4, D)), attention_params(rng)
    y, _ = gated_attention_forward(x, p, SHAPE)
    assert_close(y, _loop(x, p, SHAPE), what="gated attention")


def test_gradients():
    rng = np.random.default_rng(1)
    x, p = rng.standard_normal((2, 4, D)), attention_params(rng)
    check_gradients(lambda x, p: gated_attention_forward(x, p, SHAPE), gated_attention_backward, x, p,
                    names=["x", "params"])


def test_decoding_with_the_cache_matches_the_sequence():
    rng = np.random.default_rng(2)
    x, p = rng.standard_normal((2, 6, D)), attention_params(rng)
    y, _ = gated_attention_forward(x, p, SHAPE)
    _, c = gated_attention_forward(x[:, :3], p, SHAPE)
    for t in range(3, 6):
        y_t, c = gated_attention_forward(x[:, t:t + 1], p, SHAPE, past=c.kv)
        assert_close(y_t[:, 0], y[:, t], what=f"token {t}")


def test_refuses_a_wrong_weight_by_name():
    p = attention_params(np.random.default_rng(3))
    p["W_q"] = p["W_q"][:, :-1]
    with pytest.raises(ValueError, match=r"^params\['W_q'\] must have shape \(5, 48\), got \(5, 47\)$"):
        gated_attention_forward(np.ones((1, 2, D)), p, SHAPE)
