"""Rows of the claims table: the documents' code listings and masks, and their other statements
on heads, windows, the scale, word order, sparse and linear attention.

One function per claim, named after the row's id (``004-code-mask`` is
:func:`claim_004_code_mask`): it computes what the row states and returns its Claim. The
group's tuple lists them in table order. See :mod:`attention_ref.documents.claims` for the
verdicts and the rendering.
"""
from __future__ import annotations

import math

import numpy as np

from .. import experiments as ex
from .. import printed_values as docs
from .claim import Claim, _readings, _verdict, fmt, rows_of, tiny

__all__ = ["listing_and_mask_claims", "other_claims", "LISTING_AND_MASK_CLAIMS"]


def claim_004_4_2_dims() -> Claim:
    """004 4.2: a layer with d_model=3 and two heads of width 2 runs and maps back to width 3."""
    from ...nn.multi_head_attention import MultiHeadAttention
    d = docs.TWO_HEAD
    shape = MultiHeadAttention(3, 2, d_k=2, d_v=2, bias=False).forward(np.array(d["x"])[None, :]).shape
    return Claim("004-4.2-dims", "d_model=3 with h=2 heads of width 2: W^O maps h d_v = 4 back to 3",
                 str(d["cite"]), "h d_v = 4, d_model = 3",
                 f"MultiHeadAttention(3, 2, d_k=2, d_v=2) runs, output shape {shape}", _verdict(shape == (1, 3)),
                 "h d_k need not equal d_model when the head widths are given explicitly.")


def claim_004_code_divisible() -> Claim:
    """004's code: head_dim = d_model // h and its view(), on 1, 2 and 3 tokens of the 4.2 example."""
    from ...nn.multi_head_attention import MultiHeadAttention
    try:
        MultiHeadAttention(3, 2)
        refused = False
    except ValueError:
        refused = True
    views = {n_tok: ex.view_004(n_tok) for n_tok in (1, 2, 3)}
    return Claim(
        "004-code-divisible", "the code's head width is d_model // num_heads", str(docs.CODE_AND_MISC["cite_004_code"]),
        "d_model // h", f"d_model=3, h=2: head_dim = 3 // 2 = {3 // 2}; view(B, -1, 2, 1) of a (1, N, 3) tensor:"
        + ";".join(f" N={n_tok} " + ("raises" if v["raises"] else f"runs, tokens in each new position"
                                     f" {v['tokens_per_position']}") for n_tok, v in views.items())
        + f"; MultiHeadAttention(3, 2) {'refuses it (ValueError)' if refused else 'accepts it'}",
        _readings({"h divides d_model": not ex.view_004(1, 4, 2)["raises"],
                   "the document's d_model=3, h=2": not views[1]["raises"]}),
        "Right when h divides d_model. With 004's code on the document's own 4.2 example"
        " (d_model=3, h=2), head_dim = 3 // 2 = 1 and view(B, -1, 2, 1) needs N x 3 to be even:"
        " for odd N (including the example's N=1) it raises; for even N it runs and a new"
        " 'position' mixes features of two neighbouring tokens (checked with NumPy's reshape,"
        " which matches torch's view on a contiguous tensor). This library refuses the"
        " combination unless d_k and d_v are given. The listings of "
        + " and ".join(str(c) for c in docs.MORE["cite_divisible"])
        + " compute the head width as d_model // num_heads too.")


def claim_004_code_mask() -> Claim:
    """004's code: masked_fill(mask == 0, -1e9) against a boolean mask, a fully blocked row, an inverted mask."""
    mask = ex.mask_convention_004()
    return Claim(
        "004-code-mask", "masked_fill(mask == 0, -1e9): 1 = may attend, 0 = blocked",
        str(docs.CODE_AND_MISC["cite_004_code"]), "mask == 0 blocked",
        f"same weights as a boolean True = may attend mask (max |difference|"
        f" {tiny(mask['same_where_allowed'])}); a fully blocked row: -1e9 gives"
        f" {fmt(mask['blocked_row_004'], 2)}, ours {fmt(mask['blocked_row_ours'])}",
        _verdict(mask["same_where_allowed"] < 1e-12),
        "The same convention as this library and PyTorch's scaled_dot_product_attention, the"
        " opposite of nn.MultiheadAttention (True = blocked): passing such a mask inverts it"
        f" (query 1 then attends to keys 3 and 4 only: {fmt(mask['inverted_row0'], 3)}). The -1e9"
        " stand-in makes a query with no allowed key attend uniformly to everything.")


