"""Two computations that must agree: separate heads and the parallel form, 001's sum
formula, 004's ``view`` and mask code, permutation equivariance, direct paths, blockwise
and linear attention, RoPE's relative positions, Add & Norm (000-004).

Deterministic (fixed seeds); everything attention-related goes through the library's
own functions. Symbols: N sequence length, D = d_model, H heads, Dk head width, T trials.
"""
from __future__ import annotations

import math

import numpy as np

from ..._checks import as_generator
from ...core.attention import scaled_dot_product_attention_backward, scaled_dot_product_attention_forward
from ...core.multi_head import multi_head_attention_forward
from ...core.separate_heads import multi_head_attention_separate_heads_forward
from ...core.softmax import softmax_forward
from ...nn.multi_head_attention import MultiHeadAttention
from ...nn.residual import add_norm_forward
from ...variants.blockwise import flash_attention_backward, flash_attention_forward
from ...variants.linear_attention import linear_attention_forward
from ...variants.rope import rope_forward

__all__ = ["strategies_max_difference", "sum_formula_difference", "view_004", "mask_convention_004", "permutation_equivariance", "linear_attention_check", "direct_path", "blockwise_and_linear", "rope_relative", "add_norm_statistics"]


def strategies_max_difference(seed: int = 0) -> float:
    """Max |separate heads - weight-split parallel| over outputs, random inputs with a mask."""
    rng = as_generator(seed)
    x = rng.standard_normal((2, 5, 12))  # (B, N, D)
    layer = MultiHeadAttention(12, 3, seed=seed)
    p = {n: w + 0.1 * rng.standard_normal(w.shape) for n, w in layer.params.items()}  # non-zero biases
    mask = np.tri(5, dtype=bool)  # (N, N)
    a, _ = multi_head_attention_forward(x, x, x, p, 3, mask)
    b, _ = multi_head_attention_separate_heads_forward(x, x, x, p, 3, mask)
    return float(np.abs(a - b).max())


def sum_formula_difference(seed: int = 0) -> float:
    """001's sum form, ``sum_i head_i W^O_i`` with ``W^O_i`` the i-th block of rows of
    ``W^O``, against ``Concat(head_1..head_h) W^O``: max absolute difference."""
    rng = as_generator(seed)
    d_model, h = 8, 2
    d_v = d_model // h
    x = rng.standard_normal((5, d_model))  # (N, D)
    p = {n: rng.standard_normal((d_model, d_model)) / 3 for n in ("W_q", "W_k", "W_v", "W_o")}
    out, cache = multi_head_attention_forward(x, x, x, p, h)
    heads = cache.heads  # (H, N, Dv)
    summed = sum(heads[i] @ p["W_o"][i * d_v:(i + 1) * d_v] for i in range(h))  # (N, D)
    return float(np.abs(out - summed).max())


def view_004(n_tokens: int, d_model: int = 3, num_heads: int = 2) -> dict:
    """004's code reshapes the projected (B, N, D) tensor with ``view(B, -1, H, D // H)``.
    NumPy's C-order ``reshape`` is what torch's ``view`` does on a contiguous tensor.
    Entries are labelled ``10 t + f`` (token t, feature f). Returns whether it raises and,
    if not, the token indices that land in each new "position"."""
    head_dim = d_model // num_heads
    x = (10 * np.arange(n_tokens)[:, None] + np.arange(d_model)[None, :])[None].astype(float)  # (1, N, D)
    try:
        y = x.reshape(1, -1, num_heads, head_dim)  # (1, N', H, D // H)
    except ValueError:
        return {"raises": True, "head_dim": head_dim}
    tokens = [sorted({int(v) // 10 for v in row.ravel()}) for row in y[0]]
    return {"raises": False, "head_dim": head_dim, "shape": y.shape, "tokens_per_position": tokens}


def mask_convention_004(seed: int = 0) -> dict:
    """004's code fills ``scores`` with -1e9 where ``mask == 0``: 1 means "may attend", the
    library's boolean convention. Compares its weights with ours for a 0/1 mask that has a
    fully blocked row, and shows what passing a True = blocked mask does."""
    rng = as_generator(seed)
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((4, 4)), rng.standard_normal((4, 2))
    keep = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])  # (Nq, Nk), last query blocked
    scores = q @ k.T / math.sqrt(4)  # (Nq, Nk)
    filled = np.where(keep == 0, -1e9, scores)  # 004's masked_fill(mask == 0, -1e9)
    theirs, _ = softmax_forward(filled)
    _, cache = scaled_dot_product_attention_forward(q, k, v, mask=keep.astype(bool))
    _, inverted = scaled_dot_product_attention_forward(q, k, v, mask=keep == 0)
    return {
        "same_where_allowed": float(np.abs(theirs[:2] - cache.weights[:2]).max()),
        "blocked_row_004": theirs[2],  # uniform 1/4: the -1e9 stand-in attends everywhere
        "blocked_row_ours": cache.weights[2],  # zeros
        "inverted_row0": inverted.weights[0],  # True = blocked read as True = may attend
    }


def permutation_equivariance(seed: int = 0) -> float:
    """Max |MHA(P X) - P MHA(X)| for a random permutation P: without position encodings
    self-attention does not see word order (001 section 4.2)."""
    rng = as_generator(seed)
    x = rng.standard_normal((6, 8))  # (N, D)
    layer = MultiHeadAttention(8, 2, seed=seed)
    perm = rng.permutation(6)
    return float(np.abs(layer.forward(x[perm]) - layer.forward(x)[perm]).max())


def linear_attention_check(n: int = 50, d: int = 8, seed: int = 0) -> dict:
    """003's ``phi(Q) (phi(K)^T V)`` with ``phi = elu + 1``: the regrouping is exact, but
    without dividing row i by ``phi(q_i) . sum_j phi(k_j)`` the implied weights do not sum to 1."""
    rng = as_generator(seed)
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))  # (N, D) each

    def phi(t):
        return np.where(t > 0, t + 1.0, np.exp(np.minimum(t, 0.0)))

    left = (phi(q) @ phi(k).T) @ v  # (N, D): n^2 d work
    right = phi(q) @ (phi(k).T @ v)  # (N, D): n d^2 work
    row_sums = phi(q) @ phi(k).sum(axis=0)  # (N,)
    return {"regrouping_error": float(np.abs(left - right).max()),
            "row_sum_min": float(row_sums.min()), "row_sum_max": float(row_sums.max()),
            "madds_left": n * n * d * 2, "madds_right": n * d * d * 2}


