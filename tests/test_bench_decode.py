"""benchmarks/bench_decode.py runs (tiny models, one round): it prints a table with a row per
model, the same tokens out of every library it timed, and --out writes only the file asked for."""
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_decode", ROOT / "benchmarks" / "bench_decode.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_prints_a_row_per_model_and_writes_only_out(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "table.md"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed and sorted(p.name for p in tmp_path.iterdir()) == ["table.md"]
    rows = re.findall(r"^\| (tiny [\w -]+?) \| ([\d.]+) \| ([\d.]+|-) \| ([\d.]+|-) \|$", printed, flags=re.M)
    assert [r[0] for r in rows] == ["tiny GPT-2", "tiny Llama", "tiny GPT-NeoX", "tiny Phi-3", "tiny Gemma 3", "tiny Gemma 2"], printed
    assert all(float(r[1]) > 0 for r in rows)
    assert "python benchmarks/bench_decode.py --quick" in printed


def test_the_libraries_must_give_the_same_tokens(monkeypatch):
    bench = _bench()
    results = iter([{"seconds": 1.0, "tokens": [1, 2]}, {"seconds": 1.0, "tokens": [1, 3]}])
    monkeypatch.setattr(bench, "_spawn", lambda library, config: next(results))
    monkeypatch.setattr(bench, "_has_transformers", lambda: True)
    try:
        bench.measure({"m": {}}, rounds=1)
    except RuntimeError as exc:
        assert "tokens differ" in str(exc)
    else:
        raise AssertionError("different tokens were reported")