def claim_000_head_cost() -> Claim:
    """000: the attention's multiply-adds and stored weights with 1 head and with 8."""
    cost = ex.head_split_cost(32, 16)
    return Claim(
        "000-head-cost", "splitting into low-dimensional heads reduces the computation",
        str(docs.CODE_AND_MISC["cite_000_heads"]), "less computation",
        f"N=32, d_model=16: attention multiply-adds {cost[1]['madds']:,} with 1 head and"
        f" {cost[8]['madds']:,} with 8 ({cost[8]['per_head_madds']:,} per head); weights stored"
        f" {cost[1]['weights']:,} vs {cost[8]['weights']:,}",
        _readings({"per head": cost[8]["per_head_madds"] < cost[1]["madds"],
                   "whole layer": cost[8]["madds"] < cost[1]["madds"]}),
        "True per head (each costs 1/h), false for the layer: the total is unchanged and the"
        " attention weights take h times the memory.")


def claim_000_low_rank_product() -> Claim:
    """000: the rank of each head's W_i^Q W_i^K^T and of the whole W^Q W^K^T."""
    ranks = ex.low_rank_products()
    return Claim(
        "000-low-rank-product", "each head's weights are not low-rank but their concatenated"
        " product is", str(docs.CODE_AND_MISC["cite_000_spec"]), "(no number)",
        f"random weights, d_model=16, h=4: rank of each W_i^Q W_i^K^T = {ranks['per_head']},"
        f" of W^Q W^K^T = {ranks['full']}",
        _readings({"per-head part (rank d_k: full within the head)": all(r == ranks["d_k"] for r in ranks["per_head"]),
                   "product part (rank < d_model for these weights)": ranks["full"] < 16}),
        f"Each per-head product has rank at most d_k = {ranks['d_k']} by construction, so the"
        " sentence is garbled; the published finding it echoes (heads share a common"
        " low-dimensional projection in trained models) needs trained weights to check.")


