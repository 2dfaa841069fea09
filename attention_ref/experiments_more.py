"""More of the documents' checkable claims, computed: the readings of 001's parameter count,
growth exponents of time and memory, the argmax limit of the softmax spectrum, 004's
``view`` on indivisible widths, the least-squares input of 004 section 4.2, and the
statements of 000-004 about paths, blockwise and linear attention, RoPE, convex
combinations, head width and Add & Norm.

Deterministic (fixed seeds, counts from shapes; nothing is timed); everything
attention-related goes through the library's own functions.

Symbols: N sequence length, D = d_model, H heads, Dk head width, T repeats.
"""
from __future__ import annotations

import re

import numpy as np

from . import documents
from .attention import scaled_dot_product_attention_backward, scaled_dot_product_attention_forward
from .blocks import add_norm_forward
from .flash import flash_attention_backward, flash_attention_forward
from .layer import MultiHeadAttention
from .linear_attention import linear_attention_forward
from .rope import rope_forward

__all__ = [
    "params_001_readings", "big_o_exponents", "growth_exponents", "argmax_spectrum", "view_004",
    "input_least_squares", "direct_path", "strategies_work", "blockwise_and_linear",
    "rope_relative", "convex_combination", "head_width_efficiency", "add_norm_statistics",
]


# -------------------------------------------------------------- 001's parameter count
def params_001_readings(d_model: int = 512, h: int = 8) -> dict:
    """Weights of single- and multi-head attention under two readings (no biases).

    ``"001"``: 001's own formulas: single-head (section 1) has W^Q, W^K, W^V and no W^O;
    multi-head (section 2) first computes Q = X W^Q, then Q_i = Q W_i^Q (each D x D/H),
    likewise for K and V, then W^O: 3 D^2 vs 7 D^2. ``"split"``: the standard design,
    the heads are column blocks of W^Q, W^K, W^V, plus W^O: 4 D^2 for any H (counted on
    :class:`MultiHeadAttention`).
    """
    dk = d_model // h
    shapes_single = [(d_model, d_model)] * 3  # W^Q, W^K, W^V
    shapes_multi = [(d_model, d_model)] * 3 + [(d_model, dk)] * (3 * h) + [(d_model, d_model)]  # + W_i, W^O
    count = lambda shapes: sum(a * b for a, b in shapes)  # noqa: E731
    return {
        "001": {"single": count(shapes_single), "multi": count(shapes_multi)},
        "split": {"single": MultiHeadAttention(d_model, 1, bias=False, seed=0).parameter_count(),
                  "multi": MultiHeadAttention(d_model, h, bias=False, seed=0).parameter_count()},
    }


# ------------------------------------------------------------------ growth exponents
def big_o_exponents(printed: str) -> dict:
    """Exponents of n and d in a printed bound: ``"O(N^2 D)" -> {"n": 2, "d": 1}``."""
    body = printed.strip()
    if not (body.startswith("O(") and body.endswith(")")):
        raise ValueError(f"printed must look like O(...), got {printed!r}")
    out = {"n": 0, "d": 0}
    for sym, exp in re.findall(r"([A-Za-z])(?:\^(\d+))?", body[2:-1]):
        if sym.lower() not in out:
            raise ValueError(f"unknown symbol {sym!r} in {printed!r}")
        out[sym.lower()] += int(exp or 1)
    return out


def _slope(xs, ys) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def _attention_counts(n: int, d_model: int, h: int) -> tuple[int, int]:
    """(multiply-adds of Q K^T and P V, numbers in the attention weights) of one forward,
    both read off the weights array the library's cache holds."""
    x = np.random.default_rng(0).standard_normal((n, d_model))  # (N, D)
    layer = MultiHeadAttention(d_model, h, bias=False, seed=0)
    layer.forward(x)
    w = layer.cache.weights  # (H, N, N)
    dk = d_model // h
    return int(w.size * (dk + dk)), int(w.size)


