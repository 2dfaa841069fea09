"""Every example script runs, prints the numbers the claims table asserts, fits 80
columns and writes its figures when asked."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def load(name):
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(EXAMPLES))


def run(capsys, name, *argv):
    assert load(name).main(list(argv)) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80, name
    return out


def test_worked_examples(capsys):
    out = run(capsys, "worked_examples")
    assert "  q.k = 0.04 + 0.1 + 0.18 = 0.32\n" in out
    assert "q.k / sqrt(3)  = 0.1848                   document: 0.2598 (differs)" in out
    assert "output         = [234.76, 258.92, 283.08]" in out


def test_scaling_and_saturation(capsys):
    out = run(capsys, "scaling_and_saturation")
    rows = {int(line.split()[0]): line.split() for line in out.splitlines()
            if line.strip() and line.split()[0].isdigit()}
    assert sorted(rows) == [1, 4, 16, 64, 256, 1024]
    from attention_ref.documents.experiments import saturation, score_variance
    for d_k, cells in rows.items():  # every printed number is the experiment's, rounded
        v, vs = score_variance(d_k)
        raw, scaled = saturation(d_k, False), saturation(d_k, True)
        assert cells[1:] == [f"{v:.1f}", f"{vs:.3f}", "|", f"{raw.max_weight:.3f}", f"{scaled.max_weight:.3f}",
                             "|", f"{raw.grad_norm:.1e}", f"{scaled.grad_norm:.3f}"]
    assert float(rows[1024][1]) == pytest.approx(1024, rel=0.05)  # Var(q.k) ~ d_k
    assert float(rows[1024][2]) == pytest.approx(1.0, rel=0.05)  # scaled ~ 1
    assert float(rows[1024][4]) > 0.95 and float(rows[1024][7]) < 1e-4  # saturated, no gradient
    assert float(rows[1024][5]) < 0.45 and float(rows[1024][8]) > 0.3  # scaled: neither


def test_convex_hull(capsys, tmp_path):
    out = run(capsys, "convex_hull", "--plots", str(tmp_path))
    assert "strictly first per key: [9846, 9763, 0, 3990]" in out
    assert "hull vertices: [1, 2, 4]" in out
    assert "per-token min over the two heads: [0, 0, 5, 2] -> k3" in out
    assert (tmp_path / "convex_hull.png").exists()


def test_parameter_count(capsys):
    out = run(capsys, "parameter_count")
    assert "    512   8   1,048,576   1,048,576   1,050,624    1,050,624" in out
    assert "  1 kv heads: 589,824" in out  # 2 d^2 + 2 d d_k = 524,288 + 65,536
    assert "separate heads vs parallel form: max |difference| < 1e-12" in out
    assert "Concat W^O: max |difference| < 1e-12" in out


def test_cost_and_low_rank(capsys, tmp_path):
    out = run(capsys, "cost_and_low_rank", "--plots", str(tmp_path))
    assert "N = 10,000:   100,000,000 (causal 50,005,000)" in out
    assert "   128     524,288      131,072    65,536   6,144" in out
    assert "90% energy in 15, nonzero 64" in out
    assert "MQA: 1 kv heads, 9,216 parameters, KV cache 2,048 bytes" in out
    assert (tmp_path / "singular_values.png").exists()


def test_claims_script(capsys, tmp_path):
    assert load("claims").main(["--check"]) == 0
    target = tmp_path / "claims.md"
    assert load("claims").main(["--write", str(target)]) == 0
    assert load("claims").main(["--check", str(target)]) == 0
    target.write_text("stale")
    assert load("claims").main(["--check", str(target)]) == 1
    capsys.readouterr()
