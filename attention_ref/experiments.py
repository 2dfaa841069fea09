"""The documents' checkable claims, computed: variance, saturation, convex hull,
parameter counts, the two implementation strategies, cost, low rank, multi-query.

Each function is deterministic (fixed seeds), fast (well under a second) and returns
plain numbers or small arrays; :mod:`attention_ref.claims` turns them into table rows,
:mod:`attention_ref.plot` into figures. Everything attention-related goes through the
library's own forward/backward functions.

Symbols: N sequence length, D = d_model, H heads, Dk head width, T trials/samples.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import documents
from .attention import scaled_dot_product_attention_forward
from .layer import KVCache, MultiHeadAttention
from .multi_head import multi_head_attention_forward
from .separate_heads import multi_head_attention_separate_heads_forward
from .softmax import softmax_backward, softmax_forward

__all__ = [
    "score_variance", "Saturation", "saturation", "hull_scores", "hull_single_query_search",
    "hull_vertices", "parameter_count", "strategies_max_difference", "sum_formula_difference",
    "attention_pairs", "attention_cost", "softmax_spectrum", "energy_rank", "kv_cache_comparison",
    "mask_convention_004", "permutation_equivariance", "linear_attention_check", "window_pairs",
    "head_split_cost", "low_rank_products", "DEFAULT_D_KS",
]

#: The head widths swept by the variance and saturation experiments.
DEFAULT_D_KS = (1, 4, 16, 64, 256, 1024)


# ----------------------------------------------------------------------------- variance
def score_variance(d_k: int, samples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Sample variance of ``q . k`` and of ``q . k / sqrt(d_k)`` for i.i.d. N(0, 1) components.

    Theory (002): ``Var(q . k) = d_k Var(q_l k_l) = d_k`` and ``Var(q . k / sqrt(d_k)) = 1``.
    """
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((samples, d_k))  # (T, Dk)
    k = rng.standard_normal((samples, d_k))  # (T, Dk)
    s = np.einsum("td,td->t", q, k)  # (T,)
    return float(s.var()), float((s / math.sqrt(d_k)).var())


# --------------------------------------------------------------------------- saturation
class Saturation(NamedTuple):
    """Softmax behaviour over ``n_keys`` random scores, averaged over trials."""

    d_k: int
    max_weight: float      # mean of the largest attention weight (1/n_keys = uniform, 1 = one-hot)
    grad_norm: float       # median Frobenius norm of the softmax Jacobian d weights / d scores
    score_std: float       # standard deviation of the scores fed to the softmax


def saturation(d_k: int, scaled: bool, n_keys: int = 8, trials: int = 500, seed: int = 0) -> Saturation:
    """How peaked the attention weights get, and how small their gradient, at width ``d_k``.

    Queries and keys have i.i.d. N(0, 1) components; the scores are ``q . k`` (unscaled) or
    ``q . k / sqrt(d_k)``. The Jacobian ``J = diag(p) - p p^T`` is built row by row with
    :func:`softmax_backward` (J is symmetric): its norm is how much the weights move when
    the scores move, which is what the gradient flowing to ``q`` and ``k`` is multiplied by.
    """
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((trials, 1, d_k))  # (T, 1, Dk)
    k = rng.standard_normal((trials, n_keys, d_k))  # (T, Nk, Dk)
    scores = (q @ k.swapaxes(-1, -2))[:, 0, :]  # (T, Nk)
    if scaled:
        scores = scores / math.sqrt(d_k)
    p, cache = softmax_forward(scores)  # (T, Nk)
    eye = np.broadcast_to(np.eye(n_keys), (trials, n_keys, n_keys))  # (T, Nk, Nk)
    rows = softmax_backward(eye, cache._replace(y=np.broadcast_to(p[:, None, :], eye.shape), axis=2))
    grad = np.sqrt((rows ** 2).sum(axis=(1, 2)))  # (T,)
    return Saturation(d_k, float(p.max(axis=-1).mean()), float(np.median(grad)), float(scores.std()))


# -------------------------------------------------------------------------- convex hull
def hull_scores(queries) -> np.ndarray:
    """Scores ``q . k_j`` of the four keys of 002 for each query: (T, 2) -> (T, 4)."""
    return np.asarray(queries, dtype=float) @ np.array(documents.HULL["keys"]).T  # (T, 4)


# Two scores of one query closer than this, relative to the query's largest |score|, are a
# tie: whether rounding puts one a few ulps above the other depends on the CPU's sin/cos and
# the NumPy version, so a count of "strictly first" queries must not depend on it.
HULL_TIE_TOL = 1e-9


def _beats(s, j) -> np.ndarray:
    """Per query: does key ``j`` score above every other key by more than a tie? (T, 4) -> (T,)"""
    tie = HULL_TIE_TOL * np.abs(s).max(axis=1)  # (T,)
    return s[:, j] > np.delete(s, j, axis=1).max(axis=1) + tie


