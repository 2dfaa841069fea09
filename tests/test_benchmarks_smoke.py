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


def _load(script=BENCH):
    """The benchmark script ``script`` (bench_mha.py unless named) as a module."""
    spec = importlib.util.spec_from_file_location(script.stem, script)
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


def test_the_two_timed_paths_are_the_fast_path_and_the_reference_and_agree():
    bench = _load()
    fast_pair, reference_pair = bench._pair("fast"), bench._pair("reference")
    assert fast_pair == (ar.fast.multi_head_attention_forward_fast, ar.fast.multi_head_attention_backward_fast)
    assert reference_pair == (ar.core.multi_head_attention_forward, ar.core.multi_head_attention_backward)
    assert fast_pair[0] is not reference_pair[0] and fast_pair[1] is not reference_pair[1]
    x, dout, p = bench._inputs(np, 2, 5, 8, "float64")
    (fast_out, fast_cache), (ref_out, ref_cache) = (forward(x, x, x, p, 2) for forward, _ in (fast_pair, reference_pair))
    assert_close(fast_out, ref_out, what="out")
    fast_grads, ref_grads = fast_pair[1](dout, fast_cache), reference_pair[1](dout, ref_cache)
    for what, f, r in zip(("dquery", "dkey", "dvalue"), fast_grads[:3], ref_grads[:3]):
        assert_close(f, r, what=what)
    for name, g in ref_grads[3].items():
        assert_close(fast_grads[3][name], g, what=name)


def test_quick_run_writes_the_table_with_both_paths(tmp_path):
    bench = _load()
    out = tmp_path / "table.md"
    assert bench.main(["--quick", "--no-torch", "--repeats", "1", "--out", str(out)]) == 0
    table = out.read_text()
    header = next(line for line in table.splitlines() if line.startswith("| dtype"))
    assert "| fast ms |" in header and "| reference ms |" in header and "| reference / fast |" in header
    assert "ours" not in table and "naive" not in table and "one piece" not in table
    rows = [line for line in table.splitlines() if line.startswith("| float")]
    assert len(rows) == 2 * len(bench.QUICK_CONFIGS)
    raw = json.loads(out.with_suffix(".json").read_text())
    assert bench.schema_problem(raw) is None
    assert {r["flops"] for r in raw["numpy"]["rows"]} == {bench.mha_flops(B, N, 16, 2) for B, N in bench.QUICK_CONFIGS}
    for r in raw["numpy"]["rows"]:
        for path in ("fast", "reference"):
            assert r[path]["min"] <= r[path]["median"] <= r[path]["max"] and r[path]["rounds"] == 1
            assert r[path + "_memory"]["traced"] > 0  # each path's memory, from its own first round
        assert r["peak"] > 0  # the matmul peak, from the fast path's process
    tricks = raw["numpy"]["tricks"]
    assert tricks["N"] == bench.QUICK_CONFIGS[-1][1]
    assert len(tricks["float32"]) == len(tricks["float64"]) == 9
    assert all(before > 0 and after > 0 for _, before, after in tricks["float32"] + tricks["float64"])
    assert "| softmax over cache-sized row blocks (vs one pass per step) |" in table
    assert raw["torch"] is None
    assert raw["machine"]["cores"] and raw["machine"]["numpy"] == np.__version__
    assert len(raw["date"]) == len("YYYY-MM-DD")


def test_tricks_switch_the_fast_path_s_constants_off_only_during_their_call(monkeypatch):
    from attention_ref.fast import attention, row_blocks

    bench = _load()
    seen = []
    real = row_blocks.rows_per_block
    monkeypatch.setattr(row_blocks, "rows_per_block",
                        lambda *a: seen.append((row_blocks.BLOCK_ELEMENTS, attention.QUERY_BLOCK_ELEMENTS)) or real(*a))
    defaults = (row_blocks.BLOCK_ELEMENTS, attention.QUERY_BLOCK_ELEMENTS)
    rows = bench.tricks_worker(np, 32, 16, 2, "float64", 1)
    assert len(rows) == 9 and all(before > 0 and after > 0 for _, before, after in rows)
    assert (row_blocks.BLOCK_ELEMENTS, attention.QUERY_BLOCK_ELEMENTS) == defaults  # restored
    assert (1 << 62, defaults[1]) in seen and (defaults[0], 1 << 62) in seen and defaults in seen