def claim_000_window() -> Claim:
    """000: a window of W keys scores N W - W(W-1)/2 pairs (counted from the weights)."""
    n, w = 100, 8
    window = ex.window_pairs(n, w)
    return Claim("000-window", "local window attention costs O(N W D)", str(docs.CODE_AND_MISC["cite_000_window"]),
                 "O(N W D)", f"N={n}, W={w}: {window:,} pairs scored (counted from the weights) = N W - W(W-1)/2"
                 f" = {n * w - w * (w - 1) // 2:,}", _verdict(window == n * w - w * (w - 1) // 2),
                 "Each query scores at most W keys, each a D-wide dot product.")


def claim_000_causal() -> Claim:
    """000: a causal mask leaves N(N+1)/2 nonzero weights."""
    causal = ex.window_pairs(1000, 1000)
    return Claim("000-causal", "a decoder position attends only to itself and earlier positions",
                 str(docs.CODE_AND_MISC["cite_000_causal"]), "j <= i",
                 f"N=1,000 with causal_mask: {causal:,} nonzero weights = N(N+1)/2",
                 _verdict(causal == 1000 * 1001 // 2))


def claim_001_scale_factor() -> Claim:
    """001: the variance of the scores divided by d_k and by sqrt(d_k), at d_k=64."""
    var64 = ex.score_variance(64)[0]
    return Claim(
        "001-scale-factor", "the scaling factor is d_k", str(docs.CODE_AND_MISC["cite_001_scale"]),
        "d_k (as extracted)",
        f"dividing by d_k instead of sqrt(d_k): Var = {fmt(var64 / 64 ** 2, 4)} at d_k=64 (= 1/d_k),"
        f" by sqrt(d_k): {fmt(var64 / 64, 3)}",
        _readings({"d_k as extracted": abs(var64 / 64 ** 2 - 1) < 0.05, "sqrt(d_k)": abs(var64 / 64 - 1) < 0.05}),
        "The page lost its fraction bars and root signs in extraction; we read the factor as"
        " 1/sqrt(d_k), the only one that gives unit variance.")


def claim_001_order() -> Claim:
    """001: permuting the tokens permutes the outputs (no positions)."""
    perm = ex.permutation_equivariance()
    return Claim("001-order", "self-attention alone ignores word order", str(docs.CODE_AND_MISC["cite_001_order"]),
                 "order-insensitive", f"max |MHA(P X) - P MHA(X)| {tiny(perm)} for a random permutation P",
                 _verdict(perm < 1e-12),
                 "Permuting the tokens permutes the outputs the same way (equivariance), hence the need"
                 " for position encodings.")


def _strided_pairs(n: int) -> int:
    """Pairs a strided pattern scores (a local block of sqrt n plus every sqrt n-th key), counted on its mask."""
    i, stride = np.arange(n), math.isqrt(n)
    return int((((i[:, None] // stride) == (i[None, :] // stride)) | (i[None, :] % stride == stride - 1)).sum())


def claim_003_sparse() -> Claim:
    """003: pairs scored by full, strided and windowed attention, and how a fixed window grows with n."""
    n, n_st = 10_000, 1024
    stride, strided = math.isqrt(n_st), _strided_pairs(n_st)
    window_growth = math.log(ex.window_pairs(400, 8) / ex.window_pairs(200, 8), 2)  # exponent in n, w fixed
    return Claim(
        "003-sparse", "sparse attention brings the cost down to O(n sqrt n) or O(n log n)",
        str(docs.CODE_AND_MISC["cite_003_sparse"]), "O(n sqrt n), O(n log n)",
        f"n={n:,}: full {n ** 2:,} pairs; n sqrt n {n * math.isqrt(n):,}; n log2 n {round(n * math.log2(n)):,};"
        f" window of 256: {n * 256:,}; strided pattern at n={n_st:,} (stride {stride}): {strided:,} pairs ="
        f" {fmt(strided / (n_st * stride), 2)} n sqrt n; a fixed window grows as n^{fmt(window_growth, 2)}",
        _readings({"strided patterns": 1 <= strided / (n_st * stride) <= 3,
                   "the document's examples": abs(window_growth - 1.5) < 0.05}),
        "Both bounds exist for particular schemes (strided patterns; hashing), but the examples"
        " the document gives (a local window, random sampling of a fixed number of keys) are"
        " O(n w), linear in n.")


def claim_003_linear() -> Claim:
    """003: phi(Q) (phi(K)^T V) regroups exactly, costs less, and lacks the normaliser."""
    lin = ex.linear_attention_check()
    return Claim(
        "003-linear", "Attention(Q, K, V) ~ phi(Q) (phi(K)^T V)", str(docs.COST["cite_003_linear"]),
        "phi(Q)(phi(K)^T V)",
        f"regrouping exact (max |difference| {tiny(lin['regrouping_error'], 1e-10)}); n^2 d vs n d^2 work:"
        f" {lin['madds_left']:,} vs {lin['madds_right']:,} (n=50, d=8); implied row sums"
        f" {fmt(lin['row_sum_min'], 0)} to {fmt(lin['row_sum_max'], 0)}, not 1",
        _readings({"as printed (no normaliser)":
                   abs(lin["row_sum_min"] - 1) < 1e-9 and abs(lin["row_sum_max"] - 1) < 1e-9,
                   "normaliser implied": lin["regrouping_error"] < 1e-10}),
        "Right up to the normaliser: linear attention divides row i by phi(q_i) . sum_j phi(k_j)"
        " (here phi = elu + 1); the printed formula leaves it out.")


#: The claim functions of :func:`listing_and_mask_claims`, in table order.
LISTING_AND_MASK_CLAIMS = (claim_004_4_2_dims, claim_004_code_divisible, claim_004_code_mask, claim_000_head_cost,
                           claim_000_low_rank_product, claim_000_window, claim_000_causal, claim_001_scale_factor,
                           claim_001_order, claim_003_sparse, claim_003_linear)


def listing_and_mask_claims() -> list[Claim]:
    """The rest: 004's shapes and mask code, 000 on heads and windows, 001 and 003 on the
    scale, word order, sparse and linear attention."""
    return rows_of(LISTING_AND_MASK_CLAIMS)


other_claims = listing_and_mask_claims  # its 0.1 name (attention_ref.claims_design; CHANGELOG.md says where it went)
