"""Rows of the claims table: parameters and heads, cost and low rank, multi-query
attention, the documents' code listings and masks.

See :mod:`attention_ref.documents.claims` for the verdicts and the rendering.
"""
from __future__ import annotations

import math

import numpy as np

from .. import experiments as ex
from .. import printed_values as docs
from .claim import Claim, _readings, _verdict, fmt, tiny

__all__ = ["parameter_claims", "cost_claims", "listing_and_mask_claims", "other_claims"]


# -------------------------------------------------------------------- parameter count
def parameter_claims() -> list[Claim]:
    """002 and 001 on parameter counts; 001 and 003 on the head width."""
    p, hd = docs.PARAMS, docs.HEAD_DIM
    D = 512
    one, eight = ex.parameter_count(D, 1, bias=False), ex.parameter_count(D, 8, bias=False)
    one_b, eight_b = ex.parameter_count(D, 1, bias=True), ex.parameter_count(D, 8, bias=True)
    sum_diff = ex.sum_formula_difference()
    readings = ex.params_001_readings(D, 8)
    r001, rsplit = readings["001"], readings["split"]
    try:
        np.ones((5, D // 8)) @ np.ones((D, D))  # head_i (n x d_v) times the whole W^O (h d_v x d)
        whole_multiplies = True
    except ValueError:
        whole_multiplies = False
    strategies_diff = ex.strategies_max_difference()
    return [
        Claim("002-params-single", "one head: 4 d_model^2 parameters", str(p["cite"]), p["printed_single"],
              f"{one:,} at d_model=512 (4 d^2 = {4 * D * D:,}); with biases {one_b:,} = 4 d^2 + 4 d",
              _verdict(one == 4 * D * D), "Counted from MultiHeadAttention(512, 1).params; the document"
              " leaves out the biases, which add 4 d_model."),
        Claim("002-params-multi", "h heads with d_k = d_v = d_model / h: still 4 d_model^2", str(p["cite"]),
              p["printed_multi"], f"{eight:,} at h=8; with biases {eight_b:,}",
              _verdict(eight == one and eight_b == one_b)),
        Claim("001-params", "multi-head attention has more parameters than single-head", str(p["cite_001"]),
              "more", f"001's formulas: {r001['single']:,} (3 d^2) vs {r001['multi']:,} (7 d^2);"
              f" split design: {rsplit['single']:,} (h=1) = {rsplit['multi']:,} (h=8), 4 d^2",
              _readings({"001": r001["multi"] > r001["single"], "split": rsplit["multi"] > rsplit["single"]}),
              "d_model=512, h=8, no biases. By 001's own definitions it holds: single-head attention"
              " (section 1) has W^Q, W^K, W^V and no W^O, while multi-head (section 2) projects"
              " Q = X W^Q and then Q_i = Q W_i^Q (each d x d/h) on top, likewise K and V, plus W^O."
              " In the standard design the heads are column blocks of one W^Q (and W^K, W^V), both"
              " layers have W^O, and the count is 4 d^2 whatever h."),
        Claim("001-head-dim", "8 heads: 512 -> 64 dimensions per head", str(hd["cite_001"]),
              fmt(hd["printed_head_dim"]), fmt(hd["d_model"] // hd["h"]),
              _verdict(hd["d_model"] // hd["h"] == hd["printed_head_dim"])),
        Claim("003-head-dim", "each head has width d_k / h", str(hd["cite_003"]), hd["printed_003"],
              f"d_model / h = {hd['d_model'] // hd['h']} (d_model=512, h=8)",
              _readings({"projection width": hd["d_model"] // hd["h"] == hd["printed_head_dim"],
                         "code's d_k": hd["d_model"] // hd["h"] // hd["h"] == hd["printed_head_dim"]}),
              "003 uses d_k for the full projection width (Q in R^{n x d_k}, section 1.1), then its code"
              " sets d_k = d_model // num_heads, the per-head width. Read as the projection width,"
              f" d_k / h = {hd['d_model'] // hd['h']} holds; read as the code's d_k, d_k / h ="
              f" {hd['d_model'] // hd['h'] // hd['h']} would be wrong. We compute d_model / h."),
        Claim("000-strategies", "separate single heads and the weight-split parallel form agree",
              str(docs.PRINTED_VERBAL["strategies"][0]), "same layer",
              f"max |difference| {tiny(strategies_diff)}", _verdict(strategies_diff < 1e-12),
              "multi_head_attention_separate_heads_forward vs multi_head_attention_forward, batch of 2,"
              " 3 heads, causal mask, non-zero biases."),
        Claim("001-sum-formula", "MultiHead = sum_i softmax(Q_i K_i^T / sqrt d_k) V_i W^O",
              str(docs.PRINTED_VERBAL["sum_formula"][0]), "sum over heads", f"max |difference| {tiny(sum_diff)}",
              _readings({"whole W^O": whole_multiplies, "block W^O_i": sum_diff < 1e-12}),
              "As printed, head_i (n x d_v) times the whole W^O (h d_v x d_model) does not multiply."
              " Read W^O inside the sum as its i-th block of d_v rows W^O_i, the sum equals"
              " Concat(head_1..head_h) W^O exactly (the difference shown)."),
    ]


# ---------------------------------------------------------------- cost and low rank
def cost_claims() -> list[Claim]:
    """000, 001, 003 on the quadratic cost; 000 on low rank; 002 on multi-query attention."""
    c = docs.COST
    pairs = {n: ex.attention_pairs(n) for n in c["printed_pairs"]}
    sizes = (32, 64, 128)
    costs = {n: ex.attention_cost(n, 16, 4) for n in sizes}
    weights_ok = all(costs[n]["weights_numbers"] == 4 * n * n for n in sizes)
    spectra = {t: ex.softmax_spectrum(scale=t) for t in (0.1, 1.0, 10.0)}
    limit, hard = ex.argmax_spectrum(), ex.softmax_spectrum(scale=1000.0)
    r_lim = limit["distinct"]
    limit_error = max(float(np.abs(hard[:r_lim] - limit["singular_values"]).max()), float(hard[r_lim:].max()))
    g = ex.growth_exponents()
    fit = lambda a, b: abs(a - b) < 0.05  # noqa: E731  (a fitted slope equals a printed exponent)
    t000, s000 = ex.big_o_exponents(c["printed_time_000"]), ex.big_o_exponents(c["printed_space_000"])
    t003, s003 = ex.big_o_exponents(c["printed_time_003"]), ex.big_o_exponents(c["printed_space_003"])
    t001 = ex.big_o_exponents(c["printed_001"])
    time_ok = lambda e: fit(g["time_n"], e["n"]) and fit(g["time_d"], e["d"])  # noqa: E731
    space_fixed_dk = lambda e: fit(g["space_n"], e["n"]) and fit(g["space_d_fixed_dk"], e["d"])  # noqa: E731
    space_fixed_h = lambda e: fit(g["space_n"], e["n"]) and fit(g["space_d_fixed_h"], e["d"])  # noqa: E731
    slopes = (f"fitted exponents (log-log, N = {', '.join(map(str, g['ns']))}; D = {', '.join(map(str, g['ds']))}):"
              f" work N^{fmt(g['time_n'], 2)} D^{fmt(g['time_d'], 2)}")
    kv = ex.kv_cache_comparison()
    mha, mqa = kv["MHA"], kv["MQA"]
    return [
        Claim("000-pairs", "1,000 tokens: 1 million pairs; 10,000 tokens: 100 million pairs",
              str(c["cite_000"]), ", ".join(f"{v:,}" for v in c["printed_pairs"].values()),
              ", ".join(f"{v:,}" for v in pairs.values()),
              _verdict(pairs == c["printed_pairs"]),
              f"Every query with every key, N^2. With a causal mask only {ex.attention_pairs(1000, True):,}"
              f" and {ex.attention_pairs(10_000, True):,} pairs are needed."),
        Claim("000-time", "time O(N^2 D)", str(c["cite_000"]), c["printed_time_000"],
              f"{slopes}; Q K^T and P V take 2 N^2 D multiply-adds (= {fmt(costs[128]['attention_madds'])}"
              " at N=128, D=16), counted from the weights the cache holds; projections 4 N D^2",
              _verdict(time_ok(t000)),
              "For the attention itself. The whole layer is O(N^2 D + N D^2): the projections dominate"
              " while N < 2 D."),
        Claim("000-space", "space O(N^2 D)", str(c["cite_000"]), c["printed_space_000"],
              "weights held by the cache: " + ", ".join(f"{costs[n]['weights_numbers']:,} = 4 x {n}^2"
                                                        for n in sizes) + " (H=4, D=16); at N="
              f"{g['n_fixed']}, d_k={g['d_k']}, H = D/d_k: " + ", ".join(
                  f"{v:,} at D={d}" for d, v in g["space_fixed_dk"].items())
              + f"; fitted N^{fmt(g['space_n'], 2)}, D^{fmt(g['space_d_fixed_dk'], 2)} (d_k fixed),"
              f" D^{fmt(g['space_d_fixed_h'], 2)} (H={g['h_fixed']} fixed)",
              _readings({"d_k fixed": space_fixed_dk(s000), "H fixed": space_fixed_h(s000)}),
              "Per head the memory is O(N^2) (one N x N weight matrix); the layer holds O(H N^2 + N D)"
              " (all heads' weights, plus Q, K, V). With the head width d_k fixed, H = D / d_k and"
              " H N^2 = N^2 D / d_k, so O(N^2 D) is right (loose by the constant d_k); with H fixed it"
              " overstates by a factor D. An experiment that varies only N cannot tell them apart."),
        Claim("003-cost", "time O(n^2 d), space O(n^2)", str(c["cite_003"]),
              f"{c['printed_time_003']}, {c['printed_space_003']}",
              "as for 000-time and 000-space above (003 section 3.1 describes one head)",
              _verdict(weights_ok and time_ok(t003) and space_fixed_h(s003))),
        Claim("001-cost", "self-attention costs O(n^2)", str(c["cite_001"]), c["printed_001"],
              f"N^2 pairs (000-pairs); fitted work N^{fmt(g['time_n'], 2)}",
              _verdict(fit(g["time_n"], t001["n"]) and t001["d"] == 0),
              "In the sequence length n, for a fixed width."),
        Claim("000-low-rank", "after the softmax the attention matrix is low-rank: a few singular values"
              " carry most of the information", str(docs.PRINTED_VERBAL["low_rank"][0]), "(no number)",
              "singular values for 90% of the energy of a 64 x 64 P (d_k=16): "
              + ", ".join(f"{ex.energy_rank(s)} at score scale {fmt(t)}" for t, s in spectra.items())
              + f"; exact rank {int((spectra[1.0] > 1e-12).sum())}",
              _readings({"exact rank": int((spectra[1.0] > 1e-12).sum()) < 64,
                         "90% energy in at most a quarter": ex.energy_rank(spectra[1.0]) <= 16}),
              "P is generically full rank, so 'low-rank' can only mean a decaying spectrum, and how"
              " fast it decays depends on the score scale: small scores make P close to the rank-one"
              " uniform matrix; large scores make each row select its argmax key, a row-selection"
              f" matrix of rank = number of distinct argmax keys ({r_lim} of 64 here) with singular"
              " values sqrt(number of queries selecting each key) (top: "
              + ", ".join(fmt(v, 3) for v in limit["singular_values"][:3])
              + f"); at score scale 1,000 P is within {limit_error:.0e} of that. See the spectra figure."),
        Claim("002-mqa", "multi-query attention saves inference memory (one key/value head)",
              str(docs.PRINTED_VERBAL["mqa"][0]), "(no number)",
              f"d_model=64, h=8, 16 decoded tokens: params {mha['params']:,} -> {mqa['params']:,};"
              f" KV cache {mha['cache_bytes']:,} -> {mqa['cache_bytes']:,} bytes",
              _verdict(mha["cache_bytes"] == 8 * mqa["cache_bytes"] and mqa["params"] < mha["params"]),
              "The cache shrinks by the factor h (2 h d_k -> 2 d_k numbers per token); parameters"
              " go from 4 d^2 to 2 d^2 + 2 d d_k. The expressiveness cost is not measured here."),
    ]


# ------------------------------------------------------ code, masks, other statements
def listing_and_mask_claims() -> list[Claim]:
    """The rest: 004's shapes and mask code, 000 on heads and windows, 001 and 003 on the
    scale, word order, sparse and linear attention."""
    from ...nn.multi_head_attention import MultiHeadAttention
    d = docs.TWO_HEAD
    c = docs.CODE_AND_MISC
    x = np.array(d["x"])[None, :]  # (1, 3)
    layer = MultiHeadAttention(3, 2, d_k=2, d_v=2, bias=False)
    shape = layer.forward(x).shape
    try:
        MultiHeadAttention(3, 2)
        refused = False
    except ValueError:
        refused = True
    mask = ex.mask_convention_004()
    cost = ex.head_split_cost(32, 16)
    ranks = ex.low_rank_products()
    n, w = 100, 8
    window = ex.window_pairs(n, w)
    causal = ex.window_pairs(1000, 1000)
    var64 = ex.score_variance(64)[0]
    lin = ex.linear_attention_check()
    perm = ex.permutation_equivariance()
    n_sparse = 10_000
    views = {n_tok: ex.view_004(n_tok) for n_tok in (1, 2, 3)}
    n_st = 1024  # strided pattern (local block of sqrt n plus every sqrt n-th key), counted on a mask
    i = np.arange(n_st)
    stride = math.isqrt(n_st)
    strided = int((((i[:, None] // stride) == (i[None, :] // stride)) | (i[None, :] % stride == stride - 1)).sum())
    window_growth = math.log(ex.window_pairs(400, 8) / ex.window_pairs(200, 8), 2)  # exponent in n, w fixed
    return [
        Claim("004-4.2-dims", "d_model=3 with h=2 heads of width 2: W^O maps h d_v = 4 back to 3",
              str(d["cite"]), "h d_v = 4, d_model = 3",
              f"MultiHeadAttention(3, 2, d_k=2, d_v=2) runs, output shape {shape}", _verdict(shape == (1, 3)),
              "h d_k need not equal d_model when the head widths are given explicitly."),
        Claim("004-code-divisible", "the code's head width is d_model // num_heads", str(c["cite_004_code"]),
              "d_model // h", f"d_model=3, h=2: head_dim = 3 // 2 = {3 // 2}; view(B, -1, 2, 1) of a (1, N, 3) tensor:"
              + ";".join(f" N={n_tok} " + ("raises" if v["raises"] else
                                          f"runs, tokens in each new position {v['tokens_per_position']}")
                         for n_tok, v in views.items())
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
              + " compute the head width as d_model // num_heads too."),
        Claim("004-code-mask", "masked_fill(mask == 0, -1e9): 1 = may attend, 0 = blocked",
              str(c["cite_004_code"]), "mask == 0 blocked",
              f"same weights as a boolean True = may attend mask (max |difference|"
              f" {tiny(mask['same_where_allowed'])}); a fully blocked row: -1e9 gives"
              f" {fmt(mask['blocked_row_004'], 2)}, ours {fmt(mask['blocked_row_ours'])}",
              _verdict(mask["same_where_allowed"] < 1e-12),
              "The same convention as this library and PyTorch's scaled_dot_product_attention, the"
              " opposite of nn.MultiheadAttention (True = blocked): passing such a mask inverts it"
              f" (query 1 then attends to keys 3 and 4 only: {fmt(mask['inverted_row0'], 3)}). The -1e9"
              " stand-in makes a query with no allowed key attend uniformly to everything."),
        Claim("000-head-cost", "splitting into low-dimensional heads reduces the computation",
              str(c["cite_000_heads"]), "less computation",
              f"N=32, d_model=16: attention multiply-adds {cost[1]['madds']:,} with 1 head and"
              f" {cost[8]['madds']:,} with 8 ({cost[8]['per_head_madds']:,} per head); weights stored"
              f" {cost[1]['weights']:,} vs {cost[8]['weights']:,}",
              _readings({"per head": cost[8]["per_head_madds"] < cost[1]["madds"],
                         "whole layer": cost[8]["madds"] < cost[1]["madds"]}),
              "True per head (each costs 1/h), false for the layer: the total is unchanged and the"
              " attention weights take h times the memory."),
        Claim("000-low-rank-product", "each head's weights are not low-rank but their concatenated"
              " product is", str(c["cite_000_spec"]), "(no number)",
              f"random weights, d_model=16, h=4: rank of each W_i^Q W_i^K^T = {ranks['per_head']},"
              f" of W^Q W^K^T = {ranks['full']}",
              _readings({"per-head part (rank d_k: full within the head)":
                         all(r == ranks["d_k"] for r in ranks["per_head"]),
                         "product part (rank < d_model for these weights)": ranks["full"] < 16}),
              f"Each per-head product has rank at most d_k = {ranks['d_k']} by construction, so the"
              " sentence is garbled; the published finding it echoes (heads share a common"
              " low-dimensional projection in trained models) needs trained weights to check."),
        Claim("000-window", "local window attention costs O(N W D)", str(c["cite_000_window"]), "O(N W D)",
              f"N={n}, W={w}: {window:,} pairs scored (counted from the weights) = N W - W(W-1)/2"
              f" = {n * w - w * (w - 1) // 2:,}", _verdict(window == n * w - w * (w - 1) // 2),
              "Each query scores at most W keys, each a D-wide dot product."),
        Claim("000-causal", "a decoder position attends only to itself and earlier positions",
              str(c["cite_000_causal"]), "j <= i",
              f"N=1,000 with causal_mask: {causal:,} nonzero weights = N(N+1)/2",
              _verdict(causal == 1000 * 1001 // 2)),
        Claim("001-scale-factor", "the scaling factor is d_k", str(c["cite_001_scale"]), "d_k (as extracted)",
              f"dividing by d_k instead of sqrt(d_k): Var = {fmt(var64 / 64 ** 2, 4)} at d_k=64 (= 1/d_k),"
              f" by sqrt(d_k): {fmt(var64 / 64, 3)}",
              _readings({"d_k as extracted": abs(var64 / 64 ** 2 - 1) < 0.05, "sqrt(d_k)": abs(var64 / 64 - 1) < 0.05}),
              "The page lost its fraction bars and root signs in extraction; we read the factor as"
              " 1/sqrt(d_k), the only one that gives unit variance."),
        Claim("001-order", "self-attention alone ignores word order", str(c["cite_001_order"]),
              "order-insensitive", f"max |MHA(P X) - P MHA(X)| {tiny(perm)} for a random permutation P",
              _verdict(perm < 1e-12),
              "Permuting the tokens permutes the outputs the same way (equivariance), hence the need"
              " for position encodings."),
        Claim("003-sparse", "sparse attention brings the cost down to O(n sqrt n) or O(n log n)",
              str(c["cite_003_sparse"]), "O(n sqrt n), O(n log n)",
              f"n={n_sparse:,}: full {n_sparse ** 2:,} pairs; n sqrt n {n_sparse * math.isqrt(n_sparse):,};"
              f" n log2 n {round(n_sparse * math.log2(n_sparse)):,}; window of 256: {n_sparse * 256:,};"
              f" strided pattern at n={n_st:,} (stride {stride}): {strided:,} pairs ="
              f" {fmt(strided / (n_st * stride), 2)} n sqrt n; a fixed window grows as n^{fmt(window_growth, 2)}",
              _readings({"strided patterns": 1 <= strided / (n_st * stride) <= 3,
                         "the document's examples": abs(window_growth - 1.5) < 0.05}),
              "Both bounds exist for particular schemes (strided patterns; hashing), but the examples"
              " the document gives (a local window, random sampling of a fixed number of keys) are"
              " O(n w), linear in n."),
        Claim("003-linear", "Attention(Q, K, V) ~ phi(Q) (phi(K)^T V)", str(docs.COST["cite_003_linear"]),
              "phi(Q)(phi(K)^T V)",
              f"regrouping exact (max |difference| {tiny(lin['regrouping_error'], 1e-10)}); n^2 d vs n d^2 work:"
              f" {lin['madds_left']:,} vs {lin['madds_right']:,} (n=50, d=8); implied row sums"
              f" {fmt(lin['row_sum_min'], 0)} to {fmt(lin['row_sum_max'], 0)}, not 1",
              _readings({"as printed (no normaliser)":
                         abs(lin["row_sum_min"] - 1) < 1e-9 and abs(lin["row_sum_max"] - 1) < 1e-9,
                         "normaliser implied": lin["regrouping_error"] < 1e-10}),
              "Right up to the normaliser: linear attention divides row i by phi(q_i) . sum_j phi(k_j)"
              " (here phi = elu + 1); the printed formula leaves it out."),
    ]


other_claims = listing_and_mask_claims  # its 0.1 name (attention_ref.claims_design), until 0.3