def hull_single_query_search(n_directions: int = 3600, n_random: int = 20_000, seed: int = 0) -> dict:
    """Search for a single query that ranks ``k_3 = (5, 5)`` strictly first.

    Tries ``n_directions`` unit queries around the circle and ``n_random`` random queries
    of random length. Returns how often each key is strictly first (by more than a tie,
    :data:`HULL_TIE_TOL`), the largest margin ``s_3 - max(s_1, s_2)`` found (never
    positive: ``s_3`` is the mean of ``s_1`` and ``s_2``; margins within a tie count as 0)
    and the largest deviation from that identity (rounding level).
    """
    rng = np.random.default_rng(seed)
    angles = np.linspace(0.0, 2 * np.pi, n_directions, endpoint=False)
    circle = np.stack([np.cos(angles), np.sin(angles)], axis=1)  # (T, 2)
    random = rng.standard_normal((n_random, 2)) * rng.exponential(3.0, (n_random, 1))  # (T, 2)
    queries = np.concatenate([circle, random])  # (T, 2)
    s = hull_scores(queries)  # (T, 4)
    strictly_first = [int(_beats(s, j).sum()) for j in range(4)]
    margin = s[:, 2] - np.maximum(s[:, 0], s[:, 1])  # (T,)
    margin[np.abs(margin) <= HULL_TIE_TOL * np.abs(s).max(axis=1)] = 0.0  # a tie is a 0 margin
    return {
        "n_queries": len(queries),
        "strictly_first": strictly_first,  # per key k_1..k_4
        "best_margin_k3": float(margin.max()),
        "mean_identity_error": float(np.abs(s[:, 2] - (s[:, 0] + s[:, 1]) / 2).max()),
    }


def hull_vertices(n_directions: int = 3600) -> list[int]:
    """Indices (1-based) of the keys that some direction makes the unique maximiser."""
    angles = np.linspace(0.0, 2 * np.pi, n_directions, endpoint=False)
    s = hull_scores(np.stack([np.cos(angles), np.sin(angles)], axis=1))  # (T, 4)
    return [j + 1 for j in range(4) if _beats(s, j).any()]


# --------------------------------------------------------------------- parameter count
def parameter_count(d_model: int, num_heads: int, *, bias: bool, num_kv_heads: int | None = None) -> int:
    """Scalars in a :class:`MultiHeadAttention` layer with ``d_k = d_v = d_model / H``."""
    layer = MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads, bias=bias, seed=0)
    return layer.parameter_count()


# ------------------------------------------------------------------------- strategies
def strategies_max_difference(seed: int = 0) -> float:
    """Max |separate heads - weight-split parallel| over outputs, random inputs with a mask."""
    rng = np.random.default_rng(seed)
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
    rng = np.random.default_rng(seed)
    d_model, h = 8, 2
    d_v = d_model // h
    x = rng.standard_normal((5, d_model))  # (N, D)
    p = {n: rng.standard_normal((d_model, d_model)) / 3 for n in ("W_q", "W_k", "W_v", "W_o")}
    out, cache = multi_head_attention_forward(x, x, x, p, h)
    heads = cache.heads  # (H, N, Dv)
    summed = sum(heads[i] @ p["W_o"][i * d_v:(i + 1) * d_v] for i in range(h))  # (N, D)
    return float(np.abs(out - summed).max())


# ------------------------------------------------------------------------------ cost
def attention_pairs(n: int, causal: bool = False) -> int:
    """Query-key pairs scored by full (``n^2``) or causal (``n (n + 1) / 2``) attention."""
    return n * (n + 1) // 2 if causal else n * n


def attention_cost(n: int, d_model: int, num_heads: int) -> dict:
    """Multiply-adds and stored numbers of one multi-head self-attention forward.

    Multiply-adds: projections ``4 n D^2``; scores ``Q K^T`` and ``P V`` ``2 n^2 D`` (over
    all heads, since ``H Dk = D``). Memory: the attention weights ``H n^2`` numbers, which
    the library's cache really holds (measured), against ``O(n D)`` for Q, K, V.
    """
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d_model))  # (N, D)
    layer = MultiHeadAttention(d_model, num_heads, seed=0, bias=False)
    layer.forward(x)
    weights = layer.cache.weights  # (H, N, N)
    return {
        "projection_madds": 4 * n * d_model * d_model,
        "attention_madds": 2 * n * n * d_model,
        "weights_numbers": int(weights.size),
        "qkv_numbers": 3 * n * d_model,
    }


