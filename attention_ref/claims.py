"""Every checkable claim of the five documents, recomputed, as rows of one table.

Each row: the claim (paraphrased), where it is printed (document file and section), the
document's value, our computed value, and a verdict:

* **holds**: our computation agrees with the document;
* **wrong**: it does not; the note gives the correct value and how the mistake arises;
* **ambiguous**: the document can be read more than one way (a matrix whose printed
  shape cannot multiply, a symbol used with two meanings); the note says which reading
  we compute and why, and shows the other where both are defensible.

Every computed value comes from :mod:`attention_ref.worked_examples` and
:mod:`attention_ref.experiments` (the library's own functions); ``tests/test_claims.py``
re-derives the numbers independently and checks that ``docs/claims.md`` equals
:func:`render_markdown`. Regenerate the file with ``python examples/claims.py --write``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import documents as docs
from . import experiments as ex
from .worked_examples import single_token_example, two_head_example

__all__ = ["Claim", "VERDICTS", "all_claims", "claim_groups", "render_markdown", "render_text", "fmt", "tiny"]

VERDICTS = ("holds", "wrong", "ambiguous")


class Claim(NamedTuple):
    """One row of the claims table."""

    id: str
    claim: str
    source: str      # "004 4.2 (multi-head attention)": document number and section
    printed: str     # the document's value, as printed
    computed: str    # ours
    verdict: str     # one of VERDICTS
    note: str = ""   # interpretation chosen, or the correct value and how the mistake arises


def fmt(value, digits: int = 4) -> str:
    """A number or vector rounded to ``digits`` decimals, without trailing zeros."""
    a = np.asarray(value, dtype=float)
    if a.ndim == 0:
        v = round(float(a), digits)
        return f"{v:,.{digits}f}".rstrip("0").rstrip(".") if v != int(v) else f"{int(v):,}"
    return "[" + ", ".join(fmt(v, digits) for v in a.ravel()) + "]"


def _close(a, b, tol=1e-9) -> bool:
    return bool(np.allclose(np.asarray(a, float), np.asarray(b, float), atol=tol, rtol=0))


def tiny(x: float, bound: float = 1e-12) -> str:
    """``"< 1e-12"`` for a rounding-level number (machine-independent text), else the value."""
    return f"< {bound:.0e}" if abs(x) < bound else f"{x:.1e}"


def _verdict(ok: bool) -> str:
    return "holds" if ok else "wrong"


# ------------------------------------------------------------------- worked examples
def worked_example_claims() -> list[Claim]:
    """004 sections 4.1 and 4.2."""
    d1, r1 = docs.SINGLE_TOKEN, single_token_example()
    src1 = str(d1["cite"])
    rows = [
        Claim("004-4.1-score", "score = q.k / sqrt(3) for q=[0.1,0.2,0.3], k=[0.4,0.5,0.6]", src1,
              fmt(d1["printed_score"]), fmt(r1.score), _verdict(_close(r1.score, d1["printed_score"], 5e-5)),
              f"q.k = 0.04 + 0.10 + 0.18 = {fmt(r1.dot)}, and {fmt(r1.dot)} / 1.7321 = {fmt(r1.score)}."
              f" The printed 0.2598 is 0.45 / sqrt(3): the numerator is wrong, the rest of the"
              f" example does not depend on it."),
        Claim("004-4.1-alpha", "alpha = softmax(score) = 1 (one key)", src1, fmt(d1["printed_alpha"]),
              fmt(r1.alpha), _verdict(_close(r1.alpha, d1["printed_alpha"])),
              "A softmax over a single score is exactly 1 whatever the score, so the wrong score is harmless."),
        Claim("004-4.1-output", "output = alpha v", src1, fmt(d1["printed_output"]), fmt(r1.output),
              _verdict(_close(r1.output, d1["printed_output"]))),
    ]
    d, r = docs.TWO_HEAD, two_head_example()
    src = str(d["cite"])
    for name, key, ours in (("Q", "printed_Q", r.Q), ("K", "printed_K", r.K), ("V", "printed_V", r.V)):
        for i in range(d["h"]):
            W = np.array(d[f"W_{name}"][i])
            terms = " + ".join(f"{fmt(xj)}*{fmt(w)}" for xj, w in zip(d["x"], W[:, 0]))
            ok = _close(ours[i], d[key][i])
            rows.append(Claim(
                f"004-4.2-{name}{i + 1}", f"{name}_{i + 1} = x W_{i + 1}^{name}", src, fmt(d[key][i]),
                fmt(ours[i]), _verdict(ok),
                "" if ok else f"First entry: {terms} = {fmt(ours[i][0, 0])}. Printed minus ours:"
                f" {fmt(np.subtract(d[key][i], ours[i][0]))}. Not a misread matrix: the block refilled"
                f" as 2 x 3 gives x W' = {fmt(np.array(d['x']) @ W.reshape(2, 3).T)}, with column-sum"
                f" biases {fmt(ours[i][0] + W.sum(axis=0))}; neither matches."))
    for i in range(d["h"]):
        ok = _close(r.heads[i], d["printed_head"][i])
        rows.append(Claim(
            f"004-4.2-head{i + 1}", f"head_{i + 1} = softmax(Q_{i + 1} K_{i + 1}^T / sqrt 2) V_{i + 1}", src,
            fmt(d["printed_head"][i]), fmt(r.heads[i]), _verdict(ok),
            f"One token, so the weight is exactly 1 (score {fmt(float(r.scores[i][0, 0]))}) and head_{i + 1} = V_{i + 1}."
            f" Even by the document's own numbers head_{i + 1} should equal its printed"
            f" V_{i + 1} = {fmt(d['printed_V'][i])}: a second, independent slip."))
    rows.append(Claim(
        "004-4.2-concat", "Concat(head_1, head_2)", src, fmt(d["printed_concat"]), fmt(r.concat),
        _verdict(_close(r.concat, d["printed_concat"])),
        "The concatenation itself is done right; it inherits the wrong heads."))
    printed_WO = np.array(d["W_O_as_printed"])
    rows.append(Claim(
        "004-4.2-WO-shape", "W^O in R^{h d_v x d_model} multiplies the 1 x 4 concatenation", src,
        f"typeset {printed_WO.shape[0]} x {printed_WO.shape[1]}; declared {d['W_O_declared_shape'][0]} x"
        f" {d['W_O_declared_shape'][1]}", f"needs {r.concat.shape[1]} x {d['d_model']}", "ambiguous",
        "A 1 x 4 row times a 3 x 4 matrix is undefined. We use the transpose of the typeset matrix:"
        " it has the declared shape h d_v x d_model = 4 x 3 and equals the column-vector reading"
        " W^O concat. The other defensible reading refills the 12 numbers row by row into 4 x 3."))
    rows.append(Claim(
        "004-4.2-output", "MultiHead = Concat(head_1, head_2) W^O", src, fmt(d["printed_output"]),
        fmt(r.output), "wrong",
        f"With W^O transposed (our reading): {fmt(r.output)}; refilled row by row: {fmt(r.output_row_major)};"
        f" even the printed concatenation times W^O^T gives {fmt(r.output_from_printed_concat)}."
        " No reading reproduces the printed value. The whole layer through"
        f" multi_head_attention_forward gives {fmt(r.layer_output)}."))
    return rows


# ----------------------------------------------------------------- scale and saturation
def scaling_claims() -> list[Claim]:
    """002, 'why scaling matters': variance and softmax saturation."""
    src, _ = docs.PRINTED_VERBAL["variance"]
    src = str(src)
    d_ks = (4, 64, 256)
    var = {d_k: ex.score_variance(d_k) for d_k in d_ks}
    raw_ok = all(abs(var[d][0] / d - 1) < 0.05 for d in d_ks)
    scaled_ok = all(abs(var[d][1] - 1) < 0.05 for d in d_ks)
    sat = {(d_k, s): ex.saturation(d_k, s) for d_k in (1, 64, 1024) for s in (False, True)}
    sat_ok = (sat[(1024, False)].max_weight > 0.95 and sat[(1024, False)].grad_norm < 1e-4
              and all(0.25 < sat[(d, True)].max_weight < 0.45 for d in (1, 64, 1024)))
    return [
        Claim("002-var", "Var(q.k) = d_k for i.i.d. zero-mean unit-variance components", src, "d_k",
              ", ".join(f"{fmt(var[d][0], 1)} at d_k={d}" for d in d_ks), _verdict(raw_ok),
              "10,000 samples per d_k, N(0,1) components. Exact: Var(q_l k_l) = E[q_l^2] E[k_l^2] = 1"
              " needs q and k independent (for k = q it is 2)."),
        Claim("002-var-scaled", "Var(q.k / sqrt(d_k)) = 1", src, "1",
              ", ".join(f"{fmt(var[d][1], 3)} at d_k={d}" for d in d_ks), _verdict(scaled_ok)),
        Claim("002-saturation", "unscaled, large d_k saturates the softmax and its gradient vanishes;"
              " the scale prevents it", str(docs.PRINTED_VERBAL["saturation"][0]), "(no number)",
              "largest weight (8 keys) unscaled "
              + " / ".join(fmt(sat[(d, False)].max_weight, 3) for d in (1, 64, 1024))
              + ", scaled " + " / ".join(fmt(sat[(d, True)].max_weight, 3) for d in (1, 64, 1024))
              + " at d_k = 1 / 64 / 1024; median |J| unscaled "
              + " / ".join(f"{sat[(d, False)].grad_norm:.1e}" for d in (1, 64, 1024))
              + ", scaled " + " / ".join(f"{sat[(d, True)].grad_norm:.2f}" for d in (1, 64, 1024)),
              _verdict(sat_ok),
              "|J| is the Frobenius norm of the softmax Jacobian d weights / d scores, built with"
              " softmax_backward: it multiplies every gradient reaching q and k."),
    ]


# ------------------------------------------------------------------------ convex hull
def hull_claims() -> list[Claim]:
    """002, the convex-hull thought experiment and what two heads change."""
    d = docs.HULL
    src, src_h = str(d["cite"]), str(d["cite_heads"])
    keys = np.array(d["keys"])
    mins = keys.min(axis=1)
    search = ex.hull_single_query_search()
    vertices = ex.hull_vertices()
    s1, s2 = (ex.hull_scores([q])[0] for q in d["head_queries"])
    best_of_min = int(np.argmax(np.minimum(s1, s2))) + 1
    from .softmax import softmax_forward
    share3 = float(softmax_forward(s1)[0][2])  # token 3's weight inside head 1
    n = search["n_queries"]
    return [
        Claim("002-hull-min", "min{k_1, k_2} of each key; k_3 = (5, 5) is the balanced winner", src,
              fmt(d["printed_min"]), fmt(mins),
              _verdict(_close(mins, d["printed_min"]) and int(np.argmax(mins)) + 1 == d["printed_winner"])),
        Claim("002-hull-mean", "k_3 = (k_1 + k_2) / 2, so q.k_3 is always the mean of q.k_1 and q.k_2", src,
              "identity", f"max deviation {tiny(search['mean_identity_error'], 1e-9)} over {n:,} queries",
              _verdict(search["mean_identity_error"] < 1e-9 and _close(keys[2], (keys[0] + keys[1]) / 2))),
        Claim("002-hull-single", "no single query ranks k_3 strictly first", src, "never",
              f"k_3 strictly first for {search['strictly_first'][2]} of {n:,} queries; best margin"
              f" s_3 - max(s_1, s_2) = {fmt(search['best_margin_k3'])}",
              _verdict(search["strictly_first"][2] == 0 and search["best_margin_k3"] <= 0),
              "At best k_3 ties with k_1 and k_2 (q along (1, 1)); the softmax then splits the weight"
              " three ways."),
        Claim("002-hull-geometry", "a single query can only pick out vertices of the keys' convex hull,"
              " never an interior point like k_3", src, "k_3 interior",
              f"hull vertices: {', '.join(f'k_{v}' for v in vertices)}; k_3 lies on the edge k_1-k_2;"
              f" k_4 = (2, 2) is strictly first for {search['strictly_first'][3]:,} queries", "ambiguous",
              "The conclusion holds; the geometry is loosely worded. k_3 is not interior: it is on the"
              " hull's boundary, between the vertices k_1 and k_2, which is why it can only tie. k_4,"
              " which looks 'inside', is a vertex and wins for queries such as (-1, -1)."),
        Claim("002-hull-heads", "head 1 with q=(1,0) and head 2 with q=(0,1): token 3 scores (5, 5),"
              " token 1 (10, 0)", src_h,
              f"{fmt(d['printed_token3_scores'])}, {fmt(d['printed_token1_scores'])}",
              f"{fmt([s1[2], s2[2]])}, {fmt([s1[0], s2[0]])}",
              _verdict(_close([s1[2], s2[2]], d["printed_token3_scores"])
                       and _close([s1[0], s2[0]], d["printed_token1_scores"]))),
        Claim("002-hull-heads-limit", "with two heads a later layer can prefer the balanced token", src_h,
              "(no number)", f"argmax_j min(s1_j, s2_j) = k_{best_of_min}; each head alone still ranks"
              f" k_{int(np.argmax(s1)) + 1} / k_{int(np.argmax(s2)) + 1} first",
              _verdict(best_of_min == 3),
              "Only through a nonlinearity: any weighted sum a s1 + b s2 is the score of the single query"
              " (a, b), so W^O or any linear layer still cannot rank k_3 first. The heads supply the"
              " two coordinates; a nonlinear layer (e.g. min, or a ReLU network) must combine them."
              f" Also, a head passes on weighted values, not scores: inside head 1 token 3 gets only"
              f" {share3:.2%} of the weight."),
    ]


# -------------------------------------------------------------------- parameter count
def parameter_claims() -> list[Claim]:
    """002 and 001 on parameter counts; 001 and 003 on the head width."""
    p, hd = docs.PARAMS, docs.HEAD_DIM
    D = 512
    one, eight = ex.parameter_count(D, 1, bias=False), ex.parameter_count(D, 8, bias=False)
    one_b, eight_b = ex.parameter_count(D, 1, bias=True), ex.parameter_count(D, 8, bias=True)
    sum_diff = ex.sum_formula_difference()
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
              "more", f"{eight:,} (h=8) = {one:,} (h=1)", _verdict(eight > one),
              "The per-head projections are column blocks of the same d_model x d_model matrices, so"
              " the count does not depend on h (when d_k = d_model / h)."),
        Claim("001-head-dim", "8 heads: 512 -> 64 dimensions per head", str(hd["cite_001"]),
              fmt(hd["printed_head_dim"]), fmt(hd["d_model"] // hd["h"]),
              _verdict(hd["d_model"] // hd["h"] == hd["printed_head_dim"])),
        Claim("003-head-dim", "each head has width d_k / h", str(hd["cite_003"]), hd["printed_003"],
              f"d_model / h = {hd['d_model'] // hd['h']} (d_model=512, h=8)", "ambiguous",
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
              "ambiguous",
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
    spectra = {t: ex.softmax_spectrum(temperature=t) for t in (0.1, 1.0, 10.0)}
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
              f"Q K^T and P V: 2 N^2 D multiply-adds (= {fmt(costs[128]['attention_madds'])} at N=128,"
              " D=16); projections 4 N D^2", "holds",
              "For the attention itself. The whole layer is O(N^2 D + N D^2): the projections dominate"
              " while N < 2 D."),
        Claim("000-space", "space O(N^2 D)", str(c["cite_000"]), c["printed_space_000"],
              "weights held by the cache: " + ", ".join(f"{costs[n]['weights_numbers']:,} = 4 x {n}^2"
                                                        for n in sizes) + " (H=4, D=16)",
              _verdict(not weights_ok),
              "The largest array is the H x N x N attention matrix, O(H N^2) = O(N^2) for fixed H,"
              " plus O(N D) for Q, K, V: nothing of size N^2 D is ever stored. O(N^2 D) is an upper"
              " bound, overstated by a factor D; 003's O(n^2) is the right figure."),
        Claim("003-cost", "time O(n^2 d), space O(n^2)", str(c["cite_003"]),
              f"{c['printed_time_003']}, {c['printed_space_003']}",
              "as for 000-time and 000-space above", _verdict(weights_ok)),
        Claim("001-cost", "self-attention costs O(n^2)", str(c["cite_001"]), c["printed_001"],
              "N^2 pairs (000-pairs)", "holds", "In the sequence length n, for a fixed width."),
        Claim("000-low-rank", "after the softmax the attention matrix is low-rank: a few singular values"
              " carry most of the information", str(docs.PRINTED_VERBAL["low_rank"][0]), "(no number)",
              "singular values for 90% of the energy of a 64 x 64 P (d_k=16): "
              + ", ".join(f"{ex.energy_rank(s)} at score scale {fmt(t)}" for t, s in spectra.items())
              + f"; exact rank {int((spectra[1.0] > 1e-12).sum())}", "ambiguous",
              "P is generically full rank, so 'low-rank' can only mean a decaying spectrum, and how"
              " fast it decays depends on the score scale: small scores make P close to the rank-one"
              " uniform matrix, large scores make it close to a permutation (flat spectrum). See the"
              " spectra figure."),
        Claim("002-mqa", "multi-query attention saves inference memory (one key/value head)",
              str(docs.PRINTED_VERBAL["mqa"][0]), "(no number)",
              f"d_model=64, h=8, 16 decoded tokens: params {mha['params']:,} -> {mqa['params']:,};"
              f" KV cache {mha['cache_bytes']:,} -> {mqa['cache_bytes']:,} bytes",
              _verdict(mha["cache_bytes"] == 8 * mqa["cache_bytes"] and mqa["params"] < mha["params"]),
              "The cache shrinks by the factor h (2 h d_k -> 2 d_k numbers per token); parameters"
              " go from 4 d^2 to 2 d^2 + 2 d d_k. The expressiveness cost is not measured here."),
    ]


# ------------------------------------------------------ code, masks, other statements
def other_claims() -> list[Claim]:
    """The rest: 004's shapes and mask code, 000 on heads and windows, 001 and 003 on the
    scale, word order, sparse and linear attention."""
    from .layer import MultiHeadAttention
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
    return [
        Claim("004-4.2-dims", "d_model=3 with h=2 heads of width 2: W^O maps h d_v = 4 back to 3",
              str(d["cite"]), "h d_v = 4, d_model = 3",
              f"MultiHeadAttention(3, 2, d_k=2, d_v=2) runs, output shape {shape}", _verdict(shape == (1, 3)),
              "h d_k need not equal d_model when the head widths are given explicitly."),
        Claim("004-code-divisible", "the code's head width is d_model // num_heads", str(c["cite_004_code"]),
              "d_model // h", f"d_model=3, h=2: 3 // 2 = {3 // 2}, and h x 1 = 2 != 3;"
              f" MultiHeadAttention(3, 2) {'refuses it (ValueError)' if refused else 'accepts it'}",
              "ambiguous",
              "Right when h divides d_model; otherwise the floor division silently drops features."
              " The code cannot run the document's own 4.2 example. This library refuses the"
              " combination unless d_k and d_v are given."),
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
              f" {cost[1]['weights']:,} vs {cost[8]['weights']:,}", "ambiguous",
              "True per head (each costs 1/h), false for the layer: the total is unchanged and the"
              " attention weights take h times the memory."),
        Claim("000-low-rank-product", "each head's weights are not low-rank but their concatenated"
              " product is", str(c["cite_000_spec"]), "(no number)",
              f"random weights, d_model=16, h=4: rank of each W_i^Q W_i^K^T = {ranks['per_head']},"
              f" of W^Q W^K^T = {ranks['full']}", "ambiguous",
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
              f" by sqrt(d_k): {fmt(var64 / 64, 3)}", "ambiguous",
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
              f" n log2 n {round(n_sparse * math.log2(n_sparse)):,}; window of 256: {n_sparse * 256:,}",
              "ambiguous",
              "Both bounds exist for particular schemes (strided patterns; hashing), but the examples"
              " the document gives (a local window, random sampling of a fixed number of keys) are"
              " O(n w), linear in n."),
        Claim("003-linear", "Attention(Q, K, V) ~ phi(Q) (phi(K)^T V)", str(c["cite_003_sparse"]),
              "phi(Q)(phi(K)^T V)",
              f"regrouping exact (max |difference| {tiny(lin['regrouping_error'], 1e-10)}); n^2 d vs n d^2 work:"
              f" {lin['madds_left']:,} vs {lin['madds_right']:,} (n=50, d=8); implied row sums"
              f" {fmt(lin['row_sum_min'], 0)} to {fmt(lin['row_sum_max'], 0)}, not 1", "ambiguous",
              "Right up to the normaliser: linear attention divides row i by phi(q_i) . sum_j phi(k_j)"
              " (here phi = elu + 1); the printed formula leaves it out."),
    ]


def claim_groups() -> dict:
    """Group title -> function returning its rows, in table order."""
    return {
        "Worked examples (004)": worked_example_claims,
        "The sqrt(d_k) scale (002)": scaling_claims,
        "What one head cannot do (002)": hull_claims,
        "Parameters, heads and the two implementations (000, 001, 002, 003)": parameter_claims,
        "Cost, low rank and multi-query attention (000, 001, 002, 003)": cost_claims,
        "Code listings, masks and other statements (000, 001, 003, 004)": other_claims,
    }


def all_claims() -> list[Claim]:
    """Every row, in table order."""
    return [row for f in claim_groups().values() for row in f()]


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def render_markdown() -> str:
    """The whole of ``docs/claims.md``."""
    lines = [
        "# The documents' claims, checked",
        "",
        "<!-- GENERATED by `python examples/claims.py --write`; do not edit by hand."
        " tests/test_claims.py fails when this file and the code disagree. -->",
        "",
        "Every worked number and checkable claim of the five documents, recomputed with this"
        " library. *Printed* is the document's value as printed, *computed* is ours, and the"
        " verdict is **holds**, **wrong** (the note gives the correct value and how the"
        " mistake arises) or **ambiguous** (the note says which reading we compute and why).",
        "",
        "Documents (cited by the first three characters of the file name):",
        "",
    ]
    lines += [f"- `{name}`: {title}" for name, title in docs.DOCUMENTS.items()]
    rows = []
    for title, f in claim_groups().items():
        group = f()
        rows += group
        lines += ["", f"## {title}", "",
                  "| id | claim | document, section | printed | computed | verdict | note |",
                  "|---|---|---|---|---|---|---|"]
        for r in group:
            lines.append("| " + " | ".join(_cell(x) for x in (
                f"`{r.id}`", r.claim, r.source, r.printed, r.computed, f"**{r.verdict}**", r.note)) + " |")
    counts = {v: sum(r.verdict == v for r in rows) for v in VERDICTS}
    lines += ["", f"{len(rows)} claims: " + ", ".join(f"{n} {v}" for v, n in counts.items()) + ".", "",
              "## Not computed here", "",
              "Statements that no computation in this project can check (empirical findings about"
              " trained models, history, and defects of the documents' code listings, which the"
              " project does not run). Listed so the table is complete.", ""]
    lines += [f"- {cite}: {text}" for cite, text in docs.NOT_COMPUTED]
    lines.append("")
    return "\n".join(lines)


def render_text(width: int = 80) -> str:
    """The table for a terminal: one block per claim, wrapped to ``width`` columns."""
    import textwrap
    out = []
    for title, f in claim_groups().items():
        out += ["", title, "=" * min(len(title), width)]
        for r in f():
            out.append(f"[{r.verdict.upper()}] {r.id}")
            for label, text in (("source", r.source), ("claim", r.claim), ("printed", r.printed), ("computed", r.computed),
                                ("note", r.note)):
                if text:
                    out += textwrap.wrap(text, width, initial_indent=f"  {label:<9}",
                                         subsequent_indent=" " * 11)
    return "\n".join(out)