def test_case_runs_one_case_and_refuses_to_write(tmp_path):
    bench = _load()
    out = tmp_path / "case.md"
    assert bench.main(["--quick", "--no-torch", "--repeats", "1", "--case", "float64:1:8", "--no-tricks",
                       "--out", str(out)]) == 0
    raw = json.loads(out.with_suffix(".json").read_text())
    assert [(r["dtype"], r["B"], r["N"]) for r in raw["numpy"]["rows"]] == [("float64", 1, 8)]
    assert "tricks" not in raw["numpy"] and "Each trick alone" not in out.read_text()
    for bad in (["--case", "float16:1:8"], ["--case", "float32:1"], ["--case", "float32:0:8"],
                ["--case", "float32:1:2048", "--write"], ["--case", "float32:1:2048", "--render"]):
        with pytest.raises(SystemExit):
            bench.main(bad)


def test_update_doc_replaces_only_the_marked_block(tmp_path):
    bench = _load()
    doc = tmp_path / "performance.md"
    doc.write_text("intro\n<!-- BEGIN bench_mha -->\nold table\n<!-- END bench_mha -->\noutro\n")
    assert bench._update_doc(doc, "| new |\n")
    assert doc.read_text() == "intro\n<!-- BEGIN bench_mha -->\n| new |\n<!-- END bench_mha -->\noutro\n"
    assert not bench._update_doc(doc, "| other |\n", "bench_mha readme")  # no such markers: untouched
    assert "| new |" in doc.read_text()


def _fake_run(with_torch=True):
    """One float32 case: the fast path 500 ms for 1e11 FLOPs (200 GFLOP/s) against a 400 GFLOP/s
    peak, the reference 1.5 s; PyTorch 400 ms with its default need_weights=True, 250 ms with
    need_weights=False."""
    row = {"dtype": "float32", "B": 1, "N": 2048, "D": 512, "h": 8, "flops": 10**11, "peak": 400.0,
           "fast": {"median": 0.5}, "reference": {"median": 1.5}}
    torch_row = {"dtype": "float32", "B": 1, "N": 2048, "torch": {"median": 0.4},
                 "torch_no_weights": {"median": 0.25}}
    machine = {"cpu": "Test CPU 3000", "cores": 4, "numpy": "2.0.0", "blas_threads": 4,
               "torch": "2.13.0" if with_torch else None, "torch_threads": 4 if with_torch else None}
    return {"numpy": {"rows": [row], "peak": {"float32": 400.0}, "numpy": "2.0.0"},
            "torch": {"rows": [torch_row], "torch": "2.13.0", "threads": 4} if with_torch else None,
            "machine": machine, "date": "2026-01-02"}


def test_readme_block_shows_the_fast_path_the_reference_both_torch_paths_and_the_machine():
    block = _load().readme_block(_fake_run())
    header, _, row = block.splitlines()[:3]
    assert header.startswith("| dtype | B | N | fast path | GFLOP/s | % of matmul peak | reference |")
    assert "`torch.nn.MultiheadAttention(..., need_weights=True)`" in header
    assert "`need_weights=False`" in header
    assert row == "| float32 | 1 | 2,048 | 500 ms | 200.0 | 50% | 1500 ms | 400 ms | 1.25 | 250 ms | 2.00 |"
    assert ("Run of 2026-01-02 (UTC) on Test CPU 3000, 4 cores; NumPy 2.0.0 (BLAS threads: 4),"
            " PyTorch 2.13.0 (4 threads).") in block
    assert "blocks" not in block


def test_readme_block_without_torch():
    block = _load().readme_block(_fake_run(with_torch=False))
    assert "| float32 | 1 | 2,048 | 500 ms | 200.0 | 50% | 1500 ms | - | - | - | - |" in block
    assert "PyTorch not installed" in block


