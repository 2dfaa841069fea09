"""Rows of the claims table: 004's worked examples, 002's scale argument and convex hull.

One function per claim (or per family of rows that is one computation looped, such as
Q_1 ... V_2), named after the row's id (``004-4.1-score`` is :func:`claim_004_4_1_score`): it
computes what the row states and returns its Claim(s). Each group's tuple lists them in
table order. See :mod:`attention_ref.documents.claims` for the verdicts and the rendering.
"""
from __future__ import annotations

import numpy as np

from .. import experiments as ex
from .. import printed_values as docs
from ..worked_examples import single_token_example, two_head_example
from .claim import Claim, _close, _readings, _verdict, fmt, rows_of, tiny

__all__ = ["worked_example_claims", "scaling_claims", "hull_claims",
           "WORKED_EXAMPLE_CLAIMS", "SCALING_CLAIMS", "HULL_CLAIMS"]


# ------------------------------------------------------------------- worked examples
def claim_004_4_1_score() -> Claim:
    """004 4.1: the score q.k / sqrt(3) of the single-token example."""
    d, r = docs.SINGLE_TOKEN, single_token_example()
    return Claim(
        "004-4.1-score", "score = q.k / sqrt(3) for q=[0.1,0.2,0.3], k=[0.4,0.5,0.6]", str(d["cite"]),
        fmt(d["printed_score"]), fmt(r.score), _verdict(_close(r.score, d["printed_score"], 5e-5)),
        f"q.k = {' + '.join(fmt(t) for t in r.products)} = {fmt(r.dot)}, and {fmt(r.dot)} /"
        f" {fmt(np.sqrt(d['d_k']))} = {fmt(r.score)}. The printed {fmt(d['printed_score'])} is"
        f" {fmt(d['printed_score'] * np.sqrt(d['d_k']), 2)} / sqrt({d['d_k']}): the numerator is"
        " wrong, the rest of the example does not depend on it.")


def claim_004_4_1_alpha() -> Claim:
    """004 4.1: a softmax over one score is 1."""
    d, r = docs.SINGLE_TOKEN, single_token_example()
    return Claim("004-4.1-alpha", "alpha = softmax(score) = 1 (one key)", str(d["cite"]), fmt(d["printed_alpha"]),
                 fmt(r.alpha), _verdict(_close(r.alpha, d["printed_alpha"])),
                 "A softmax over a single score is exactly 1 whatever the score, so the wrong score is harmless.")


def claim_004_4_1_output() -> Claim:
    """004 4.1: the output alpha v."""
    d, r = docs.SINGLE_TOKEN, single_token_example()
    return Claim("004-4.1-output", "output = alpha v", str(d["cite"]), fmt(d["printed_output"]), fmt(r.output),
                 _verdict(_close(r.output, d["printed_output"])))


def _least_squares_note() -> str:
    """Why no other input x' explains the printed Q, K, V (least squares over x')."""
    lsq = ex.input_least_squares()
    return (f"Nor a different input: no x' reproduces all twelve printed Q, K, V numbers (least squares"
            f" x' = {fmt(lsq['both']['x'], 2)} misses by up to {fmt(lsq['both']['worst'], 2)}); head 2's six"
            f" numbers alone are reproduced (within {fmt(lsq['head2']['worst'], 3)}, below the print"
            f" precision 0.05) by x' = {fmt(lsq['head2']['x'], 2)}, head 1's are not (miss"
            f" {fmt(lsq['head1']['worst'], 2)}).")


def claim_004_4_2_projections() -> list[Claim]:
    """004 4.2: Q_i, K_i, V_i = x W_i for both heads (rows Q1, Q2, K1, K2, V1, V2), and the
    misreadings of W tried when they disagree."""
    d, r = docs.TWO_HEAD, two_head_example()
    rows = []
    for name, ours in (("Q", r.Q), ("K", r.K), ("V", r.V)):
        for i in range(d["h"]):
            W, printed = np.array(d[f"W_{name}"][i]), d[f"printed_{name}"][i]
            terms = " + ".join(f"{fmt(xj)}*{fmt(w)}" for xj, w in zip(d["x"], W[:, 0]))
            ok = _close(ours[i], printed)
            rows.append(Claim(
                f"004-4.2-{name}{i + 1}", f"{name}_{i + 1} = x W_{i + 1}^{name}", str(d["cite"]), fmt(printed),
                fmt(ours[i]), _verdict(ok),
                "" if ok else f"First entry: {terms} = {fmt(ours[i][0, 0])}. Printed minus ours:"
                f" {fmt(np.subtract(printed, ours[i][0]))}. Not a misread matrix: the block refilled"
                f" as 2 x 3 gives x W' = {fmt(np.array(d['x']) @ W.reshape(2, 3).T)}; adding the column"
                f" sums of W (which is the input x + 1) gives {fmt(ours[i][0] + W.sum(axis=0))}; neither"
                " matches. " + (_least_squares_note() if (name, i) == ("Q", 0)
                                else "Nor a different input (see 004-4.2-Q1).")))
    return rows