def growth_exponents(ns=(32, 64, 128), ds=(16, 32, 64), n_fixed: int = 64, d_fixed: int = 16,
                     d_k: int = 4, h_fixed: int = 4) -> dict:
    """Fitted log-log slopes of attention work and stored weights against N and D.

    Growing D two ways: keeping the head width ``d_k`` fixed (H = D / d_k grows) and
    keeping H fixed (the head width grows). The work is the same in both (H d_k = D).
    """
    time_n = [_attention_counts(n, d_fixed, d_fixed // d_k)[0] for n in ns]
    space_n = [_attention_counts(n, d_fixed, d_fixed // d_k)[1] for n in ns]
    fixed_dk = [_attention_counts(n_fixed, d, d // d_k) for d in ds]
    fixed_h = [_attention_counts(n_fixed, d, h_fixed) for d in ds]
    return {
        "time_n": _slope(ns, time_n), "time_d": _slope(ds, [c[0] for c in fixed_dk]),
        "time_d_fixed_h": _slope(ds, [c[0] for c in fixed_h]),
        "space_n": _slope(ns, space_n), "space_d_fixed_dk": _slope(ds, [c[1] for c in fixed_dk]),
        "space_d_fixed_h": _slope(ds, [c[1] for c in fixed_h]),
        "space_fixed_dk": {d: c[1] for d, c in zip(ds, fixed_dk)},
        "ns": ns, "ds": ds, "n_fixed": n_fixed, "d_k": d_k, "h_fixed": h_fixed,
    }


# ------------------------------------------------------------------- argmax spectrum
def argmax_spectrum(n: int = 64, d_k: int = 16, seed: int = 0) -> dict:
    """The limit of ``softmax(scale Q K^T / sqrt(d_k))`` as the scale grows: each row
    selects its argmax key. That row-selection matrix has rank = number of distinct argmax
    keys and singular values sqrt(number of queries selecting each key). Same Q, K as
    :func:`attention_ref.experiments.softmax_spectrum` with the same seed."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, d_k))  # (N, Dk)
    k = rng.standard_normal((n, d_k))  # (N, Dk)
    counts = np.bincount((q @ k.T).argmax(axis=1), minlength=n)  # (N,)
    counts = np.sort(counts[counts > 0])[::-1]
    return {"distinct": int(counts.size), "singular_values": np.sqrt(counts)}


# ------------------------------------------------------------------ 004's view on D=3
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


# --------------------------------------------------------- 004 4.2: least-squares input
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


# --------------------------------------------------------------- 000: direct paths
def direct_path(n: int = 16, d: int = 4, seed: int = 0) -> float:
    """|d out_0 / d x_{n-1}| (summed) through one self-attention with q = k = v = x:
    nonzero, so the first and last positions are one layer apart whatever n is."""
    x = np.random.default_rng(seed).standard_normal((n, d))  # (N, D)
    out, cache = scaled_dot_product_attention_forward(x, x, x)
    dout = np.zeros_like(out)
    dout[0] = 1.0  # only the first position's output
    dq, dk, dv = scaled_dot_product_attention_backward(dout, cache)
    return float(np.abs((dq + dk + dv)[n - 1]).sum())


def strategies_work(batch: int = 8, n: int = 32, d_model: int = 64, h: int = 16) -> dict:
    """Arithmetic and matrix-product count of 000's two strategies for one forward.

    Both do the same multiply-adds: per head ``3 N D d_head`` for the projections,
    ``2 N^2 d_head`` for scores and weighted values, then ``N D D`` for ``W^O``. Strategy
    one issues them as ``5 h + 1`` separate products (3 projections and 2 attention
    products per head, then ``W^O``); the parallel form as 6 (3 projections for all heads,
    2 batched attention products, ``W^O``). Counted from the shapes, not timed, so the
    verdict cannot depend on the machine; measured times are in benchmarks/bench_mha.py.
    """
    d_head = d_model // h
    per_head = batch * (3 * n * d_model * d_head + 2 * n * n * d_head)
    madds = h * per_head + batch * n * d_model * d_model
    return {"madds_separate": madds, "madds_parallel": madds,
            "products_separate": 5 * h + 1, "products_parallel": 6,
            "batch": batch, "n": n, "d_model": d_model, "h": h}


# ------------------------------------------------- 000 6.2 / 003 3.2-3.3: blockwise, linear
def blockwise_and_linear(n: int = 200, d: int = 8, block: int = 32, seed: int = 0) -> dict:
    """Blockwise (flash) attention against exact attention, its cache's largest array,
    its recomputing backward, and linear attention against softmax attention."""
    rng = np.random.default_rng(seed)
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


# ------------------------------------------------------------------------ 001 4.2 RoPE
def rope_relative(n: int = 8, d: int = 8, seed: int = 0) -> dict:
    """With RoPE, the score of the same query at m and the same key at n depends on m - n
    only (the score matrix is Toeplitz, and not constant); attention with RoPE is no
    longer permutation-equivariant."""
    rng = np.random.default_rng(seed)
    q1, k1 = rng.standard_normal(d), rng.standard_normal(d)
    qr, _ = rope_forward(np.tile(q1, (n, 1)))  # (N, D)
    kr, _ = rope_forward(np.tile(k1, (n, 1)))  # (N, D)
    s = qr @ kr.T  # (N, N)
    toeplitz = max(float(np.abs(np.diag(s, o) - np.diag(s, o)[0]).max()) for o in range(-n + 1, n))
    x = rng.standard_normal((n, d))  # (N, D)
    perm = rng.permutation(n)

    def attend(t):
        r, _ = rope_forward(t)
        return scaled_dot_product_attention_forward(r, r, t)[0]
    return {"toeplitz_error": toeplitz, "spread": float(s.max() - s.min()),
            "permuted_difference": float(np.abs(attend(x[perm]) - attend(x)[perm]).max())}


# ------------------------------------------------------------- 002: weights and hull
def convex_combination(n: int = 6, d: int = 3, seed: int = 0) -> dict:
    """One head's weights are >= 0 and sum to 1, so each output row is a convex
    combination of the values: inside their bounding box, and P V recovers it."""
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((n, d)), rng.standard_normal((n, d)), rng.standard_normal((n, d))
    out, cache = scaled_dot_product_attention_forward(q, k, v)
    w = cache.weights  # (N, N)
    return {"min_weight": float(w.min()), "sum_error": float(np.abs(w.sum(axis=-1) - 1).max()),
            "outside_box": float(max((out - v.max(axis=0)).max(), (v.min(axis=0) - out).max())),
            "reconstruction_error": float(np.abs(w @ v - out).max())}


def head_width_efficiency(d_model: int = 64, h: int = 8, n: int = 32) -> dict:
    """002's efficiency paragraph: per-head Q, K, V weights of width D/H total 3 D^2;
    the concatenation is H D/H = D wide; the attention work of H split heads equals one
    full-width head, while H heads of full width D would cost H times more."""
    split = MultiHeadAttention(d_model, h, bias=False, seed=0)
    full = MultiHeadAttention(d_model, h, d_k=d_model, d_v=d_model, bias=False, seed=0)
    x = np.random.default_rng(0).standard_normal((n, d_model))  # (N, D)
    madds = {}
    for name, layer, dk in (("split", split, d_model // h), ("full", full, d_model)):
        layer.forward(x)
        madds[name] = int(layer.cache.weights.size * 2 * dk)
    qkv = sum(split.params[w].size for w in ("W_q", "W_k", "W_v"))
    return {"qkv": qkv, "concat_width": h * (d_model // h), "madds_split": madds["split"],
            "madds_full": madds["full"], "madds_one_head": 2 * n * n * d_model}


def add_norm_statistics(n: int = 5, d_model: int = 8, h: int = 2, seed: int = 0) -> dict:
    """004 section 3 step 4: LN(x + MHA(x)) with gamma = 1, beta = 0: every row has mean 0
    and variance s^2 / (s^2 + eps), i.e. 1 to within eps / s^2."""
    x = np.random.default_rng(seed).standard_normal((n, d_model))  # (N, D)
    s = MultiHeadAttention(d_model, h, seed=seed).forward(x)  # (N, D)
    y, _ = add_norm_forward(x, s, np.ones(d_model), np.zeros(d_model))  # (N, D)
    return {"max_abs_mean": float(np.abs(y.mean(axis=-1)).max()),
            "max_var_error": float(np.abs(y.var(axis=-1) - 1).max())}
