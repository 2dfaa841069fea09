"""benchmarks/bench_train.py runs (a tiny Llama, one thread, attention_ref only: this leg has no torch),
writes only the file asked for, and counts the FLOPs of a step from the parameters; the run against
torch is in tests/interop/test_bench_train_against_torch.py."""
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

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
    rows = re.findall(r"^\| (tiny Llama[^|]*) \| 16 \| 1 \| ([\d.]+) \| - \| - \| (\d+) \| - \| (\d+|-) \| - \|$", printed,
                      flags=re.M)
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


def test_rounds_pair_the_libraries_and_take_the_ratio_pair_by_pair(monkeypatch):
    """Three rounds whose speed drifts (x1, x3, x2) with ours always 0.9x torch's time: the paired
    ratio is 0.9 in every round, each library's median round is kept, the order swaps each round."""
    bench = _bench()
    slowdown, order = iter([1, 1, 3, 3, 2, 2]), []

    def spawn(library, config_dict, T, repeats, threads, extra_env=None, drop_results=False):
        order.append(library)
        seconds = (0.9 if library == "attention_ref" else 1.0) * next(slowdown)
        return {"seconds": seconds, "loss": 9.0, "flops": 1e9, "peak": 1e10}

    monkeypatch.setattr(bench, "_spawn", spawn)
    (result,) = bench.measure({"m": ({}, 16)}, [1], repeats=1, torch=True, rounds=3)
    assert order == ["attention_ref", "torch", "torch", "attention_ref", "attention_ref", "torch"]
    assert result["ratio"] == pytest.approx((0.9, 0.9, 0.9))
    assert result["attention_ref"]["seconds"] == pytest.approx(1.8) and result["torch"]["seconds"] == pytest.approx(2.0)
    assert "0.90 (0.90-0.90)" in bench.render([result], 1, "cmd", rounds=3)


def test_env_reaches_both_workers_and_bad_values_are_refused(monkeypatch, capsys):
    """``--env NAME=VALUE`` is in each library's process environment (beside the thread counts);
    a value without a name, or a thread variable, is refused by name."""
    bench = _bench()
    seen = []

    def run(command, **kwargs):
        seen.append(kwargs["env"])

        class Done:
            returncode, stderr = 0, ""
            stdout = '{"seconds": 1.0, "loss": 9.0, "flops": 1e9, "peak": 1e10, "faults": 12.0}\n'
        return Done()

    monkeypatch.setattr(bench.subprocess, "run", run)
    assert bench.main(["--quick", "--no-torch", "--env", "MALLOC_TRIM_THRESHOLD_=1073741824"]) == 0
    assert seen and all(env["MALLOC_TRIM_THRESHOLD_"] == "1073741824" and env["OMP_NUM_THREADS"] == "1" for env in seen)
    assert "| 12 | - |" in capsys.readouterr().out  # the page faults a step
    for bad in ("=3", "NOVALUE", "OMP_NUM_THREADS=4", "PYTHONPATH=/elsewhere"):
        with pytest.raises(SystemExit):
            bench.main(["--quick", "--no-torch", "--env", bad])
        assert "--env" in capsys.readouterr().err


def _alive_at_each_call(monkeypatch):
    """Patch ``attention_ref.lm_loss`` to record, at each call, which of its earlier results are still alive."""
    import gc
    import weakref

    import attention_ref as ar
    from attention_ref.models import lm

    class Result(list):  # the result, in a type a weak reference can follow
        pass

    real, alive_at_call, previous = lm.lm_loss, [], []  # the package's own, however often this patches ar

    def lm_loss(ids, params, config):
        gc.collect()
        alive_at_call.append([ref() is not None for ref in previous])
        result = Result(real(ids, params, config))
        previous.append(weakref.ref(result))
        return result

    monkeypatch.setattr(ar, "lm_loss", lm_loss)
    return alive_at_call


def test_our_worker_keeps_each_steps_result_until_the_next_step_returns(monkeypatch):
    """As a training loop does (``loss, grads, logits = lm_loss(...)``, then the update): while a step
    runs, the previous step's result is alive; it goes when the new one replaces it."""
    alive_at_call = _alive_at_each_call(monkeypatch)
    bench = _bench()
    ((config, _),) = bench.rows(quick=True).values()
    out = bench.worker("attention_ref", config, 4, 3, 1)
    assert out["seconds"] > 0 and np.isfinite(out["loss"])
    # the warm-up, then three steps: each runs with the last step's result alive, and only that one
    assert alive_at_call == [[], [True], [False, True], [False, False, True]]


def test_drop_results_reaches_our_worker_and_drops_each_result(monkeypatch):
    """``--drop-results``: the flag reaches our worker's process, and that worker keeps nothing between steps."""
    bench = _bench()
    commands = []

    def run(command, **kwargs):
        commands.append(command)

        class Done:
            returncode, stderr = 0, ""
            stdout = '{"seconds": 1.0, "loss": 9.0, "flops": 1e9, "peak": 1e10, "faults": 12.0}\n'
        return Done()

    monkeypatch.setattr(bench.subprocess, "run", run)
    assert bench.main(["--quick", "--no-torch", "--drop-results"]) == 0
    assert commands and all(c[-1] == "--drop-results" and "--worker" in c for c in commands)
    commands.clear()
    assert bench.main(["--quick", "--no-torch"]) == 0
    assert commands and not any("--drop-results" in c for c in commands)
    # the worker's own command line (what _spawn runs), with and without the flag
    ((config, _),) = bench.rows(quick=True).values()
    for flag, expected in ((["--drop-results"], [[], [False], [False, False]]), ([], [[], [True], [False, True]])):
        alive_at_call = _alive_at_each_call(monkeypatch)
        assert bench.main(["--worker", "attention_ref", json.dumps(config), "4", "2", "1", *flag]) == 0
        assert alive_at_call == expected, flag