# -------------------------------------------------------------------------- low rank
def softmax_spectrum(n: int = 64, d_k: int = 16, scale: float = 1.0, seed: int = 0) -> np.ndarray:
    """Singular values (descending) of ``P = softmax(scale * Q K^T / sqrt(d_k))``
    for random N(0, 1) queries and keys, computed with the library's attention."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, d_k)) * math.sqrt(scale)  # (N, Dk)
    k = rng.standard_normal((n, d_k)) * math.sqrt(scale)  # (N, Dk)
    _, cache = scaled_dot_product_attention_forward(q, k, np.zeros((n, 1)))
    return np.linalg.svd(cache.weights, compute_uv=False)  # (N,)


def energy_rank(singular_values: np.ndarray, fraction: float = 0.9) -> int:
    """Smallest r such that the top r singular values hold ``fraction`` of sum(s^2)."""
    e = np.cumsum(singular_values ** 2) / np.sum(singular_values ** 2)
    return int(np.searchsorted(e, fraction) + 1)


# ------------------------------------------------------------------- multi-query attention
def kv_cache_comparison(d_model: int = 64, num_heads: int = 8, steps: int = 16) -> dict:
    """Parameters and measured key/value cache bytes for MHA, GQA (H/4 kv heads) and MQA,
    decoding ``steps`` tokens with :meth:`MultiHeadAttention.decode_step` (no biases)."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((steps, 1, d_model))  # (T, 1, D)
    out = {}
    for name, hkv in (("MHA", num_heads), ("GQA", max(1, num_heads // 4)), ("MQA", 1)):
        layer = MultiHeadAttention(d_model, num_heads, num_kv_heads=hkv, bias=False, seed=0)
        cache = KVCache()
        for t in range(steps):  # decoding is sequential: one token per step
            layer.decode_step(xs[t], cache)
        out[name] = {"kv_heads": hkv, "params": layer.parameter_count(), "cache_bytes": cache.nbytes}
    return out


# ------------------------------------------------------------------ more of the documents
def mask_convention_004(seed: int = 0) -> dict:
    """004's code fills ``scores`` with -1e9 where ``mask == 0``: 1 means "may attend", the
    library's boolean convention. Compares its weights with ours for a 0/1 mask that has a
    fully blocked row, and shows what passing a True = blocked mask does."""
    rng = np.random.default_rng(seed)
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
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 8))  # (N, D)
    layer = MultiHeadAttention(8, 2, seed=seed)
    perm = rng.permutation(6)
    return float(np.abs(layer.forward(x[perm]) - layer.forward(x)[perm]).max())


def linear_attention_check(n: int = 50, d: int = 8, seed: int = 0) -> dict:
    """003's ``phi(Q) (phi(K)^T V)`` with ``phi = elu + 1``: the regrouping is exact, but
    without dividing row i by ``phi(q_i) . sum_j phi(k_j)`` the implied weights do not sum to 1."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((n, d)) for _ in range(3))  # (N, D) each

    def phi(t):
        return np.where(t > 0, t + 1.0, np.exp(np.minimum(t, 0.0)))

    left = (phi(q) @ phi(k).T) @ v  # (N, D): n^2 d work
    right = phi(q) @ (phi(k).T @ v)  # (N, D): n d^2 work
    row_sums = phi(q) @ phi(k).sum(axis=0)  # (N,)
    return {"regrouping_error": float(np.abs(left - right).max()),
            "row_sum_min": float(row_sums.min()), "row_sum_max": float(row_sums.max()),
            "madds_left": n * n * d * 2, "madds_right": n * d * d * 2}


def window_pairs(n: int, w: int) -> int:
    """Query-key pairs a local (causal) window of ``w`` keys scores: counted from the weights
    the library's attention actually computes with a banded mask. About ``n w``."""
    i = np.arange(n)
    band = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < w)  # (N, N)
    x = np.ones((n, 1))
    _, cache = scaled_dot_product_attention_forward(x, x, x, mask=band)
    return int((cache.weights > 0).sum())


def head_split_cost(n: int, d_model: int, heads=(1, 8)) -> dict:
    """Multiply-adds of the attention core and numbers in the weight tensor for several
    head counts at a fixed ``d_model`` (000 section 2.2)."""
    return {h: {"madds": 2 * n * n * (d_model // h) * h, "per_head_madds": 2 * n * n * (d_model // h),
                "weights": _weights_numbers(n, d_model, h)} for h in heads}


def _weights_numbers(n: int, d_model: int, h: int) -> int:
    """Numbers held in the attention weights of one forward, measured on the library's cache."""
    x = np.random.default_rng(0).standard_normal((n, d_model))  # (N, D)
    layer = MultiHeadAttention(d_model, h, seed=0)
    layer.forward(x)
    return int(layer.cache.weights.size)


def low_rank_products(d_model: int = 16, h: int = 4, seed: int = 0) -> dict:
    """Ranks of the per-head ``W_i^Q (W_i^K)^T`` and of the full ``W^Q (W^K)^T`` for random
    weights: each per-head product has rank at most d_k by construction."""
    layer = MultiHeadAttention(d_model, h, seed=seed, bias=False)
    W_q, W_k = layer.params["W_q"], layer.params["W_k"]
    d_k = d_model // h
    per_head = [int(np.linalg.matrix_rank(W_q[:, i * d_k:(i + 1) * d_k] @ W_k[:, i * d_k:(i + 1) * d_k].T))
                for i in range(h)]
    return {"d_k": d_k, "per_head": per_head, "full": int(np.linalg.matrix_rank(W_q @ W_k.T))}

