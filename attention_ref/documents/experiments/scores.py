"""What one head's scores and weights can and cannot do: the variance of ``q . k`` and the
softmax's saturation (002), the convex hull (002), convex combinations, the softmax's
spectrum and rank (001, 003), the least-squares input of 004 section 4.2.

Deterministic (fixed seeds); everything attention-related goes through the library's
own functions. Symbols: N sequence length, D = d_model, H heads, Dk head width, T trials.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..._checks import as_generator
from ...core.attention import scaled_dot_product_attention_forward
from ...core.softmax import softmax_backward, softmax_forward
from ...nn.multi_head_attention import MultiHeadAttention
from .. import printed_values as documents

__all__ = ["DEFAULT_D_KS", "score_variance", "Saturation", "saturation", "hull_scores", "HULL_TIE_TOL", "hull_single_query_search", "hull_vertices", "convex_combination", "softmax_spectrum", "energy_rank", "argmax_spectrum", "low_rank_products", "input_least_squares"]


#: The head widths swept by the variance and saturation experiments.
DEFAULT_D_KS = (1, 4, 16, 64, 256, 1024)


def score_variance(d_k: int, samples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Sample variance of ``q . k`` and of ``q . k / sqrt(d_k)`` for i.i.d. N(0, 1) components.

    Theory (002): ``Var(q . k) = d_k Var(q_l k_l) = d_k`` and ``Var(q . k / sqrt(d_k)) = 1``.
    """
    rng = as_generator(seed)
    q = rng.standard_normal((samples, d_k))  # (T, Dk)
    k = rng.standard_normal((samples, d_k))  # (T, Dk)
    s = np.einsum("td,td->t", q, k)  # (T,)
    return float(s.var()), float((s / math.sqrt(d_k)).var())


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
    rng = as_generator(seed)
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
    rng = as_generator(seed)
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


def convex_combination(n: int = 6, d: int = 3, seed: int = 0) -> dict:
    """One head's weights are >= 0 and sum to 1, so each output row is a convex
    combination of the values: inside their bounding box, and P V recovers it."""
    rng = as_generator(seed)
    q, k, v = rng.standard_normal((n, d)), rng.standard_normal((n, d)), rng.standard_normal((n, d))
    out, cache = scaled_dot_product_attention_forward(q, k, v)
    w = cache.weights  # (N, N)
    return {"min_weight": float(w.min()), "sum_error": float(np.abs(w.sum(axis=-1) - 1).max()),
            "outside_box": float(max((out - v.max(axis=0)).max(), (v.min(axis=0) - out).max())),
            "reconstruction_error": float(np.abs(w @ v - out).max())}


def softmax_spectrum(n: int = 64, d_k: int = 16, scale: float = 1.0, seed: int = 0) -> np.ndarray:
    """Singular values (descending) of ``P = softmax(scale * Q K^T / sqrt(d_k))``
    for random N(0, 1) queries and keys, computed with the library's attention."""
    rng = as_generator(seed)
    q = rng.standard_normal((n, d_k)) * math.sqrt(scale)  # (N, Dk)
    k = rng.standard_normal((n, d_k)) * math.sqrt(scale)  # (N, Dk)
    _, cache = scaled_dot_product_attention_forward(q, k, np.zeros((n, 1)))
    return np.linalg.svd(cache.weights, compute_uv=False)  # (N,)


def energy_rank(singular_values: np.ndarray, fraction: float = 0.9) -> int:
    """Smallest r such that the top r singular values hold ``fraction`` of sum(s^2)."""
    e = np.cumsum(singular_values ** 2) / np.sum(singular_values ** 2)
    return int(np.searchsorted(e, fraction) + 1)


def argmax_spectrum(n: int = 64, d_k: int = 16, seed: int = 0) -> dict:
    """The limit of ``softmax(scale Q K^T / sqrt(d_k))`` as the scale grows: each row
    selects its argmax key. That row-selection matrix has rank = number of distinct argmax
    keys and singular values sqrt(number of queries selecting each key). Same Q, K as
    :func:`attention_ref.documents.experiments.softmax_spectrum` with the same seed."""
    rng = as_generator(seed)
    q = rng.standard_normal((n, d_k))  # (N, Dk)
    k = rng.standard_normal((n, d_k))  # (N, Dk)
    counts = np.bincount((q @ k.T).argmax(axis=1), minlength=n)  # (N,)
    counts = np.sort(counts[counts > 0])[::-1]
    return {"distinct": int(counts.size), "singular_values": np.sqrt(counts)}


def low_rank_products(d_model: int = 16, h: int = 4, seed: int = 0) -> dict:
    """Ranks of the per-head ``W_i^Q (W_i^K)^T`` and of the full ``W^Q (W^K)^T`` for random
    weights: each per-head product has rank at most d_k by construction."""
    layer = MultiHeadAttention(d_model, h, seed=seed, bias=False)
    W_q, W_k = layer.params["W_q"], layer.params["W_k"]
    d_k = d_model // h
    per_head = [int(np.linalg.matrix_rank(W_q[:, i * d_k:(i + 1) * d_k] @ W_k[:, i * d_k:(i + 1) * d_k].T))
                for i in range(h)]
    return {"d_k": d_k, "per_head": per_head, "full": int(np.linalg.matrix_rank(W_q @ W_k.T))}


def input_least_squares() -> dict:
    """Is there an input x' whose products x' W reproduce the printed Q, K, V?

    Jointly for both heads (12 numbers, 3 unknowns) and for head 2 alone (6 numbers).
    Also: adding the column sums of W to x W is the same as using the input x + 1."""
    d = documents.TWO_HEAD
    out = {}
    for name, heads in (("both", (0, 1)), ("head2", (1,)), ("head1", (0,))):
        W = np.hstack([np.array(d[f"W_{m}"][i]) for m in "QKV" for i in heads])  # (3, 6 or 12)
        y = np.concatenate([d[f"printed_{m}"][i] for m in "QKV" for i in heads])
        x, *_ = np.linalg.lstsq(W.T, y, rcond=None)  # x W = y  <=>  W^T x = y
        out[name] = {"x": x, "worst": float(np.abs(x @ W - y).max())}
    x = np.array(d["x"])
    W = np.array(d["W_Q"][0])
    out["bias_is_x_plus_1"] = float(np.abs(x @ W + W.sum(axis=0) - (x + 1) @ W).max())
    return out