def direct_path(n: int = 16, d: int = 4, seed: int = 0) -> float:
    """|d out_0 / d x_{n-1}| (summed) through one self-attention with q = k = v = x:
    nonzero, so the first and last positions are one layer apart whatever n is."""
    x = as_generator(seed).standard_normal((n, d))  # (N, D)
    out, cache = scaled_dot_product_attention_forward(x, x, x)
    dout = np.zeros_like(out)
    dout[0] = 1.0  # only the first position's output
    dq, dk, dv = scaled_dot_product_attention_backward(dout, cache)
    return float(np.abs((dq + dk + dv)[n - 1]).sum())


def blockwise_and_linear(n: int = 200, d: int = 8, block: int = 32, seed: int = 0) -> dict:
    """Blockwise (flash) attention against exact attention, its cache's largest array,
    its recomputing backward, and linear attention against softmax attention."""
    rng = as_generator(seed)
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))  # (N, D) each
    exact, ecache = scaled_dot_product_attention_forward(q, k, v)
    flash, fcache = flash_attention_forward(q, k, v, block_size=block)
    dout = rng.standard_normal((n, d))  # (N, D)
    g_exact = scaled_dot_product_attention_backward(dout, ecache)
    g_flash = flash_attention_backward(dout, fcache)
    linear, _ = linear_attention_forward(q, k, v)
    arrays = lambda c: [a for a in c if isinstance(a, np.ndarray)]  # noqa: E731
    return {
        "flash_error": float(np.abs(flash - exact).max()),
        "flash_grad_error": float(max(np.abs(a - b).max() for a, b in zip(g_exact, g_flash))),
        "flash_largest": max(a.size for a in arrays(fcache)),
        "flash_cache_bytes": sum(a.nbytes for a in arrays(fcache)),
        "exact_cache_bytes": sum(a.nbytes for a in arrays(ecache)),
        "n": n, "d": d, "block": block,
        "linear_difference": float(np.abs(linear - exact).max()),
    }


def rope_relative(n: int = 8, d: int = 8, seed: int = 0) -> dict:
    """With RoPE, the score of the same query at m and the same key at n depends on m - n
    only (the score matrix is Toeplitz, and not constant); attention with RoPE is no
    longer permutation-equivariant."""
    rng = as_generator(seed)
    q1, k1 = rng.standard_normal(d), rng.standard_normal(d)
    qr, _ = rope_forward(np.tile(q1, (n, 1)), layout="interleaved")  # (N, D)
    kr, _ = rope_forward(np.tile(k1, (n, 1)), layout="interleaved")  # (N, D)
    s = qr @ kr.T  # (N, N)
    toeplitz = max(float(np.abs(np.diag(s, o) - np.diag(s, o)[0]).max()) for o in range(-n + 1, n))
    x = rng.standard_normal((n, d))  # (N, D)
    perm = rng.permutation(n)

    def attend(t):
        r, _ = rope_forward(t, layout="interleaved")
        return scaled_dot_product_attention_forward(r, r, t)[0]
    return {"toeplitz_error": toeplitz, "spread": float(s.max() - s.min()),
            "permuted_difference": float(np.abs(attend(x[perm]) - attend(x)[perm]).max())}


def add_norm_statistics(n: int = 5, d_model: int = 8, h: int = 2, seed: int = 0) -> dict:
    """004 section 3 step 4: LN(x + MHA(x)) with gamma = 1, beta = 0: every row has mean 0
    and variance s^2 / (s^2 + eps), i.e. 1 to within eps / s^2."""
    x = as_generator(seed).standard_normal((n, d_model))  # (N, D)
    s = MultiHeadAttention(d_model, h, seed=seed).forward(x)  # (N, D)
    y, _ = add_norm_forward(x, s, np.ones(d_model), np.zeros(d_model))  # (N, D)
    return {"max_abs_mean": float(np.abs(y.mean(axis=-1)).max()),
            "max_var_error": float(np.abs(y.var(axis=-1) - 1).max())}
