"""The Llama block with what the Llama-like families add (Llama 3.x's scaled RoPE, Qwen2's q/k/v
biases, Qwen3's per-head q/k RMSNorm and heads wider than d_model / num_heads, Mistral's sliding
window): against a plain per-head loop written from the formulas, by gradcheck, and decoding in
any split against the forward."""
import math

import numpy as np
import pytest

from attention_ref import llama_block_backward, llama_block_decode_step, llama_block_forward
from attention_ref.nn.llama_block import QK_NORM_NAMES, QKV_BIAS_NAMES, init_llama_block_params
from attention_ref.nn.rope_scaling import rope_frequencies
from attention_ref.variants.kv_cache import KVCache
from _helpers import assert_close, check_gradients

LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def _params(d, h, hkv, d_head, bias, norm, seed):
    rng = np.random.default_rng(seed)
    p = init_llama_block_params(d, h, 2 * d, num_kv_heads=hkv, seed=seed, qkv_bias=bias, qk_norm=norm, d_head=d_head)
    return {k: v * 10 if v.ndim == 2 else v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}


def _rms(row, w, eps):
    return w * row / math.sqrt(sum(v * v for v in row) / len(row) + eps)


def _rope(X, theta):
    """Rotate-half RoPE of each row n by n * theta_i, pair (i, i + Dh/2), one pair at a time."""
    out, half = X.copy(), X.shape[1] // 2
    for n in range(X.shape[0]):
        for i in range(half):
            c, s = math.cos(n * theta[i]), math.sin(n * theta[i])
            out[n, i], out[n, i + half] = X[n, i] * c - X[n, i + half] * s, X[n, i] * s + X[n, i + half] * c
    return out


def loop_block(x, p, h, hkv, d_head, theta, eps, window):
    """One sequence (N, D), every step written out from the formulas."""
    n = x.shape[0]
    z = np.array([_rms(x[i], p["input_norm.weight"], eps) for i in range(n)])
    Q, K, V = (z @ p[f"self_attn.W_{c}"] + p.get(f"self_attn.b_{c}", 0) for c in "qkv")
    heads = []
    for i in range(h):
        j = i // (h // hkv)
        q, k = Q[:, i * d_head:(i + 1) * d_head], K[:, j * d_head:(j + 1) * d_head]
        if "self_attn.q_norm.weight" in p:
            q = np.array([_rms(r, p["self_attn.q_norm.weight"], eps) for r in q])
            k = np.array([_rms(r, p["self_attn.k_norm.weight"], eps) for r in k])
        q, k, v = _rope(q, theta), _rope(k, theta), V[:, j * d_head:(j + 1) * d_head]
        o = np.zeros((n, d_head))
        for a in range(n):
            keys = [b for b in range(n) if b <= a and (window is None or a - window < b)]
            s = np.array([q[a] @ k[b] / math.sqrt(d_head) for b in keys])
            w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            o[a] = sum(wb * v[b] for wb, b in zip(w, keys))
        heads.append(o)
    hidden = x + np.concatenate(heads, axis=1) @ p["self_attn.W_o"]
    u = np.array([_rms(hidden[i], p["post_attention_norm.weight"], eps) for i in range(n)])
    a, b = u @ p["mlp.W_gate"], u @ p["mlp.W_up"]
    return hidden + (a / (1 + np.exp(-a)) * b) @ p["mlp.W_down"]


CASES = {  # (h, hkv, d_head, qkv bias, q/k norm, rope scaling, sliding window)
    "llama3": (4, 2, 2, False, False, LLAMA3, None),
    "qwen2": (4, 2, 2, True, False, None, None),
    "qwen3-wide-heads": (2, 1, 6, False, True, None, None),
    "mistral": (4, 2, 2, False, False, None, 2),
    "all": (2, 2, 6, True, True, {"rope_type": "linear", "factor": 2.0}, 3),
}


def _kwargs(case):
    h, hkv, _, _, _, scaling, window = CASES[case]
    return {"num_kv_heads": hkv, "rope_base": 50.0, "eps": 1e-5, "rope_scaling": scaling, "sliding_window": window}


@pytest.mark.parametrize("case", CASES)
def test_block_matches_the_loop(case):
    h, hkv, d_head, bias, norm, scaling, window = CASES[case]
    p = _params(8, h, hkv, d_head, bias, norm, seed=1)
    x = np.random.default_rng(2).standard_normal((2, 5, 8))
    y, cache = llama_block_forward(x, p, h, **_kwargs(case))
    theta = rope_frequencies(d_head, 50.0, scaling)
    for b in range(2):
        assert_close(y[b], loop_block(x[b], p, h, hkv, d_head, theta, 1e-5, window), what=f"{case} block")
    _, grads = llama_block_backward(np.ones_like(y), cache)
    assert set(grads) == set(p)  # the biases and the q/k norms get their gradients
    assert all(n in grads for n in (QKV_BIAS_NAMES if bias else ()) + (QK_NORM_NAMES if norm else ()))


@pytest.mark.parametrize("case", CASES)
def test_block_gradcheck(case):
    h, hkv, d_head, bias, norm, _, _ = CASES[case]
    p = _params(8, h, hkv, d_head, bias, norm, seed=3)
    x = np.random.default_rng(4).standard_normal((2, 5, 8))
    check_gradients(lambda x, p: llama_block_forward(x, p, h, **_kwargs(case)), llama_block_backward, x, p,
                    names=["x", "params"])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("splits", [(1,) * 6, (4, 1, 1), (2, 3, 1)])
def test_decoding_in_any_split_is_the_forward(case, splits):
    h, hkv, d_head, bias, norm, _, _ = CASES[case]
    p = _params(8, h, hkv, d_head, bias, norm, seed=5)
    x = np.random.default_rng(6).standard_normal((2, 6, 8))
    full, _ = llama_block_forward(x, p, h, **_kwargs(case))
    cache, outs, start = KVCache(), [], 0
    for t in splits:
        outs.append(llama_block_decode_step(x[:, start:start + t], p, h, cache, **_kwargs(case)))
        start += t
    assert_close(np.concatenate(outs, axis=1), full, what="decoded rows")


def test_the_additions_are_checked_by_name():
    p = _params(8, 2, 2, 4, True, True, seed=7)
    with pytest.raises(ValueError, match="all of .* or none; got only"):
        llama_block_forward(np.ones((3, 8)), {k: v for k, v in p.items() if k != "self_attn.b_k"}, 2)
    with pytest.raises(ValueError, match="both of .* or neither; got only"):
        llama_block_forward(np.ones((3, 8)), {k: v for k, v in p.items() if k != "self_attn.k_norm.weight"}, 2)
    with pytest.raises(ValueError, match=r"params\['self_attn.q_norm.weight'\] must have shape \(4,\)"):
        llama_block_forward(np.ones((3, 8)), {**p, "self_attn.q_norm.weight": np.ones(3)}, 2)
    with pytest.raises(ValueError, match="RoPE type 'yarn' is not implemented"):
        llama_block_forward(np.ones((3, 8)), p, 2, rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="sliding_window"):
        llama_block_forward(np.ones((3, 8)), p, 2, sliding_window=0)