def claim_004_4_2_heads() -> list[Claim]:
    """004 4.2: head_i = softmax(Q_i K_i^T / sqrt 2) V_i for both heads (rows head1, head2)."""
    d, r = docs.TWO_HEAD, two_head_example()
    return [Claim(
        f"004-4.2-head{i + 1}", f"head_{i + 1} = softmax(Q_{i + 1} K_{i + 1}^T / sqrt 2) V_{i + 1}", str(d["cite"]),
        fmt(d["printed_head"][i]), fmt(r.heads[i]), _verdict(_close(r.heads[i], d["printed_head"][i])),
        f"One token, so the weight is exactly 1 (score {fmt(float(r.scores[i][0, 0]))}) and head_{i + 1} = V_{i + 1}."
        f" Even by the document's own numbers head_{i + 1} should equal its printed"
        f" V_{i + 1} = {fmt(d['printed_V'][i])}: a second, independent slip.") for i in range(d["h"])]


def claim_004_4_2_concat() -> Claim:
    """004 4.2: the concatenation of the two heads."""
    d, r = docs.TWO_HEAD, two_head_example()
    return Claim("004-4.2-concat", "Concat(head_1, head_2)", str(d["cite"]), fmt(d["printed_concat"]),
                 fmt(r.concat), _verdict(_close(r.concat, d["printed_concat"])),
                 "The concatenation itself is done right; it inherits the wrong heads.")


def claim_004_4_2_wo_shape() -> Claim:
    """004 4.2: whether the printed W^O can multiply the 1 x 4 concatenation, as typeset or transposed."""
    d, r = docs.TWO_HEAD, two_head_example()
    printed_WO = np.array(d["W_O_as_printed"])
    return Claim(
        "004-4.2-WO-shape", "W^O in R^{h d_v x d_model} multiplies the 1 x 4 concatenation", str(d["cite"]),
        f"typeset {printed_WO.shape[0]} x {printed_WO.shape[1]}; declared {d['W_O_declared_shape'][0]} x"
        f" {d['W_O_declared_shape'][1]}", f"needs {r.concat.shape[1]} x {d['d_model']}",
        _readings({"as typeset": printed_WO.shape[0] == r.concat.shape[1],
                   "transposed (declared shape)": printed_WO.T.shape == tuple(d["W_O_declared_shape"])}),
        "A 1 x 4 row times a 3 x 4 matrix is undefined. We use the transpose of the typeset matrix:"
        " it has the declared shape h d_v x d_model = 4 x 3 and equals the column-vector reading"
        " W^O concat. The other defensible reading refills the 12 numbers row by row into 4 x 3.")


def claim_004_4_2_output() -> Claim:
    """004 4.2: the layer's output Concat W^O under each reading of W^O and of the concatenation."""
    d, r = docs.TWO_HEAD, two_head_example()
    outputs = (r.output, r.output_row_major, r.output_from_printed_concat, r.output_from_printed_concat_row_major)
    return Claim(
        "004-4.2-output", "MultiHead = Concat(head_1, head_2) W^O", str(d["cite"]), fmt(d["printed_output"]),
        fmt(r.output), _verdict(any(_close(o[0], d["printed_output"], 0.05) for o in outputs)),
        f"With W^O transposed (our reading): {fmt(r.output)}; refilled row by row: {fmt(r.output_row_major)};"
        f" the printed concatenation times W^O^T gives {fmt(r.output_from_printed_concat)}, times the"
        f" row-major W^O {fmt(r.output_from_printed_concat_row_major)}. None is within print precision"
        " (0.05) of the printed value. The whole layer through"
        f" multi_head_attention_forward gives {fmt(r.layer_output)}.")


#: The claim functions of :func:`worked_example_claims`, in table order.
WORKED_EXAMPLE_CLAIMS = (claim_004_4_1_score, claim_004_4_1_alpha, claim_004_4_1_output, claim_004_4_2_projections,
                         claim_004_4_2_heads, claim_004_4_2_concat, claim_004_4_2_wo_shape, claim_004_4_2_output)


def worked_example_claims() -> list[Claim]:
    """004 sections 4.1 and 4.2."""
    return rows_of(WORKED_EXAMPLE_CLAIMS)


# ----------------------------------------------------------------- scale and saturation
_VARIANCE_D_KS = (4, 64, 256)  # the head widths of the variance rows


