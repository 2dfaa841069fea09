"""``python -m attention_ref``: each section prints the key numbers, fits 80 columns, and a
failing gradient check makes the command fail."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attention_ref.documents import walkthrough

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv):
    code = walkthrough.main(list(argv))
    out = capsys.readouterr().out
    too_wide = [line for line in out.splitlines() if len(line) > 80]
    assert not too_wide, f"lines over 80 columns: {too_wide}"
    return code, out


def test_example_section(capsys):
    code, out = run(capsys, "--section", "example")
    assert code == 0
    for expected in ("Q_1            = [2.2, 2.8]", "document: [2.3, 3.5] (differs)",
                     "K_2            = [16.6, 17.2]", "/ sqrt(2) = 21.694", "a_1 = 1",
                     "head_2         = [20.2, 20.8]", "concat         = [9.4, 10, 20.2, 20.8]",
                     "output         = [234.76, 258.92, 283.08]", "document: [197.5, 208.7, 220]",
                     "[257.32, 263.36, 269.4]", "[261.33, 288.29, 315.25]",
                     "q.k / sqrt(3)  = 0.1848", "document: 0.2598 (differs)"):
        assert expected in out, expected
    # a value the document prints and we agree with says so; x has no document value beside it
    assert "x              = [1, 2, 3]\n" in out
    assert "alpha          = 1" in out and "document: 1 (agrees)" in out
    assert "[285.23, 291.97, 298.71]" in out and "The printed score is 0.45 / sqrt(3)" in out


def test_example_section_scores_match_numpy(capsys):
    """Step 2's numbers, recomputed with plain numpy from the documents' weights."""
    import math

    import numpy as np

    from attention_ref import documents
    t = documents.TWO_HEAD
    x = np.array(t["x"])
    _, out = run(capsys, "--section", "example")
    for i in range(2):
        dot = float((x @ np.array(t["W_Q"][i])) @ (x @ np.array(t["W_K"][i])))
        expected = (f"head {i + 1}: Q_{i + 1} K_{i + 1}^T = {round(dot, 4):g},"
                    f" / sqrt(2) = {round(dot / math.sqrt(2), 4):g}")
        assert expected in out, expected
    assert "Q_1 K_1^T = 30.68, / sqrt(2) = 21.694" in out and "Q_2 K_2^T = 449.72, / sqrt(2) = 318.0001" in out


def test_claims_section(capsys):
    code, out = run(capsys, "--section", "claims")
    assert code == 0
    for expected in ("[WRONG] 004-4.2-Q1", "[AMBIGUOUS] 004-4.2-WO-shape", "[HOLDS] 002-hull-single",
                     "[AMBIGUOUS] 000-space", "1,048,576"):
        assert expected in out, expected
    assert "claims" in out.splitlines()[3]
    from attention_ref.documents.claims import all_claims
    rows = all_claims()
    wrong = sum(r.verdict == "wrong" for r in rows)
    assert out.rstrip().endswith(f"{len(rows)} claims: {len(rows) - wrong - sum(r.verdict == 'ambiguous' for r in rows)}"
                                 f" holds, {wrong} wrong, {sum(r.verdict == 'ambiguous' for r in rows)} ambiguous.")


def test_gradcheck_section(capsys):
    code, out = run(capsys, "--section", "gradcheck")
    assert code == 0
    names = [case[0] for case in walkthrough.gradcheck_cases()]
    for name in names:
        line = next(l for l in out.splitlines() if l.startswith(name))
        assert line.endswith("ok"), line
    assert {"linear  y = x W + b", "softmax (rows)", "split heads", "merge heads",
            "multi-head, parallel", "multi-head, separate heads"} <= set(names)
    assert "all gradients agree" in out


def test_a_wrong_backward_fails_the_command(capsys, monkeypatch):
    from attention_ref import softmax_forward

    def wrong_softmax_backward_diagonal_only(dy, cache):
        return cache.y * (1 - cache.y) * dy  # keeps only the Jacobian's diagonal

    x = np.random.default_rng(0).standard_normal((2, 4))
    monkeypatch.setattr(walkthrough, "gradcheck_cases", lambda: [
        ("wrong softmax", softmax_forward, wrong_softmax_backward_diagonal_only, (x,), ["x"])])
    code, out = run(capsys, "--section", "gradcheck")
    assert code == 1
    assert "FAIL" in out and "GRADIENT CHECK FAILED" in out


def test_plots_option(capsys, tmp_path, monkeypatch):
    from attention_ref.plot import figures  # every figure renders in test_plot; two cheap ones here
    monkeypatch.setattr(figures, "FIGURES", {"convex_hull.png": figures.convex_hull,
                                             "singular_values.png": figures.singular_value_spectra})
    code = walkthrough.main(["--section", "example", "--plots", str(tmp_path)], save_figures=figures.save_all)
    out = capsys.readouterr().out
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["convex_hull.png", "singular_values.png"]
    assert f"wrote {tmp_path / 'convex_hull.png'}" in out
    with pytest.raises(SystemExit):  # without the plot layer's function there is nothing to save
        walkthrough.main(["--section", "example", "--plots", str(tmp_path)])


def test_module_entry_point_saves_the_figures(tmp_path):
    result = subprocess.run([sys.executable, "-m", "attention_ref", "--section", "example", "--plots",
                             str(tmp_path)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    from attention_ref.plot import FIGURES
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FIGURES)


def test_module_entry_point_runs_every_section():
    result = subprocess.run([sys.executable, "-m", "attention_ref"], cwd=ROOT, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr
    for title in ("1. THE TWO-HEAD EXAMPLE", "2. THE CLAIMS, ONE LINE EACH", "3. GRADIENT CHECKS"):
        assert title in result.stdout
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert len(lines) <= 210, f"{len(lines)} lines: the walkthrough must not scroll away (about 200)"
    assert lines[-6:] == walkthrough.NEXT_STEPS.splitlines()[-6:]  # it ends with where to go next
    assert "2. THE CLAIMS TABLE" not in result.stdout  # the notes are one flag away


def test_summary_has_one_line_per_claim_with_the_correction(capsys):
    from attention_ref.documents.claims import all_claims

    code, out = run(capsys, "--section", "summary")
    claims = all_claims()
    for c in claims:
        assert sum(f" {c.id} " in line for line in out.splitlines()) == 1, c.id
    wrong = next(c for c in claims if c.id == "004-4.1-score")
    assert f"correct {wrong.computed}, printed {wrong.printed}" in out
    for c in claims:  # a wrong claim's correct value is never cut
        if c.verdict == "wrong":
            assert f"{c.id:<22} correct {c.computed}," in out, c.id
    assert out.rstrip().endswith(f"{len(claims)} claims: 33 holds, 11 wrong, 15 ambiguous.")


def test_bad_section_is_rejected(capsys):
    with pytest.raises(SystemExit):
        walkthrough.main(["--section", "nope"])
