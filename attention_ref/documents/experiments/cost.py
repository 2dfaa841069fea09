"""What attention costs: parameter counts and their readings (001, 002), multiply-adds and
stored numbers, growth exponents, separate heads against the parallel form, head width,
local windows and multi-query attention (000-003). Counts from shapes; nothing is timed.

Deterministic (fixed seeds); everything attention-related goes through the library's
own functions. Symbols: N sequence length, D = d_model, H heads, Dk head width, T trials.
"""
from __future__ import annotations

import re

import numpy as np

from ...core.attention import scaled_dot_product_attention_forward
from ...nn.multi_head_attention import KVCache, MultiHeadAttention

__all__ = ["parameter_count", "params_001_readings", "attention_pairs", "attention_cost", "big_o_exponents", "growth_exponents", "strategies_work", "head_width_efficiency", "window_pairs", "head_split_cost", "kv_cache_comparison"]


def parameter_count(d_model: int, num_heads: int, *, bias: bool, num_kv_heads: int | None = None) -> int:
    """Scalars in a :class:`MultiHeadAttention` layer with ``d_k = d_v = d_model / H``."""
    layer = MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads, bias=bias, seed=0)
    return layer.parameter_count()


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
