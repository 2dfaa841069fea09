"""The benchmark script runs, its FLOP counter is right, and the README's table is rendered from
the committed run. Nothing here is timed."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import attention_ref as ar
from tests._helpers import assert_close

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench_mha.py"


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
    assert raw["machine"]["cores"] and raw["machine"]["numpy"] == np.__version__
    assert len(raw["date"]) == len("YYYY-MM-DD")


def test_blocks_ab_prints_both_medians_and_the_rule(capsys):
    bench = _load()
    assert bench.main(["--quick", "--repeats", "1", "--blocks-ab", "1"]) == 0
    out = capsys.readouterr().out
    assert "| dtype | B | N | with the blocks ms (median of the pairs) | in one piece ms | gain |" in out
    assert out.count("| float32 | 2 | 16 |") == 1 and out.count("| float64 | 2 | 16 |") == 1
    assert "1 alternating pairs of fresh processes per case; the rule" in out
    for other in ("--write", "--render"):
        with pytest.raises(SystemExit):
            bench.main(["--blocks-ab", "1", other])


def test_update_doc_replaces_only_the_marked_block(tmp_path):
    bench = _load()
    doc = tmp_path / "performance.md"
    doc.write_text("intro\n<!-- BEGIN bench_mha -->\nold table\n<!-- END bench_mha -->\noutro\n")
    assert bench._update_doc(doc, "| new |\n")
    assert doc.read_text() == "intro\n<!-- BEGIN bench_mha -->\n| new |\n<!-- END bench_mha -->\noutro\n"
    assert not bench._update_doc(doc, "| other |\n", "bench_mha readme")  # no such markers: untouched
    assert "| new |" in doc.read_text()


def _fake_run(with_torch=True):
    """One float32 case: 500 ms for 1e11 FLOPs (200 GFLOP/s) against a 400 GFLOP/s peak;
    PyTorch 400 ms with its default need_weights=True, 250 ms with need_weights=False."""
    row = {"dtype": "float32", "B": 1, "N": 2048, "D": 512, "h": 8, "flops": 10**11, "peak": 400.0,
           "ours": {"median": 0.5}}
    torch_row = {"dtype": "float32", "B": 1, "N": 2048, "torch": {"median": 0.4},
                 "torch_no_weights": {"median": 0.25}}
    machine = {"cpu": "Test CPU 3000", "cores": 4, "numpy": "2.0.0", "blas_threads": 4,
               "torch": "2.13.0" if with_torch else None, "torch_threads": 4 if with_torch else None}
    return {"numpy": {"rows": [row], "peak": {"float32": 400.0}},
            "torch": {"rows": [torch_row], "torch": "2.13.0", "threads": 4} if with_torch else None,
            "machine": machine, "date": "2026-01-02"}


def test_readme_block_shows_both_torch_paths_and_the_machine():
    block = _load().readme_block(_fake_run())
    header, _, row = block.splitlines()[:3]
    assert "`torch.nn.MultiheadAttention(..., need_weights=True)`" in header
    assert "`need_weights=False`" in header
    assert row == "| float32 | 1 | 2,048 | 500 ms | 200.0 | 50% | 400 ms | 1.25 | 250 ms | 2.00 |"
    assert ("Run of 2026-01-02 (UTC) on Test CPU 3000, 4 cores; NumPy 2.0.0 (BLAS threads: 4),"
            " PyTorch 2.13.0 (4 threads).") in block


def test_readme_block_without_torch():
    block = _load().readme_block(_fake_run(with_torch=False))
    assert "| float32 | 1 | 2,048 | 500 ms | 200.0 | 50% | - | - | - | - |" in block
    assert "PyTorch not installed" in block


def test_committed_tables_are_rendered_from_the_committed_run():
    """README.md, docs/performance.md and docs/performance_table.md hold what
    ``bench_mha.py --render`` makes of docs/performance_table.json: no hand-typed numbers."""
    bench = _load()
    run = json.loads((ROOT / "docs" / "performance_table.json").read_text())
    assert (ROOT / "docs" / "performance_table.md").read_text() == bench.docs_table(run)
    for doc, block, name in [("docs/performance.md", bench.docs_table(run), "bench_mha"),
                             ("docs/performance.md", bench.summary_block(run), "bench_mha summary"),
                             ("docs/performance.md", bench.targets_block(run), "bench_mha targets"),
                             ("README.md", bench.readme_block(run), "bench_mha readme")]:
        text = (ROOT / doc).read_text()
        begin = f"<!-- BEGIN {name} -->\n"
        assert begin + block + f"<!-- END {name} -->" in text, f"{doc}: run python benchmarks/bench_mha.py --render"


def _two_case_run(ours, torch, torch_fused, naive, one_piece=None):
    """A run of two cases with the given medians (seconds), for the generated text."""
    rows, trows = [], []
    for dtype in ("float32", "float64"):
        rows.append({"dtype": dtype, "B": 1, "N": 2048, "D": 512, "h": 8, "flops": 10 ** 11,
                     "peak": 400.0, "ours": {"median": ours},
                     "separate_heads": {"median": ours}, "naive": {"median": naive}})
        if one_piece is not None:
            rows[-1]["ours_one_piece"] = {"median": one_piece}
        trows.append({"dtype": dtype, "B": 1, "N": 2048, "torch": {"median": torch},
                      "torch_no_weights": {"median": torch_fused}})
    return {"numpy": {"rows": rows, "peak": {"float32": 400.0, "float64": 200.0}, "block_threads": 2, "numpy": "2.0"},
            "torch": {"rows": trows, "torch": "x", "threads": 2}}


def test_summary_and_targets_say_what_the_numbers_say():
    bench = _load()
    run = _two_case_run(ours=0.5, torch=1.0, torch_fused=0.25, naive=2.0)
    summary = bench.summary_block(run)
    assert "0.50-0.50x its time (faster in 2 of 2 cases)" in summary
    assert "2.00-2.00x (faster in 0 of 2)" in summary
    assert "4.0x faster than the same maths written naively" in summary
    assert "blocks" not in summary  # not measured in this run
    targets = bench.targets_block(run)
    assert ("| float32, B = 1, N = 2048: ours / torch (need_weights=False) <= 1.25 | 2.00"
            " (need_weights=True: 0.50) | not met |") in targets
    assert "| float32, B = 4, N = 512: ours / torch (need_weights=False) <= 1.25 | not measured | - |" in targets
    assert "| >= 55% of the measured matmul peak, B = 1, N = 2048, float32 | 50% | not met |" in targets
    assert "one piece" not in targets
    fast = bench.targets_block(_two_case_run(ours=0.3, torch=1.0, torch_fused=0.25, naive=2.0))
    assert "| float64, B = 1, N = 2048: ours / torch (need_weights=False) <= 1.25 | 1.20 (need_weights=True: 0.30) | met |" in fast
    slow = bench.targets_block(_two_case_run(ours=1.5, torch=1.0, torch_fused=0.5, naive=2.0))
    assert "| 3.00 (need_weights=True: 1.50) | not met |" in slow
    assert "1.50 s float32, 1.50 s float64 | not met |" in slow


@pytest.mark.parametrize("one_piece, faster, met", [(0.625, "by 20%, 20%", "met"), (0.52, "by 4%, 4%", "not met"),
                                                     (0.4, "faster in 0 of 2", "not met")])
def test_the_blocks_rule_is_judged_from_the_one_piece_times(one_piece, faster, met):
    bench = _load()
    run = _two_case_run(ours=0.5, torch=1.0, torch_fused=0.25, naive=2.0, one_piece=one_piece)
    line = bench.targets_block(run).splitlines()[-1]
    assert line.startswith("| the blocks on threads: faster than one piece at every size, by >= 10%")
    assert faster in line and line.endswith(f"| {met} in this run |")
    assert f"With the (batch, head) blocks on 2 threads ours takes {0.5 / one_piece:.2f}-{0.5 / one_piece:.2f}x" in \
        bench.summary_block(run)
    table = bench.make_table(run["numpy"], run["torch"])
    assert f"| 50% | {one_piece * 1e3:.1f} | 500.0 |" in table


def test_profile_lists_every_step_and_refuses_to_write_quick_sizes(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("profile_mha", ROOT / "benchmarks" / "profile_mha.py")
    profile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(profile)
    assert profile.main(["--quick", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    for step in ("1. projections", "3a. scores", "3b. softmax", "3c. P v", "6. output projection",
                 "b6. dW_o", "b3c. dv", "b3b. dS", "b3a. dq", "b2. merge", "b1. dW"):
        assert f"| {step}" in out, step
    assert "the library's forward+backward" in out
    with pytest.raises(SystemExit):
        profile.main(["--quick", "--write"])
    doc = (ROOT / "docs" / "performance.md").read_text()
    block = doc.split("<!-- BEGIN profile_mha -->", 1)[1].split("<!-- END profile_mha -->", 1)[0]
    assert "Measured on" in block and "| b3b. dS" in block  # the committed table, regenerated with --write


def test_peak_memory_sees_the_arrays_a_call_makes():
    bench = _load()
    size = 16 * 2 ** 20

    def make():
        a = np.ones(size // 8)  # 16 MiB, filled: resident
        return float(a.sum())

    memory = bench.peak_memory(make)
    assert memory["traced"] >= size  # tracemalloc sees NumPy's allocations
    assert memory["rss"] is None or memory["rss"] >= 0  # the kernel's high-water mark, where it can be reset
    assert bench.peak_memory(make, traced=False)["traced"] is None
    assert bench._mib(None) == "-" and bench._mib(3 * 2 ** 20) == "3"
