"""benchmarks/bench_train.py runs (a tiny Llama, one thread, attention_ref only: this leg has no torch),
writes only the file asked for, and counts the FLOPs of a step from the parameters; the run against
torch is in tests/interop/test_bench_train_against_torch.py."""
import importlib.util
import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "benchmarks" / "bench_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_prints_one_row_and_writes_only_out(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "table.md"
    assert bench.main(["--quick", "--no-torch", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed and sorted(p.name for p in tmp_path.iterdir()) == ["table.md"]
    rows = re.findall(r"^\| (tiny Llama[^|]*) \| 16 \| 1 \| ([\d.]+) \| - \| - \| (\d+) \| - \|$", printed, flags=re.M)
    assert len(rows) == 1 and float(rows[0][1]) > 0, printed
    assert "`python benchmarks/bench_train.py --quick --no-torch`" in printed


def test_every_family_has_a_small_row_at_width_256():
    import attention_ref as ar
    from attention_ref.models.families import FAMILY_NAMES

    table = _bench().rows(quick=False)
    assert [d["model_type"] for d, _ in table.values()] == ["llama", *FAMILY_NAMES]
    for name, (config_dict, T) in list(table.items())[1:]:
        config = ar.LMConfig.from_dict(config_dict)
        assert config.d_model == 256 and config.vocab_size == 8192 and T == 128, name


def test_flops_count_each_matrix_weight_six_times_per_token_and_the_scores():
    """GPT-2 (tied): every 2-D weight but wpe, the tied table as the head; 12 T^2 H Dh per layer."""
    import attention_ref as ar

    bench = _bench()
    config = ar.LMConfig.from_dict({**bench.rows(quick=False)["gpt2, small"][0]})
    params = ar.init_lm_params(config, seed=0, dtype=np.float32)
    T = 8
    weights = sum(w.size for k, w in params.items() if w.ndim == 2 and k != "wpe")
    expected = 6 * T * weights + 12 * T * T * config.d_model * config.num_layers
    assert bench.matmul_flops(params, config, T) == expected
