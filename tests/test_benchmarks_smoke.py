"""The benchmark script runs, and its FLOP counter is right. Nothing here is timed."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

import attention_ref as ar
from tests._helpers import assert_close

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_mha.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_mha", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flop_count_on_hand_counted_cases():
    bench = _load()
    # B=1, N=2, D=2, h=1. Forward products, each (m,k)@(k,n) = 2*m*n*k:
    # Q, K, V, out projections (2,2)@(2,2): 4 * 16 = 64; scores (2,2)@(2,2): 16; P v: 16.
    # Forward 96; backward two products per forward product: 192; total 288.
    assert bench.mha_flops(1, 2, 2, 1) == 288
    # B=2, N=3, D=4, h=2 (d_k=2). Projections: 4 * 2*(6 rows)*4*4 = 768.
    # Per sequence and head: scores (3,2)@(2,3) = 36, P v (3,3)@(3,2) = 36; 2*2 of each: 288.
    # Forward 1056; total 3 * 1056 = 3168.
    assert bench.mha_flops(2, 3, 4, 2) == 3168


def test_naive_baseline_computes_the_same_maths():
    bench = _load()
    x, dout, p = bench._inputs(np, 2, 5, 8, "float64")
    out, dx, grads = bench.naive_fwd_bwd(np, x, dout, p, 2)
    ref_out, cache = ar.multi_head_attention_forward(x, x, x, p, 2)
    dquery, dkey, dvalue, ref_grads = ar.multi_head_attention_backward(dout, cache)
    assert_close(out, ref_out, what="out")
    assert_close(dx, dquery + dkey + dvalue, what="dx")
    for name, g in ref_grads.items():
        assert_close(grads[name], g, what=name)


def test_quick_run_writes_the_table(tmp_path):
    bench = _load()
    out = tmp_path / "table.md"
    assert bench.main(["--quick", "--no-torch", "--repeats", "1", "--out", str(out)]) == 0
    table = out.read_text()
    rows = [line for line in table.splitlines() if line.startswith("| float")]
    assert len(rows) == 2 * len(bench.QUICK_CONFIGS)
    raw = json.loads(out.with_suffix(".json").read_text())
    assert {r["flops"] for r in raw["numpy"]["rows"]} == {bench.mha_flops(B, N, 16, 2) for B, N in bench.QUICK_CONFIGS}
    assert raw["torch"] is None


def test_update_doc_replaces_only_the_marked_block(tmp_path):
    bench = _load()
    doc = tmp_path / "performance.md"
    doc.write_text("intro\n<!-- BEGIN bench_mha -->\nold table\n<!-- END bench_mha -->\noutro\n")
    bench._update_doc(doc, "| new |\n")
    assert doc.read_text() == "intro\n<!-- BEGIN bench_mha -->\n| new |\n<!-- END bench_mha -->\noutro\n"
