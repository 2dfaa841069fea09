"""Rows of the claims table: parameters and heads, cost and low rank, multi-query attention.

One function per claim, named after the row's id (``002-params-single`` is
:func:`claim_002_params_single`): it computes what the row states and returns its Claim. Each
group's tuple lists them in table order. See :mod:`attention_ref.documents.claims` for the
verdicts and the rendering.
"""
from __future__ import annotations

import numpy as np

from .. import experiments as ex
from .. import printed_values as docs
from .claim import Claim, _readings, _verdict, fmt, rows_of, tiny
# defined in .listings_and_masks; also here, where 0.1's claims_design held them (CHANGELOG.md)
from .listings_and_masks import listing_and_mask_claims, other_claims

__all__ = ["parameter_claims", "cost_claims", "PARAMETER_CLAIMS", "COST_CLAIMS", "listing_and_mask_claims",
           "other_claims"]

_D_MODEL = 512  # the width of 002's and 001's parameter counts (h = 8)


# -------------------------------------------------------------------- parameter count
def claim_002_params_single() -> Claim:
    """002: one head has 4 d_model^2 parameters (counted from the layer, with and without biases)."""
    p, D = docs.PARAMS, _D_MODEL
    one, one_b = ex.parameter_count(D, 1, bias=False), ex.parameter_count(D, 1, bias=True)
    return Claim("002-params-single", "one head: 4 d_model^2 parameters", str(p["cite"]), p["printed_single"],
                 f"{one:,} at d_model=512 (4 d^2 = {4 * D * D:,}); with biases {one_b:,} = 4 d^2 + 4 d",
                 _verdict(one == 4 * D * D), "Counted from MultiHeadAttention(512, 1).params; the document"
                 " leaves out the biases, which add 4 d_model.")


def claim_002_params_multi() -> Claim:
    """002: eight heads of width d_model / 8 have as many parameters as one."""
    p, D = docs.PARAMS, _D_MODEL
    one, eight = ex.parameter_count(D, 1, bias=False), ex.parameter_count(D, 8, bias=False)
    one_b, eight_b = ex.parameter_count(D, 1, bias=True), ex.parameter_count(D, 8, bias=True)
    return Claim("002-params-multi", "h heads with d_k = d_v = d_model / h: still 4 d_model^2", str(p["cite"]),
                 p["printed_multi"], f"{eight:,} at h=8; with biases {eight_b:,}",
                 _verdict(eight == one and eight_b == one_b))


def claim_001_params() -> Claim:
    """001: multi-head has more parameters than single-head, by 001's formulas and by the split design."""
    readings = ex.params_001_readings(_D_MODEL, 8)
    r001, rsplit = readings["001"], readings["split"]
    return Claim(
        "001-params", "multi-head attention has more parameters than single-head", str(docs.PARAMS["cite_001"]),
        "more", f"001's formulas: {r001['single']:,} (3 d^2) vs {r001['multi']:,} (7 d^2);"
        f" split design: {rsplit['single']:,} (h=1) = {rsplit['multi']:,} (h=8), 4 d^2",
        _readings({"001": r001["multi"] > r001["single"], "split": rsplit["multi"] > rsplit["single"]}),
        "d_model=512, h=8, no biases. By 001's own definitions it holds: single-head attention"
        " (section 1) has W^Q, W^K, W^V and no W^O, while multi-head (section 2) projects"
        " Q = X W^Q and then Q_i = Q W_i^Q (each d x d/h) on top, likewise K and V, plus W^O."
        " In the standard design the heads are column blocks of one W^Q (and W^K, W^V), both"
        " layers have W^O, and the count is 4 d^2 whatever h.")