def claim_002_var() -> Claim:
    """002: Var(q.k) = d_k, sampled at three widths."""
    var = {d_k: ex.score_variance(d_k)[0] for d_k in _VARIANCE_D_KS}
    return Claim("002-var", "Var(q.k) = d_k for i.i.d. zero-mean unit-variance components",
                 str(docs.PRINTED_VERBAL["variance"][0]), "d_k",
                 ", ".join(f"{fmt(v, 1)} at d_k={d}" for d, v in var.items()),
                 _verdict(all(abs(v / d - 1) < 0.05 for d, v in var.items())),
                 "10,000 samples per d_k, N(0,1) components. Exact: Var(q_l k_l) = E[q_l^2] E[k_l^2] = 1"
                 " needs q and k independent (for k = q it is 2).")


def claim_002_var_scaled() -> Claim:
    """002: Var(q.k / sqrt(d_k)) = 1, sampled at the same widths."""
    var = {d_k: ex.score_variance(d_k)[1] for d_k in _VARIANCE_D_KS}
    return Claim("002-var-scaled", "Var(q.k / sqrt(d_k)) = 1", str(docs.PRINTED_VERBAL["variance"][0]), "1",
                 ", ".join(f"{fmt(v, 3)} at d_k={d}" for d, v in var.items()),
                 _verdict(all(abs(v - 1) < 0.05 for v in var.values())),
                 "The same reason for the scale is given in " + ", ".join(str(c) for c in docs.MORE["cite_scale"])
                 + ".")


def claim_002_saturation() -> Claim:
    """002: unscaled scores saturate the softmax at large d_k and its Jacobian vanishes; scaled ones do not."""
    d_ks = (1, 64, 1024)
    raw, scaled = ([ex.saturation(d_k, s) for d_k in d_ks] for s in (False, True))
    return Claim(
        "002-saturation", "unscaled, large d_k saturates the softmax and its gradient vanishes;"
        " the scale prevents it", str(docs.PRINTED_VERBAL["saturation"][0]), "(no number)",
        "largest weight (8 keys) unscaled " + " / ".join(fmt(s.max_weight, 3) for s in raw)
        + ", scaled " + " / ".join(fmt(s.max_weight, 3) for s in scaled)
        + " at d_k = 1 / 64 / 1024; median |J| unscaled " + " / ".join(f"{s.grad_norm:.1e}" for s in raw)
        + ", scaled " + " / ".join(f"{s.grad_norm:.2f}" for s in scaled),
        _verdict(raw[-1].max_weight > 0.95 and raw[-1].grad_norm < 1e-4
                 and all(0.25 < s.max_weight < 0.45 for s in scaled)),
        "|J| is the Frobenius norm of the softmax Jacobian d weights / d scores, built with"
        " softmax_backward: it multiplies every gradient reaching q and k.")


#: The claim functions of :func:`scaling_claims`, in table order.
SCALING_CLAIMS = (claim_002_var, claim_002_var_scaled, claim_002_saturation)


def scaling_claims() -> list[Claim]:
    """002, 'why scaling matters': variance and softmax saturation."""
    return rows_of(SCALING_CLAIMS)


# ------------------------------------------------------------------------ convex hull
def claim_002_hull_min() -> Claim:
    """002: min{k_1, k_2} of each key, and k_3 the balanced winner."""
    d = docs.HULL
    mins = np.array(d["keys"]).min(axis=1)
    return Claim("002-hull-min", "min{k_1, k_2} of each key; k_3 = (5, 5) is the balanced winner", str(d["cite"]),
                 fmt(d["printed_min"]), fmt(mins),
                 _verdict(_close(mins, d["printed_min"]) and int(np.argmax(mins)) + 1 == d["printed_winner"]))


def claim_002_hull_mean() -> Claim:
    """002: k_3 is the mean of k_1 and k_2, so its score is the mean of theirs for every query searched."""
    d, search = docs.HULL, ex.hull_single_query_search()
    keys = np.array(d["keys"])
    return Claim("002-hull-mean", "k_3 = (k_1 + k_2) / 2, so q.k_3 is always the mean of q.k_1 and q.k_2",
                 str(d["cite"]), "identity",
                 f"max deviation {tiny(search['mean_identity_error'], 1e-9)} over {search['n_queries']:,} queries",
                 _verdict(search["mean_identity_error"] < 1e-9 and _close(keys[2], (keys[0] + keys[1]) / 2)))


