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
    rows = re.findall(r"^\| tiny Llama[^|]* \| 16 \| 1 \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| \d+ \| \d+ \| \d+ \| \d+ \|$",
                      printed, flags=re.M)
    assert len(rows) == 1 and all(float(v) > 0 for v in rows[0]), printed


@pytest.mark.parametrize("family", ["phi3", "gpt2", "gemma2", "qwen3_moe"])
def test_every_family_row_builds_transformers_model(family):
    """A family's small row, shrunk to a tiny vocabulary and T = 4: the torch worker builds the model
    (Phi-3's class default pad_token_id 32000 lies past the small vocabulary: no token pads) and its
    loss equals ours within float32's rounding."""
    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "benchmarks" / "bench_train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    ((config, _),) = bench.rows(False, [family]).values()  # its one small row
    config = {**config, "vocab_size": 300, **({"num_hidden_layers": 2} if "num_hidden_layers" in config else {})}
    ours, theirs = (bench.worker(library, config, 4, 1, 1) for library in ("attention_ref", "torch"))
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-4)
