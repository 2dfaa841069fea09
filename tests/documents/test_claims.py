"""Every row of the claims table, re-derived independently (plain loops and closed forms),
and docs/claims.md checked against the code that generates it."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from attention_ref import documents
from attention_ref.documents import claims
from attention_ref.documents import experiments as ex
from attention_ref.documents.worked_examples import single_token_example, two_head_example, two_head_params

ROOT = Path(__file__).resolve().parents[2]
ROWS = {r.id: r for r in claims.all_claims()}


def matvec(x, W):
    """Row vector times matrix with plain loops, straight from the definition."""
    return [sum(x[i] * W[i][j] for i in range(len(x))) for j in range(len(W[0]))]


# ------------------------------------------------------------------------ the table
def test_docs_claims_md_is_generated_from_the_code():
    committed = (ROOT / "docs" / "claims.md").read_text(encoding="utf-8")
    assert committed == claims.render_markdown(), "run: python examples/claims.py --write"


def test_rows_are_well_formed():
    rows = claims.all_claims()
    assert len(ROWS) == len(rows), "claim ids are unique"
    for r in rows:
        assert r.verdict in claims.VERDICTS, r.id
        assert r.source[:3] in {name[:3] for name in documents.DOCUMENTS}, r.id
        assert r.claim and r.printed and r.computed, r.id
        if r.verdict in ("wrong", "ambiguous"):
            assert len(r.note) > 20, f"{r.id}: a {r.verdict} row explains itself"
        if r.verdict == "wrong":
            assert r.printed != r.computed, r.id


def test_the_issue_checklist_is_covered():
    for prefix in ("004-4.1-", "004-4.2-Q", "004-4.2-K", "004-4.2-V", "004-4.2-head", "004-4.2-concat",
                   "004-4.2-WO", "004-4.2-output", "002-var", "002-saturation", "002-hull",
                   "002-params", "000-strategies", "000-pairs", "000-time", "000-space", "000-low-rank",
                   "002-mqa"):
        assert any(i.startswith(prefix) for i in ROWS), prefix


@pytest.mark.parametrize("rid, verdict", [
    ("004-4.1-score", "wrong"), ("004-4.1-alpha", "holds"), ("004-4.1-output", "holds"),
    ("004-4.2-Q1", "wrong"), ("004-4.2-K1", "wrong"), ("004-4.2-V1", "wrong"),
    ("004-4.2-Q2", "wrong"), ("004-4.2-K2", "wrong"), ("004-4.2-V2", "wrong"),
    ("004-4.2-head1", "wrong"), ("004-4.2-head2", "wrong"), ("004-4.2-concat", "wrong"),
    ("004-4.2-WO-shape", "ambiguous"), ("004-4.2-output", "wrong"),
    ("002-var", "holds"), ("002-var-scaled", "holds"), ("002-saturation", "holds"),
    ("002-hull-min", "holds"), ("002-hull-single", "holds"), ("002-hull-geometry", "ambiguous"),
    ("002-hull-heads", "holds"), ("002-params-single", "holds"), ("002-params-multi", "holds"),
    ("001-params", "ambiguous"), ("003-head-dim", "ambiguous"), ("001-sum-formula", "ambiguous"),
    ("000-strategies", "holds"), ("000-pairs", "holds"), ("000-space", "ambiguous"),
    ("000-time", "holds"), ("001-cost", "holds"), ("003-cost", "holds"),
    ("000-low-rank", "ambiguous"), ("002-mqa", "holds"),
])
def test_verdicts(rid, verdict):
    assert ROWS[rid].verdict == verdict, ROWS[rid]


# -------------------------------------------------------------------- worked examples
def test_single_token_example_by_hand():
    q, k = documents.SINGLE_TOKEN["q"], documents.SINGLE_TOKEN["k"]
    score = sum(a * b for a, b in zip(q, k)) / math.sqrt(3)
    r = single_token_example()
    assert r.score == pytest.approx(score, abs=1e-15) and round(score, 4) == 0.1848
    assert r.alpha == 1.0 and np.array_equal(r.output, [1.0, 2.0, 3.0])
    assert 0.45 / math.sqrt(3) == pytest.approx(0.2598, abs=5e-5)  # how the printed value arises
    assert ROWS["004-4.1-score"].computed == "0.1848"


def test_two_head_example_by_hand():
    t = documents.TWO_HEAD
    r = two_head_example()
    x = t["x"]
    expected = {"Q": ([2.2, 2.8], [13.0, 13.6]), "K": ([5.8, 6.4], [16.6, 17.2]),
                "V": ([9.4, 10.0], [20.2, 20.8])}
    for name, values in expected.items():
        for i in range(2):
            by_hand = matvec(x, t[f"W_{name}"][i])
            assert by_hand == pytest.approx(values[i], abs=1e-12)
            np.testing.assert_allclose(getattr(r, name)[i][0], by_hand, atol=1e-12)
            assert ROWS[f"004-4.2-{name}{i + 1}"].computed == claims.fmt(values[i])
            W = np.array(t[f"W_{name}"][i])
            for misread in (np.array(x) @ W.reshape(2, 3).T, np.array(by_hand) + W.sum(axis=0)):
                assert not np.allclose(misread, t[f"printed_{name}"][i])
    # one token: each weight is exactly 1 and head_i = V_i
    for i in range(2):
        assert r.weights[i].item() == 1.0
        np.testing.assert_array_equal(r.heads[i], r.V[i])
    concat = [9.4, 10.0, 20.2, 20.8]
    np.testing.assert_allclose(r.concat[0], concat, atol=1e-12)
    W_o = [list(col) for col in zip(*t["W_O_as_printed"])]  # transpose, by hand
    out = matvec(concat, W_o)
    assert out == pytest.approx([234.76, 258.92, 283.08], abs=1e-9)
    np.testing.assert_allclose(r.output[0], out, atol=1e-12)
    np.testing.assert_allclose(r.layer_output[0], out, atol=1e-12)
    flat = [v for row in t["W_O_as_printed"] for v in row]
    row_major = [flat[3 * i:3 * i + 3] for i in range(4)]
    assert matvec(concat, row_major) == pytest.approx(list(r.output_row_major[0]), abs=1e-9)
    assert matvec(list(t["printed_concat"]), W_o) == pytest.approx(list(r.output_from_printed_concat[0]))
    # no reading reproduces the printed output
    for ours in (r.output, r.output_row_major, r.output_from_printed_concat):
        assert not np.allclose(ours[0], t["printed_output"], atol=0.5)


def test_printed_w_o_cannot_multiply_the_concatenation():
    with pytest.raises(ValueError):
        np.ones((1, 4)) @ np.array(documents.TWO_HEAD["W_O_as_printed"])
    with pytest.raises(ValueError, match="reading"):
        two_head_params("columns")


# ---------------------------------------------------------------- scale, saturation
@pytest.mark.parametrize("d_k", [4, 64, 256])
def test_score_variance(d_k):
    raw, scaled = ex.score_variance(d_k)
    assert raw == pytest.approx(d_k, rel=0.05)
    assert scaled == pytest.approx(1.0, rel=0.05)
    assert raw / d_k == pytest.approx(scaled, rel=1e-12)


def test_saturation_closed_form_jacobian_norm():
    """The Jacobian norm built with softmax_backward equals the closed form
    ||diag(p) - p p^T||_F^2 = sum p^2 - 2 sum p^3 + (sum p^2)^2 for one small case."""
    s = ex.saturation(3, True, n_keys=4, trials=1, seed=5)
    rng = np.random.default_rng(5)
    q, k = rng.standard_normal((1, 1, 3)), rng.standard_normal((1, 4, 3))
    scores = [sum(q[0, 0, l] * k[0, j, l] for l in range(3)) / math.sqrt(3) for j in range(4)]
    e = [math.exp(v - max(scores)) for v in scores]
    p = [v / sum(e) for v in e]
    s2 = sum(v * v for v in p)
    norm = math.sqrt(s2 - 2 * sum(v ** 3 for v in p) + s2 * s2)
    assert s.grad_norm == pytest.approx(norm, rel=1e-12)
    assert s.max_weight == pytest.approx(max(p), rel=1e-12)


def test_saturation_trend():
    raw = [ex.saturation(d, False) for d in (1, 64, 1024)]
    scaled = [ex.saturation(d, True) for d in (1, 64, 1024)]
    assert raw[0].max_weight < raw[1].max_weight < raw[2].max_weight and raw[2].max_weight > 0.95
    assert raw[0].grad_norm > raw[1].grad_norm > raw[2].grad_norm and raw[2].grad_norm < 1e-4
    assert all(0.25 < s.max_weight < 0.45 and s.grad_norm > 0.3 for s in scaled)


# ------------------------------------------------------------------------ convex hull
def test_hull_by_brute_force():
    keys = documents.HULL["keys"]
    assert [min(k) for k in keys] == [0, 0, 5, 2]
    # a grid of queries, scores with plain loops: k3 is never strictly first, k1, k2, k4 are
    firsts = set()
    for a in np.linspace(-3, 3, 61):
        for b in np.linspace(-3, 3, 61):
            s = [a * k[0] + b * k[1] for k in keys]
            assert s[2] == pytest.approx((s[0] + s[1]) / 2)
            best = max(s)
            if s.count(best) == 1:
                firsts.add(s.index(best) + 1)
    assert firsts == {1, 2, 4}
    assert ex.hull_vertices() == [1, 2, 4]
    search = ex.hull_single_query_search()
    assert search["strictly_first"][2] == 0 and search["best_margin_k3"] <= 0
    assert min(search["strictly_first"][j] for j in (0, 1, 3)) > 0


def test_two_heads_need_a_nonlinearity():
    s1 = [k[0] for k in documents.HULL["keys"]]  # head 1, q = (1, 0)
    s2 = [k[1] for k in documents.HULL["keys"]]  # head 2, q = (0, 1)
    np.testing.assert_array_equal(ex.hull_scores([[1, 0]])[0], s1)
    assert (s1[2], s2[2]) == (5, 5) and (s1[0], s2[0]) == (10, 0)
    mins = [min(a, b) for a, b in zip(s1, s2)]
    assert mins.index(max(mins)) == 2  # min over heads picks k3
    rng = np.random.default_rng(0)
    for a, b in rng.standard_normal((200, 2)):  # any linear mix: k3 never strictly first
        mix = [a * u + b * v for u, v in zip(s1, s2)]
        assert not mix[2] > max(mix[0], mix[1]) + 1e-12


# --------------------------------------------------------------------- parameters
@pytest.mark.parametrize("d_model, h", [(512, 1), (512, 8), (12, 3)])
def test_parameter_counts(d_model, h):
    assert ex.parameter_count(d_model, h, bias=False) == 4 * d_model ** 2
    assert ex.parameter_count(d_model, h, bias=True) == 4 * d_model ** 2 + 4 * d_model
    d_k = d_model // h
    assert ex.parameter_count(d_model, h, bias=False, num_kv_heads=1) == 2 * d_model ** 2 + 2 * d_model * d_k


def test_strategies_and_sum_formula_agree():
    assert ex.strategies_max_difference() < 1e-12
    assert ex.sum_formula_difference() < 1e-12


# ----------------------------------------------------------------- cost, low rank
def test_pairs_and_cost():
    assert ex.attention_pairs(1000) == 10 ** 6 and ex.attention_pairs(10_000) == 10 ** 8
    assert ex.attention_pairs(1000, causal=True) == sum(i + 1 for i in range(1000))
    for n in (8, 16):
        c = ex.attention_cost(n, 8, 2)
        assert c["weights_numbers"] == 2 * n * n  # H n^2 stored, not n^2 D
        assert c["attention_madds"] == 2 * n * n * 8 and c["qkv_numbers"] == 3 * n * 8


def test_softmax_attention_matrix_is_full_rank_with_a_decaying_spectrum():
    spectra = {t: ex.softmax_spectrum(scale=t) for t in (0.1, 1.0, 10.0)}
    for s in spectra.values():
        assert np.all(np.diff(s) <= 1e-12) and s[-1] > 0  # descending, full rank
        assert np.linalg.matrix_rank(np.diag(s), tol=1e-13) == 64
    ranks = [ex.energy_rank(spectra[t]) for t in (0.1, 1.0, 10.0)]
    assert ranks[0] == 1 and ranks[0] < ranks[1] < ranks[2]
    # a row-stochastic matrix has singular value >= 1 (P 1 = 1)
    assert spectra[1.0][0] >= 1.0 - 1e-12
    assert ex.energy_rank(np.array([3.0, 1.0, 1.0]), 0.5) == 1


def test_multi_query_cache_is_h_times_smaller():
    kv = ex.kv_cache_comparison(d_model=16, num_heads=4, steps=5)
    d_k = 4
    assert kv["MHA"]["cache_bytes"] == 2 * 4 * 5 * d_k * 8  # keys and values, 4 heads, float64
    assert kv["MQA"]["cache_bytes"] == 2 * 1 * 5 * d_k * 8
    assert kv["MQA"]["params"] == 2 * 16 ** 2 + 2 * 16 * d_k


# -------------------------------------------------------------- code, masks, the rest
@pytest.mark.parametrize("rid, verdict", [
    ("004-4.2-dims", "holds"), ("004-code-divisible", "ambiguous"), ("004-code-mask", "holds"),
    ("000-head-cost", "ambiguous"), ("000-low-rank-product", "ambiguous"), ("000-window", "holds"),
    ("000-causal", "holds"), ("001-scale-factor", "ambiguous"), ("001-order", "holds"),
    ("003-sparse", "ambiguous"), ("003-linear", "ambiguous"),
    ("000-direct-path", "holds"), ("000-strategy-speed", "ambiguous"), ("000-blockwise", "holds"),
    ("000-linear", "ambiguous"), ("001-rope", "holds"), ("002-softmax-sum", "holds"), ("002-convex", "holds"),
    ("002-width", "holds"), ("003-blockwise", "holds"), ("003-checkpointing", "holds"), ("004-add-norm", "holds"),
])
def test_more_verdicts(rid, verdict):
    assert ROWS[rid].verdict == verdict, ROWS[rid]


def test_mask_convention_of_004_by_hand():
    r = ex.mask_convention_004()
    assert r["same_where_allowed"] < 1e-12
    np.testing.assert_array_equal(r["blocked_row_004"], [0.25] * 4)  # -1e9 everywhere: uniform
    np.testing.assert_array_equal(r["blocked_row_ours"], [0.0] * 4)
    assert r["inverted_row0"][:2].tolist() == [0.0, 0.0] and r["inverted_row0"].sum() == pytest.approx(1)


def test_windows_heads_order_linear_attention():
    n, w = 30, 5
    assert ex.window_pairs(n, w) == sum(min(i + 1, w) for i in range(n))
    assert ex.window_pairs(n, n) == n * (n + 1) // 2
    cost = ex.head_split_cost(16, 8, heads=(1, 4))
    assert cost[1]["madds"] == cost[4]["madds"] == 2 * 16 * 16 * 8
    assert cost[4]["weights"] == 4 * cost[1]["weights"] == 4 * 16 * 16
    assert ex.permutation_equivariance() < 1e-12
    lin = ex.linear_attention_check()
    assert lin["regrouping_error"] < 1e-10 and lin["row_sum_min"] > 1
    ranks = ex.low_rank_products(d_model=12, h=3)
    assert ranks["per_head"] == [4, 4, 4] and ranks["full"] == 12


def test_not_computed_statements_are_listed():
    md = claims.render_markdown()
    assert "## Not computed here" in md
    for cite, text in documents.NOT_COMPUTED:
        assert f"- {cite}: {text}" in md


def test_readme_quotes_the_current_counts():
    rows = claims.all_claims()
    counts = {v: sum(r.verdict == v for r in rows) for v in claims.VERDICTS}
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert (f"all {len(rows)} checked claims of the five documents ({counts['holds']} hold,"
            f" {counts['wrong']} are wrong, {counts['ambiguous']} are ambiguous)") in text


# ------------------------------------------------------- the verdicts are computed
def _row(rows, rid):
    return next(r for r in rows if r.id == rid)


def test_cost_verdicts_follow_the_printed_bounds(monkeypatch):
    from attention_ref.documents.claims.parameters_and_cost import cost_claims
    monkeypatch.setitem(documents.COST, "printed_time_000", "O(N^3 D)")
    monkeypatch.setitem(documents.COST, "printed_001", "O(n)")
    monkeypatch.setitem(documents.COST, "printed_space_000", "O(N D)")
    rows = cost_claims()
    assert _row(rows, "000-time").verdict == "wrong" and _row(rows, "001-cost").verdict == "wrong"
    assert _row(rows, "000-space").verdict == "wrong"
    monkeypatch.setitem(documents.COST, "printed_space_000", "O(N^2)")  # the fixed-H reading only
    assert _row(cost_claims(), "000-space").verdict == "ambiguous"


def test_output_verdict_follows_the_printed_value(monkeypatch):
    from attention_ref.documents.claims.example_claims import worked_example_claims
    r = two_head_example()
    monkeypatch.setitem(documents.TWO_HEAD, "printed_output", tuple(np.round(r.output_row_major[0], 1)))
    assert _row(worked_example_claims(), "004-4.2-output").verdict == "holds"


def test_readings_verdict():
    assert claims.readings_verdict({"a": True, "b": False}) == "ambiguous"
    assert claims.readings_verdict({"a": True, "b": True}) == "holds"
    assert claims.readings_verdict({"a": False, "b": False}) == "wrong"


def test_more_experiments_by_hand():
    from attention_ref.documents import experiments as exm
    d = 512
    r = exm.params_001_readings(d, 8)
    assert r["001"] == {"single": 3 * d * d, "multi": 7 * d * d}
    assert r["split"] == {"single": 4 * d * d, "multi": 4 * d * d}
    assert exm.big_o_exponents("O(N^2 D)") == {"n": 2, "d": 1} and exm.big_o_exponents("O(n^2)") == {"n": 2, "d": 0}
    g = exm.growth_exponents()
    assert g["time_n"] == pytest.approx(2) and g["space_d_fixed_dk"] == pytest.approx(1)
    assert abs(g["space_d_fixed_h"]) < 1e-9
    assert g["space_fixed_dk"] == {D: (D // 4) * 64 * 64 for D in (16, 32, 64)}  # H N^2 = N^2 D / d_k
    # the argmax limit: counts by hand, singular values of the selection matrix
    lim = exm.argmax_spectrum(n=64, d_k=16)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((64, 16)), rng.standard_normal((64, 16))
    sel = np.zeros((64, 64))
    for i in range(64):
        sel[i, int(np.argmax(q[i] @ k.T))] = 1.0
    sv = np.linalg.svd(sel, compute_uv=False)
    np.testing.assert_allclose(sv[:lim["distinct"]], lim["singular_values"], atol=1e-12)
    assert np.linalg.matrix_rank(sel) == lim["distinct"] == 34
    hard = ex.softmax_spectrum(scale=1000.0)
    assert np.abs(hard[:34] - lim["singular_values"]).max() < 1e-3 and hard[34:].max() < 1e-3
    # 004's view: numpy reshape raises for odd N, mixes tokens for even N
    assert exm.view_004(1)["raises"] and exm.view_004(3)["raises"]
    assert exm.view_004(2)["tokens_per_position"] == [[0], [0, 1], [1]]
    # least squares: the reviewer's numbers
    lsq = exm.input_least_squares()
    assert lsq["both"]["worst"] == pytest.approx(1.26, abs=0.01)
    np.testing.assert_allclose(lsq["head2"]["x"], [-2.63, 1.89, 6.41], atol=0.01)
    assert lsq["head2"]["worst"] < 0.05 < lsq["head1"]["worst"] and lsq["bias_is_x_plus_1"] < 1e-12
    b = exm.blockwise_and_linear()
    assert b["flash_error"] < 1e-12 and b["flash_largest"] < b["n"] ** 2 and b["linear_difference"] > 0.1
    assert exm.direct_path() > 0 and exm.rope_relative()["toeplitz_error"] < 1e-12
    w = exm.head_width_efficiency()
    assert w["madds_full"] == 8 * w["madds_split"] and w["qkv"] == 3 * 64 * 64


def test_two_head_printed_concat_row_major():
    t = documents.TWO_HEAD
    flat = [v for row in t["W_O_as_printed"] for v in row]
    row_major = [flat[3 * i:3 * i + 3] for i in range(4)]
    out = matvec(list(t["printed_concat"]), row_major)
    assert out == pytest.approx([285.23, 291.97, 298.71], abs=1e-9)
    np.testing.assert_allclose(two_head_example().output_from_printed_concat_row_major[0], out, atol=1e-12)


def test_hull_wins_are_counted_beyond_a_tie():
    """Which of two tied scores rounding puts on top depends on the CPU and the NumPy version
    (the 0.1-degree circle passes exactly through the tie directions); a win must be by more
    than HULL_TIE_TOL of the largest score, so the counts are the same on every machine."""
    one_ulp_above = np.array([[10.0, np.nextafter(10.0, 11.0), 10.0, 4.0]])  # (T=1, 4 keys)
    assert not ex._beats(one_ulp_above, 1).any() and not ex._beats(one_ulp_above, 0).any()
    clearly_above = np.array([[10.0, 10.0 + 1e-6, 10.0, 4.0]])
    assert ex._beats(clearly_above, 1).all()
    search = ex.hull_single_query_search()
    assert search["best_margin_k3"] == 0.0  # the tie at q = (1, 1) direction, never a win
    assert sum(search["strictly_first"]) < search["n_queries"]  # the tie directions win for no key