def test_committed_tables_are_rendered_from_the_committed_run():
    """README.md, docs/performance.md and docs/performance_table.md hold what
    ``bench_mha.py --render`` makes of docs/performance_table.json: no hand-typed numbers."""
    bench = _load()
    run = json.loads((ROOT / "docs" / "performance_table.json").read_text())
    problem = bench.schema_problem(run)
    if problem:  # a run from before the fast path and the reference were timed apart
        pytest.skip(f"docs/performance_table.json: {problem}; regenerate it with python benchmarks/bench_mha.py --write")
    assert (ROOT / "docs" / "performance_table.md").read_text() == bench.docs_table(run)
    for doc, block, name in [("docs/performance.md", bench.docs_table(run), "bench_mha"),
                             ("docs/performance.md", bench.summary_block(run), "bench_mha summary"),
                             ("docs/performance.md", bench.targets_block(run), "bench_mha targets"),
                             ("README.md", bench.readme_block(run), "bench_mha readme")]:
        text = (ROOT / doc).read_text()
        begin = f"<!-- BEGIN {name} -->\n"
        assert begin + block + f"<!-- END {name} -->" in text, f"{doc}: run python benchmarks/bench_mha.py --render"


def _render_tree(tmp_path, run):
    """A copy of the repository's marked documents under ``tmp_path``, with ``run`` as the committed JSON."""
    (tmp_path / "docs").mkdir()
    for name in ("bench_mha", "bench_mha summary", "bench_mha targets"):
        with (tmp_path / "docs" / "performance.md").open("a") as doc:
            doc.write(f"text\n<!-- BEGIN {name} -->\nold\n<!-- END {name} -->\n")
    (tmp_path / "README.md").write_text("intro\n<!-- BEGIN bench_mha readme -->\nold\n<!-- END bench_mha readme -->\n")
    (tmp_path / "docs" / "performance_table.json").write_text(json.dumps(run))


def test_render_rewrites_every_marked_block_from_the_json(tmp_path, monkeypatch):
    bench = _load()
    run = _fake_run()
    _render_tree(tmp_path, run)
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    monkeypatch.setattr(bench, "TABLE", tmp_path / "docs" / "performance_table.md")
    assert bench.main(["--render"]) == 0
    assert (tmp_path / "docs" / "performance_table.md").read_text() == bench.docs_table(run)
    performance = (tmp_path / "docs" / "performance.md").read_text()
    for block in (bench.docs_table(run), bench.summary_block(run), bench.targets_block(run)):
        assert block in performance
    assert "old" not in performance
    assert bench.readme_block(run) in (tmp_path / "README.md").read_text()