def claim_002_hull_single() -> Claim:
    """002: no query of the search ranks k_3 strictly first."""
    search = ex.hull_single_query_search()
    return Claim("002-hull-single", "no single query ranks k_3 strictly first", str(docs.HULL["cite"]), "never",
                 f"k_3 strictly first for {search['strictly_first'][2]} of {search['n_queries']:,} queries; best"
                 f" margin s_3 - max(s_1, s_2) = {fmt(search['best_margin_k3'])}",
                 _verdict(search["strictly_first"][2] == 0 and search["best_margin_k3"] <= 0),
                 "At best k_3 ties with k_1 and k_2 (q along (1, 1)); the softmax then splits the weight"
                 " three ways.")


def claim_002_hull_geometry() -> Claim:
    """002: the keys' convex hull, whether k_3 is interior, and which keys a single query can pick."""
    keys, search, vertices = np.array(docs.HULL["keys"]), ex.hull_single_query_search(), ex.hull_vertices()
    k31, k21 = keys[2] - keys[0], keys[1] - keys[0]
    on_edge = bool(abs(k31[0] * k21[1] - k31[1] * k21[0]) < 1e-12)  # k_3 on the segment k_1-k_2
    return Claim(
        "002-hull-geometry", "a single query can only pick out vertices of the keys' convex hull,"
        " never an interior point like k_3", str(docs.HULL["cite"]), "k_3 interior",
        f"hull vertices: {', '.join(f'k_{v}' for v in vertices)}; k_3 lies on the edge k_1-k_2;"
        f" k_4 = (2, 2) is strictly first for {search['strictly_first'][3]:,} queries",
        _readings({"conclusion (k_3 never strictly first)": search["strictly_first"][2] == 0,
                   "geometry (k_3 interior)": 3 not in vertices and not on_edge}),
        "The conclusion holds; the geometry is loosely worded. k_3 is not interior: it is on the"
        " hull's boundary, between the vertices k_1 and k_2, which is why it can only tie. k_4,"
        " which looks 'inside', is a vertex and wins for queries such as (-1, -1).")


def _head_scores() -> tuple[np.ndarray, np.ndarray]:
    """The scores of the four keys under 002's two heads, q = (1, 0) and q = (0, 1)."""
    s1, s2 = (ex.hull_scores([q])[0] for q in docs.HULL["head_queries"])
    return s1, s2


def claim_002_hull_heads() -> Claim:
    """002: the two heads' scores of token 3 and token 1."""
    d, (s1, s2) = docs.HULL, _head_scores()
    return Claim("002-hull-heads", "head 1 with q=(1,0) and head 2 with q=(0,1): token 3 scores (5, 5),"
                 " token 1 (10, 0)", str(d["cite_heads"]),
                 f"{fmt(d['printed_token3_scores'])}, {fmt(d['printed_token1_scores'])}",
                 f"{fmt([s1[2], s2[2]])}, {fmt([s1[0], s2[0]])}",
                 _verdict(_close([s1[2], s2[2]], d["printed_token3_scores"])
                          and _close([s1[0], s2[0]], d["printed_token1_scores"])))


def claim_002_hull_heads_limit() -> Claim:
    """002: min(s1, s2) over the two heads prefers k_3; each head alone does not; token 3's weight in head 1."""
    from ...core.softmax import softmax_forward
    s1, s2 = _head_scores()
    best_of_min = int(np.argmax(np.minimum(s1, s2))) + 1
    best1, best2 = int(np.argmax(s1)) + 1, int(np.argmax(s2)) + 1  # each head's own first key
    share3 = float(softmax_forward(s1)[0][2])  # token 3's weight inside head 1
    return Claim(
        "002-hull-heads-limit", "with two heads a later layer can prefer the balanced token",
        str(docs.HULL["cite_heads"]), "(no number)",
        f"argmax_j min(s1_j, s2_j) = k_{best_of_min}; each head alone still ranks k_{best1} / k_{best2} first",
        _verdict(best_of_min == 3),
        "Only through a nonlinearity, and not inside the attention layer: a weighted sum"
        " a s1 + b s2 of the two heads' scores is the score of the single query (a, b), which"
        " cannot rank k_3 first; but W^O never sees scores anyway: it mixes the heads' weighted"
        " values, after each head's softmax. A later non-linear layer (e.g. a ReLU feed-forward"
        " network) can compute something like min(s1, s2) from features that carry both."
        f" Also, a head passes on weighted values, not scores: inside head 1 token 3 gets only"
        f" {share3:.2%} of the weight.")


#: The claim functions of :func:`hull_claims`, in table order.
HULL_CLAIMS = (claim_002_hull_min, claim_002_hull_mean, claim_002_hull_single, claim_002_hull_geometry,
               claim_002_hull_heads, claim_002_hull_heads_limit)


def hull_claims() -> list[Claim]:
    """002, the convex-hull thought experiment and what two heads change."""
    return rows_of(HULL_CLAIMS)
