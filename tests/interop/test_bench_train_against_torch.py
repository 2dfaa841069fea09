"""benchmarks/bench_train.py --quick against torch autograd (the interop leg: it needs torch and
transformers): one row, both libraries timed, the same loss (the script refuses a row otherwise)."""
import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_times_both_libraries(capsys):
    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "benchmarks" / "bench_train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--quick"]) == 0
    printed = capsys.readouterr().out
    rows = re.findall(r"^\| tiny Llama[^|]* \| 16 \| 1 \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| \d+ \| \d+ \|$",
                      printed, flags=re.M)
    assert len(rows) == 1 and all(float(v) > 0 for v in rows[0]), printed