def claim_001_head_dim() -> Claim:
    """001: 8 heads of a 512-wide model are 64 wide."""
    hd = docs.HEAD_DIM
    return Claim("001-head-dim", "8 heads: 512 -> 64 dimensions per head", str(hd["cite_001"]),
                 fmt(hd["printed_head_dim"]), fmt(hd["d_model"] // hd["h"]),
                 _verdict(hd["d_model"] // hd["h"] == hd["printed_head_dim"]))


def claim_003_head_dim() -> Claim:
    """003: each head is d_k / h wide, under both of 003's meanings of d_k."""
    hd = docs.HEAD_DIM
    return Claim(
        "003-head-dim", "each head has width d_k / h", str(hd["cite_003"]), hd["printed_003"],
        f"d_model / h = {hd['d_model'] // hd['h']} (d_model=512, h=8)",
        _readings({"projection width": hd["d_model"] // hd["h"] == hd["printed_head_dim"],
                   "code's d_k": hd["d_model"] // hd["h"] // hd["h"] == hd["printed_head_dim"]}),
        "003 uses d_k for the full projection width (Q in R^{n x d_k}, section 1.1), then its code"
        " sets d_k = d_model // num_heads, the per-head width. Read as the projection width,"
        f" d_k / h = {hd['d_model'] // hd['h']} holds; read as the code's d_k, d_k / h ="
        f" {hd['d_model'] // hd['h'] // hd['h']} would be wrong. We compute d_model / h.")


def claim_000_strategies() -> Claim:
    """000: separate single heads and the weight-split parallel form compute the same layer."""
    diff = ex.strategies_max_difference()
    return Claim("000-strategies", "separate single heads and the weight-split parallel form agree",
                 str(docs.PRINTED_VERBAL["strategies"][0]), "same layer",
                 f"max |difference| {tiny(diff)}", _verdict(diff < 1e-12),
                 "multi_head_attention_separate_heads_forward vs multi_head_attention_forward, batch of 2,"
                 " 3 heads, causal mask, non-zero biases.")


def claim_001_sum_formula() -> Claim:
    """001: the sum over heads with the whole W^O (which cannot multiply) or its i-th block (exact)."""
    try:
        np.ones((5, _D_MODEL // 8)) @ np.ones((_D_MODEL, _D_MODEL))  # head_i (n x d_v) times the whole W^O
        whole_multiplies = True
    except ValueError:
        whole_multiplies = False
    diff = ex.sum_formula_difference()
    return Claim(
        "001-sum-formula", "MultiHead = sum_i softmax(Q_i K_i^T / sqrt d_k) V_i W^O",
        str(docs.PRINTED_VERBAL["sum_formula"][0]), "sum over heads", f"max |difference| {tiny(diff)}",
        _readings({"whole W^O": whole_multiplies, "block W^O_i": diff < 1e-12}),
        "As printed, head_i (n x d_v) times the whole W^O (h d_v x d_model) does not multiply."
        " Read W^O inside the sum as its i-th block of d_v rows W^O_i, the sum equals"
        " Concat(head_1..head_h) W^O exactly (the difference shown).")


#: The claim functions of :func:`parameter_claims`, in table order.
PARAMETER_CLAIMS = (claim_002_params_single, claim_002_params_multi, claim_001_params, claim_001_head_dim,
                    claim_003_head_dim, claim_000_strategies, claim_001_sum_formula)


def parameter_claims() -> list[Claim]:
    """002 and 001 on parameter counts; 001 and 003 on the head width."""
    return rows_of(PARAMETER_CLAIMS)


# ---------------------------------------------------------------- cost and low rank
def claim_000_pairs() -> Claim:
    """000: N tokens make N^2 query-key pairs (and N(N+1)/2 with a causal mask)."""
    c = docs.COST
    pairs = {n: ex.attention_pairs(n) for n in c["printed_pairs"]}
    return Claim("000-pairs", "1,000 tokens: 1 million pairs; 10,000 tokens: 100 million pairs",
                 str(c["cite_000"]), ", ".join(f"{v:,}" for v in c["printed_pairs"].values()),
                 ", ".join(f"{v:,}" for v in pairs.values()), _verdict(pairs == c["printed_pairs"]),
                 f"Every query with every key, N^2. With a causal mask only {ex.attention_pairs(1000, True):,}"
                 f" and {ex.attention_pairs(10_000, True):,} pairs are needed.")


_COST_SIZES = (32, 64, 128)  # N of the counted costs (D=16, H=4)


def _fits(slope: float, exponent: float) -> bool:
    """Whether a fitted log-log slope equals a printed exponent."""
    return abs(slope - exponent) < 0.05


def _time_fits(g: dict, printed: str) -> bool:
    """Whether the fitted work exponents in N and D are those of the printed bound."""
    e = ex.big_o_exponents(printed)
    return _fits(g["time_n"], e["n"]) and _fits(g["time_d"], e["d"])


def _space_fits(g: dict, printed: str, fixed: str) -> bool:
    """Whether the fitted memory exponents (head width or head count ``fixed``) are the printed bound's."""
    e = ex.big_o_exponents(printed)
    return _fits(g["space_n"], e["n"]) and _fits(g[f"space_d_fixed_{fixed}"], e["d"])


def claim_000_time() -> Claim:
    """000: the attention's work grows as N^2 D (fitted slopes, and the count from the cache)."""
    c, g, cost = docs.COST, ex.growth_exponents(), ex.attention_cost(128, 16, 4)
    return Claim(
        "000-time", "time O(N^2 D)", str(c["cite_000"]), c["printed_time_000"],
        f"fitted exponents (log-log, N = {', '.join(map(str, g['ns']))}; D = {', '.join(map(str, g['ds']))}):"
        f" work N^{fmt(g['time_n'], 2)} D^{fmt(g['time_d'], 2)}; Q K^T and P V take 2 N^2 D multiply-adds"
        f" (= {fmt(cost['attention_madds'])} at N=128, D=16), counted from the weights the cache holds;"
        " projections 4 N D^2", _verdict(_time_fits(g, c["printed_time_000"])),
        "For the attention itself. The whole layer is O(N^2 D + N D^2): the projections dominate"
        " while N < 2 D.")


def claim_000_space() -> Claim:
    """000: the memory held grows as N^2 D with the head width fixed, as N^2 with the head count fixed."""
    c, g = docs.COST, ex.growth_exponents()
    held = {n: ex.attention_cost(n, 16, 4)["weights_numbers"] for n in _COST_SIZES}
    return Claim(
        "000-space", "space O(N^2 D)", str(c["cite_000"]), c["printed_space_000"],
        "weights held by the cache: " + ", ".join(f"{v:,} = 4 x {n}^2" for n, v in held.items())
        + f" (H=4, D=16); at N={g['n_fixed']}, d_k={g['d_k']}, H = D/d_k: "
        + ", ".join(f"{v:,} at D={d}" for d, v in g["space_fixed_dk"].items())
        + f"; fitted N^{fmt(g['space_n'], 2)}, D^{fmt(g['space_d_fixed_dk'], 2)} (d_k fixed),"
        f" D^{fmt(g['space_d_fixed_h'], 2)} (H={g['h_fixed']} fixed)",
        _readings({"d_k fixed": _space_fits(g, c["printed_space_000"], "dk"),
                   "H fixed": _space_fits(g, c["printed_space_000"], "h")}),
        "Per head the memory is O(N^2) (one N x N weight matrix); the layer holds O(H N^2 + N D)"
        " (all heads' weights, plus Q, K, V). With the head width d_k fixed, H = D / d_k and"
        " H N^2 = N^2 D / d_k, so O(N^2 D) is right (loose by the constant d_k); with H fixed it"
        " overstates by a factor D. An experiment that varies only N cannot tell them apart.")


def claim_003_cost() -> Claim:
    """003: one head's time O(n^2 d) and space O(n^2)."""
    c, g = docs.COST, ex.growth_exponents()
    weights_ok = all(ex.attention_cost(n, 16, 4)["weights_numbers"] == 4 * n * n for n in _COST_SIZES)
    return Claim("003-cost", "time O(n^2 d), space O(n^2)", str(c["cite_003"]),
                 f"{c['printed_time_003']}, {c['printed_space_003']}",
                 "as for 000-time and 000-space above (003 section 3.1 describes one head)",
                 _verdict(weights_ok and _time_fits(g, c["printed_time_003"])
                          and _space_fits(g, c["printed_space_003"], "h")))


def claim_001_cost() -> Claim:
    """001: the work grows as n^2 in the sequence length."""
    c, g = docs.COST, ex.growth_exponents()
    e = ex.big_o_exponents(c["printed_001"])
    return Claim("001-cost", "self-attention costs O(n^2)", str(c["cite_001"]), c["printed_001"],
                 f"N^2 pairs (000-pairs); fitted work N^{fmt(g['time_n'], 2)}",
                 _verdict(_fits(g["time_n"], e["n"]) and e["d"] == 0),
                 "In the sequence length n, for a fixed width.")


def claim_000_low_rank() -> Claim:
    """000: the spectrum of the softmax's P at three score scales, and its argmax limit."""
    spectra = {t: ex.softmax_spectrum(scale=t) for t in (0.1, 1.0, 10.0)}
    limit, hard = ex.argmax_spectrum(), ex.softmax_spectrum(scale=1000.0)
    r_lim = limit["distinct"]
    limit_error = max(float(np.abs(hard[:r_lim] - limit["singular_values"]).max()), float(hard[r_lim:].max()))
    return Claim(
        "000-low-rank", "after the softmax the attention matrix is low-rank: a few singular values"
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
        + f"); at score scale 1,000 P is within {limit_error:.0e} of that. See the spectra figure.")


def claim_002_mqa() -> Claim:
    """002: one key/value head shrinks the cache h times and the parameters to 2 d^2 + 2 d d_k."""
    kv = ex.kv_cache_comparison()
    mha, mqa = kv["MHA"], kv["MQA"]
    return Claim("002-mqa", "multi-query attention saves inference memory (one key/value head)",
                 str(docs.PRINTED_VERBAL["mqa"][0]), "(no number)",
                 f"d_model=64, h=8, 16 decoded tokens: params {mha['params']:,} -> {mqa['params']:,};"
                 f" KV cache {mha['cache_bytes']:,} -> {mqa['cache_bytes']:,} bytes",
                 _verdict(mha["cache_bytes"] == 8 * mqa["cache_bytes"] and mqa["params"] < mha["params"]),
                 "The cache shrinks by the factor h (2 h d_k -> 2 d_k numbers per token); parameters"
                 " go from 4 d^2 to 2 d^2 + 2 d d_k. The expressiveness cost is not measured here.")


#: The claim functions of :func:`cost_claims`, in table order.
COST_CLAIMS = (claim_000_pairs, claim_000_time, claim_000_space, claim_003_cost, claim_001_cost,
               claim_000_low_rank, claim_002_mqa)


def cost_claims() -> list[Claim]:
    """000, 001, 003 on the quadratic cost; 000 on low rank; 002 on multi-query attention."""
    return rows_of(COST_CLAIMS)