def test_render_refuses_a_run_of_the_old_schema_and_writes_nothing(tmp_path, monkeypatch, capsys):
    bench = _load()
    old = _fake_run()
    row = old["numpy"]["rows"][0]
    row["ours"], row["ours_one_piece"], row["naive"] = row.pop("fast"), {"median": 0.6}, {"median": 2.0}
    del row["reference"]
    _render_tree(tmp_path, old)
    before = {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    monkeypatch.setattr(bench, "TABLE", tmp_path / "docs" / "performance_table.md")
    assert bench.main(["--render"]) == 1
    err = capsys.readouterr().err
    assert "'ours'" in err and "python benchmarks/bench_mha.py --write" in err
    assert {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()} == before


def _two_case_run(fast, reference, torch, torch_fused):
    """A run of two cases with the given medians (seconds), for the generated text."""
    rows, trows = [], []
    for dtype in ("float32", "float64"):
        rows.append({"dtype": dtype, "B": 1, "N": 2048, "D": 512, "h": 8, "flops": 10 ** 11,
                     "peak": 400.0, "fast": {"median": fast}, "reference": {"median": reference}})
        trows.append({"dtype": dtype, "B": 1, "N": 2048, "torch": {"median": torch},
                      "torch_no_weights": {"median": torch_fused}})
    return {"numpy": {"rows": rows, "peak": {"float32": 400.0, "float64": 200.0}, "numpy": "2.0"},
            "torch": {"rows": trows, "torch": "x", "threads": 2}}


def test_summary_and_targets_say_what_the_numbers_say():
    bench = _load()
    run = _two_case_run(fast=0.5, reference=2.0, torch=1.0, torch_fused=0.25)
    summary = bench.summary_block(run)
    assert "the fast path takes 0.50-0.50x its time (faster in 2 of 2 cases)" in summary
    assert "2.00-2.00x (faster in 0 of 2)" in summary
    assert "The reference takes 4.00-4.00x the fast path's time (the fast path faster in 2 of 2 cases)." in summary
    assert ("At B = 1, N = 2,048 float32 the fast path is 4.00x faster than the reference, the same maths"
            " without the speed tricks (0.50 s against 2.00 s).") in summary
    assert "blocks" not in summary and "naive" not in summary and "ours" not in summary
    targets = bench.targets_block(run)
    assert ("| float32, B = 1, N = 2048: fast / torch (need_weights=False) <= 1.25 | 2.00"
            " (need_weights=True: 0.50) | not met |") in targets
    assert "| float32, B = 4, N = 512: fast / torch (need_weights=False) <= 1.25 | not measured | - |" in targets
    assert "| >= 55% of the measured matmul peak, B = 1, N = 2048, float32 (fast path) | 50% | not met |" in targets
    assert "one piece" not in targets and "blocks" not in targets
    fast = bench.targets_block(_two_case_run(fast=0.3, reference=2.0, torch=1.0, torch_fused=0.25))
    assert "| float64, B = 1, N = 2048: fast / torch (need_weights=False) <= 1.25 | 1.20 (need_weights=True: 0.30) | met |" in fast
    slow = bench.targets_block(_two_case_run(fast=1.5, reference=2.0, torch=1.0, torch_fused=0.5))
    assert "| 3.00 (need_weights=True: 1.50) | not met |" in slow
    assert "1.50 s float32, 1.50 s float64 | not met |" in slow
    mixed = bench.summary_block(_two_case_run(fast=0.5, reference=0.4, torch=1.0, torch_fused=0.25))
    assert "The reference takes 0.80-0.80x the fast path's time (the fast path faster in 0 of 2 cases)." in mixed
    assert "the fast path is 1.25x slower than the reference, the same maths" in mixed


def test_table_has_the_fast_path_then_the_reference():
    bench = _load()
    run = _two_case_run(fast=0.5, reference=2.0, torch=1.0, torch_fused=0.25)
    run["numpy"]["rows"][0]["fast_memory"] = {"traced": 3 * 2 ** 20, "rss": 4 * 2 ** 20}
    run["numpy"]["rows"][0]["reference_memory"] = {"traced": 5 * 2 ** 20, "rss": None}
    del run["numpy"]["rows"][1]["peak"]  # no peak of its own process: the run's float64 peak, 200
    table = bench.make_table(run["numpy"], run["torch"])
    assert ("| float32 | 1 | 2048 | 500.0 | 200.0 | 50% | 2000.0 | 4.00 | 1000.0 | 0.50 | 250.0 | 2.00"
            " | 3 / 4 | 5 / - | - |") in table
    assert "| float64 | 1 | 2048 | 500.0 | 200.0 | 100% | 2000.0 | 4.00 |" in table


def test_profile_lists_every_step_and_refuses_to_write_quick_sizes(capsys):
    profile = _load(ROOT / "benchmarks" / "profile_mha.py")
    assert profile.main(["--quick", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    for step in ("1. projections", "3a. scores", "3b. softmax", "3c. P v", "6. output projection",
                 "b6. dW_o", "b3c. dv", "b3b. dS", "b3a. dq", "b2. merge", "b1. dW"):
        assert f"| {step}" in out, step
    assert "| 3b, of it: `np.exp`" in out  # a part of 3b, left out of the sum of the steps
    assert "the library's forward+backward on the fast path (`attention_ref.fast`)" in out
    assert "on the reference (`attention_ref.core`)" in out and "blocks on" not in out
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


def test_profile_leaves_a_part_of_a_step_out_of_the_sum(monkeypatch):
    """Every timing 1 ms: the sum counts the twelve steps, not the row that is a part of step 3b."""
    profile = _load(ROOT / "benchmarks" / "profile_mha.py")
    monkeypatch.setattr(profile, "_time", lambda fn, repeats: 1e-3)
    text = profile.table(1, 64, "float32", 1)
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| step")]
    assert len(rows) == 13 and sum("(not in the sum)" in line for line in rows) == 1
    assert "Sum of the steps 12 ms" in text
