"""benchmarks/bench_decode.py runs (tiny models, one round): it prints a table with a row per
model (weights read per token, the bandwidth bound, prefill apart from the decode steps), the same
tokens out of every library it timed, and --out writes only the file asked for."""
import importlib.util
import re

import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench():
    return _script("bench_decode")


def test_quick_run_prints_a_row_per_model_and_writes_only_out(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "table.md"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed and sorted(p.name for p in tmp_path.iterdir()) == ["table.md"]
    number, maybe, span = r"([\d.]+)", r"([\d.]+|-)", r"([\d.]+-[\d.]+|-)"
    rows = re.findall(rf"^\| (tiny [\w -]+?) \| {number} \| {number} \| {number}, {maybe} \| {number} \| {maybe} \|"
                      rf" {maybe} \| {span} \| {number} \| {maybe} \|$", printed, flags=re.M)
    assert [r[0] for r in rows] == ["tiny GPT-2", "tiny Llama", "tiny GPT-NeoX", "tiny Phi-3", "tiny Gemma 3", "tiny Gemma 2"], printed
    assert all(float(r[1]) > 0 and float(r[2]) > 0 and float(r[3]) > 0 and float(r[5]) > 0 for r in rows)
    assert "python benchmarks/bench_decode.py --quick" in printed
    assert re.search(r"Read bandwidth in the same run: [\d.]+ GB/s", printed), printed


def test_weights_read_per_token_count_a_looked_up_table_as_one_row():
    """GPT-2 (tied): everything but wpe whole, one row of wpe; GPT-NeoX (untied): embed_in one row,
    the head whole."""
    import numpy as np

    import attention_ref as ar

    bench = _bench()
    for name, lookups in (("tiny GPT-2", ["wpe"]), ("tiny GPT-NeoX", ["embed_in"])):
        config = ar.LMConfig.from_dict(bench.QUICK[name])
        params = ar.init_lm_params(config, seed=0, dtype=np.float32)
        expected = sum(w.nbytes for k, w in params.items() if k not in lookups) + sum(
            params[k][0].nbytes for k in lookups)
        assert bench.weight_bytes_per_token(params, config) == expected, name


def test_the_libraries_must_give_the_same_tokens(monkeypatch):
    bench = _bench()
    results = iter([{"seconds": 1.0, "prefill": 0.1, "tokens": [1, 2], "weight_bytes": 10},
                    {"seconds": 1.0, "prefill": 0.1, "tokens": [1, 3], "weight_bytes": 10}])
    monkeypatch.setattr(bench, "_spawn", lambda library, config: {"bytes_per_s": 1e9} if library == "bandwidth"
                        else next(results))
    monkeypatch.setattr(bench, "_has_transformers", lambda: True)
    try:
        bench.measure({"m": {}}, rounds=1)
    except RuntimeError as exc:
        assert "tokens differ" in str(exc)
    else:
        raise AssertionError("different tokens were reported")


def test_ratios_and_shares_of_the_bound_are_taken_round_by_round(monkeypatch):
    """Three rounds in which the machine's speed drifts (x1, x2, x4) and ours is always 1.25x as fast:
    the paired ratio is exactly 1.25 with no spread, and each round's share of the bound uses that
    round's bandwidth (here slowed alike: 40% every round); the libraries' order swaps each round."""
    bench = _bench()
    slowdown = iter([1, 1, 1, 2, 2, 2, 4, 4, 4])
    order = []

    def spawn(library, config):
        k = next(slowdown)
        order.append(library)
        if library == "bandwidth":
            return {"bytes_per_s": 1e9 / k}
        steps = (0.8 if library == "attention_ref" else 1.0) * k  # seconds for the 31 decode steps
        return {"seconds": 0.5 + steps, "prefill": 0.5, "tokens": [1, 2], "weight_bytes": int(0.8e9 / 31 * 0.4)}

    monkeypatch.setattr(bench, "_spawn", spawn)
    monkeypatch.setattr(bench, "_has_transformers", lambda: True)
    (row,) = bench.measure({"m": {}}, rounds=3)
    assert order == ["bandwidth", "attention_ref", "transformers", "bandwidth", "transformers", "attention_ref",
                     "bandwidth", "attention_ref", "transformers"]
    assert row["ratio"] == pytest.approx((1.25, 1.25, 1.25))
    assert row["of_bound"]["attention_ref"] == pytest.approx(0.4)
    assert row["tokens_per_s"]["attention_ref"] == pytest.approx(31 / 1.6)  # the median round's rate


def test_profile_decode_counts_each_product_once(capsys):
    """benchmarks/profile_decode.py on the tiny Llama, one step: 2 layers of 7 products (q, k, v, o,
    gate, up, down) and the head, and the products read every weight but the looked-up table once."""
    module = _script("profile_decode")
    assert module.main(["--quick", "--steps", "1", "--model", "tiny Llama"]) == 0
    printed = capsys.readouterr().out
    (row,) = re.findall(r"^\| tiny Llama \| ([\d.]+) \| ([\d.]+) \| (\d+) \| (\d+) \|", printed, flags=re.M)
    weights, read, products, calls = float(row[0]), float(row[1]), int(row[2]), int(row[3])
    assert products == 15 and calls > 0, printed
    assert read == pytest.approx(weights, abs=0.002), printed  # the norms' weights are not products: a few bytes


def test_profile_decode_layouts_runs_every_shape(capsys):
    """``--layouts --quick``: one row per shape of the decoding rows, both layouts' rates positive."""
    module = _script("profile_decode")
    assert module.main(["--layouts", "--quick"]) == 0
    printed = capsys.readouterr().out
    rows = re.findall(r"^\| (\d+) x (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| (rows|columns) \|$", printed, flags=re.M)
    assert [(int(a), int(b)) for a, b, *_ in rows] == list(module.LAYOUT_SHAPES), printed
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows), printed
    assert "python benchmarks/profile_decode.py --layouts --quick" in printed


def test_weights_read_per_token_count_the_chosen_experts_only():
    """A mixture reads the k chosen experts' weights per token at batch 1: the count equals the
    bytes a decoding step's products actually read (``profile_decode.py``'s own count at the
    linear formula), plus the vectors no product reads (norms) and the looked-up row."""
    from attention_ref.models.config import family_of

    bench, profile = _bench(), _script("profile_decode")
    config_dict = {
        "model_type": "qwen3_moe", "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48,
        "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
        "mlp_only_layers": [0], "tie_word_embeddings": False}
    run = profile.worker(config_dict, 1)  # one step after the prompt and the warm-up
    config, params, _ = bench._model(config_dict)  # the same params the worker decoded with
    vectors = sum(w.nbytes for w in params.values() if w.ndim == 1)
    table_row = params[family_of(config).token_table][0].nbytes
    full = sum(w.nbytes for w in params.values())
    assert run["weight_bytes"] == bench.weight_bytes_per_token(params, config)
    assert run["weight_bytes"] == run["products"]["bytes"] + vectors + table_row
    assert run["weight_bytes"] < full - 2 * 16 * 32 * 4  # at least the unchosen experts of one layer are not counted
