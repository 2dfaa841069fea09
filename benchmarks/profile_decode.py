"""Where a decoding step's time goes, for every model of ``benchmarks/bench_decode.py``.

Run from the repository root::

    python benchmarks/profile_decode.py                 # every model, prints a markdown table
    python benchmarks/profile_decode.py --quick         # the tiny models: checks that it runs
    python benchmarks/profile_decode.py --model Gemma   # the rows whose name holds a word
    python benchmarks/profile_decode.py --layouts       # one row times a matrix: by rows against by columns

Each model runs in its own fresh process with one thread (as in ``bench_decode.py``): ``LMDecoder``
prefills the 16-token prompt, decodes 3 tokens to warm up, then ``--steps`` more, greedily.

Two kinds of figure, reported side by side:

* **counted** (the same on any machine, however loaded): the weights a step must read (bytes, as
  ``bench_decode.weight_bytes_per_token`` counts them), the bytes of the weight matrices the step's
  products ``x W`` actually read (every call of the package's linear formula, whatever its path; a
  family whose products go elsewhere, the experts of a mixture, reads less through it), how many of
  those products a step makes, and how many Python function calls a step makes (``cProfile``'s count
  over the steps, per step and per layer: the work outside BLAS that does not shrink with the weights);
* **timed** (a loaded machine inflates them): milliseconds per step, the part of it inside the products
  (``x W`` timed call by call), the rest (everything else: the norms, RoPE, the attention over the
  cache, the cache's append, the checks, Python) per step and per layer, and the products' read rate
  (bytes read over their time), to set against the machine's single-thread read bandwidth that
  ``bench_decode.py`` measures.
"""
from __future__ import annotations

import argparse
import cProfile
import datetime
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_decode  # noqa: E402  (the models, the one-thread settings and the bytes per token: one definition)


def worker(config_dict: dict, steps: int) -> dict:
    """The counted and timed figures of ``steps`` decoding steps of one model, in this process."""
    import numpy as np

    import attention_ref as ar
    from attention_ref.core import linear as core_linear
    from attention_ref.fast import linear as fast_linear

    config, params, ids = bench_decode._model(config_dict)
    decoder = ar.LMDecoder(params, config)
    token = decoder.prefill(ids, last_only=True).argmax(-1)
    for _ in range(3):  # warm-up
        token = decoder.step(token).argmax(-1)
    products = {"calls": 0, "bytes": 0, "seconds": 0.0}
    originals = {module: module._linear_finite for module in (core_linear, fast_linear)}

    def counted(original):
        def linear_finite(x, W, b, names=("x", "W", "b")):
            start = time.perf_counter()
            y = original(x, W, b, names)
            products["seconds"] += time.perf_counter() - start
            products["calls"] += 1
            products["bytes"] += W.nbytes
            return y
        return linear_finite

    for module, original in originals.items():
        module._linear_finite = counted(original)
    try:
        start = time.perf_counter()
        for _ in range(steps):
            token = decoder.step(token).argmax(-1)
        seconds = time.perf_counter() - start
    finally:
        for module, original in originals.items():
            module._linear_finite = original
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        token = decoder.step(token).argmax(-1)
    profile.disable()
    calls = pstats.Stats(profile).total_calls
    return {"steps": steps, "layers": config.num_layers, "seconds": seconds, "calls": calls,
            "products": products, "weight_bytes": bench_decode.weight_bytes_per_token(params, config),
            "dtype": str(np.dtype(np.float32))}


#: (D_in, D_out) of the products of the decoding rows: SmolLM-135M's (q and o, k and v, gate and up, down),
#: GPT-2's and Pythia's (q, the MLP's two), Gemma-3-270M's (its MLP's two)
LAYOUT_SHAPES = ((576, 576), (576, 192), (576, 1536), (1536, 576), (768, 768), (768, 3072), (3072, 768),
                 (640, 2048), (2048, 640))


def layouts_worker(megabytes: int, repeats: int = 7) -> list:
    """For each shape of :data:`LAYOUT_SHAPES`: the read rate of one float32 row times ``W``, ``W`` stored by
    rows (C order) and by columns (the transpose of a C-ordered (D_out, D_in), as ``nn.Linear`` stores it),
    over as many distinct matrices as make ``megabytes`` (beyond the caches), the best of ``repeats``
    passes, the two layouts interleaved pass by pass."""
    import numpy as np

    rng = np.random.default_rng(0)
    rows = []
    for d_in, d_out in LAYOUT_SHAPES:
        count = max(4, megabytes * 2 ** 20 // (4 * d_in * d_out))
        by_rows = [rng.standard_normal((d_in, d_out), dtype=np.float32) for _ in range(count)]
        by_columns = [np.asfortranarray(W) for W in by_rows]
        x = rng.standard_normal(d_in, dtype=np.float32)
        best = {"rows": float("inf"), "columns": float("inf")}
        for _ in range(repeats):
            for layout, matrices in (("rows", by_rows), ("columns", by_columns)):
                start = time.perf_counter()
                for W in matrices:
                    x @ W
                best[layout] = min(best[layout], time.perf_counter() - start)
        total = 4 * d_in * d_out * count
        rows.append({"shape": [d_in, d_out], "rows": total / best["rows"], "columns": total / best["columns"]})
        del by_rows, by_columns
    return rows


def render_layouts(rows: list, command: str) -> str:
    """The markdown table of :func:`layouts_worker`'s rates."""
    import numpy as np

    lines = [f"Measured {datetime.date.today().isoformat()}, one thread, NumPy {np.__version__}, float32: `{command}`."
             + _load_note("at the end"), "",
             "| W (D_in, D_out) | by rows GB/s | by columns GB/s | time by columns / by rows | faster |",
             "| --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        ratio = r["rows"] / r["columns"]
        lines.append(f"| {r['shape'][0]} x {r['shape'][1]} | {r['rows'] / 1e9:.1f} | {r['columns'] / 1e9:.1f} |"
                     f" {ratio:.2f} | {'columns' if ratio < 1 else 'rows'} |")
    return "\n".join(lines) + "\n"


def _load_note(when: str) -> str:
    """`` Load average (1 minute) x.x <when>.``, or nothing where the system does not give it."""
    load = bench_decode._load_average()
    return "" if load is None else f" Load average (1 minute) {load:.1f} {when}."


def _spawn(*arguments: str) -> dict:
    """This script run with ``arguments`` (a worker's) in a fresh one-thread process: the JSON it prints."""
    env = {**os.environ, **bench_decode.ONE_THREAD, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, __file__, *arguments], capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"the worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def render(results: dict, command: str) -> str:
    """The markdown table of :func:`worker`'s results, one row per model."""
    import numpy as np

    load = _load_note("at the end of the run")
    lines = [f"Measured {datetime.date.today().isoformat()}, one thread, NumPy {np.__version__}, float32: `{command}`."
             f"{load} Counted columns hold on any machine; timed ones are inflated by a loaded machine.", "",
             "| model | weights MB/token | MB read by the products | products/step | Python calls/step |"
             " calls/layer | ms/step | ms in products | ms elsewhere | elsewhere ms/layer | products' read GB/s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in results.items():
        n, layers, p = r["steps"], r["layers"], r["products"]
        step, inside = 1e3 * r["seconds"] / n, 1e3 * p["seconds"] / n
        rest = step - inside
        megabytes = bench_decode._megabytes
        lines.append(f"| {name} | {megabytes(r['weight_bytes'])} | {megabytes(p['bytes'] / n)} |"
                     f" {p['calls'] / n:.0f} | {r['calls'] / n:.0f} | {r['calls'] / n / layers:.0f} | {step:.1f} |"
                     f" {inside:.1f} | {rest:.1f} | {rest / layers:.2f} |"
                     f" {p['bytes'] / max(p['seconds'], 1e-12) / 1e9:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny models: checks that it runs")
    parser.add_argument("--steps", type=int, default=10, help="decoding steps timed and counted (default 10)")
    parser.add_argument("--model", action="append", default=[], metavar="WORD",
                        help="only the rows whose name contains WORD (repeatable; default: every row)")
    parser.add_argument("--layouts", action="store_true",
                        help="one row times a matrix of each shape of the rows, stored by rows against by columns")
    parser.add_argument("--worker", nargs=2, metavar=("CONFIG", "STEPS"), help=argparse.SUPPRESS)
    parser.add_argument("--layouts-worker", metavar="MEGABYTES", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker[0]), int(args.worker[1]))))
        return 0
    if args.layouts_worker:
        print(json.dumps(layouts_worker(int(args.layouts_worker))))
        return 0
    if args.layouts:
        megabytes = 8 if args.quick else 256
        command = "python benchmarks/profile_decode.py --layouts" + (" --quick" if args.quick else "")
        print(render_layouts(_spawn("--layouts-worker", str(megabytes)), command), end="")
        return 0
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    models = bench_decode.QUICK if args.quick else bench_decode.MODELS
    if args.model:
        models = {name: d for name, d in models.items() if any(word in name for word in args.model)}
        if not models:
            parser.error(f"--model {args.model}: no row's name contains these words")
    results = {}
    for name, config_dict in models.items():
        print(f"{name}", file=sys.stderr, flush=True)  # progress
        results[name] = _spawn("--worker", json.dumps(config_dict), str(args.steps))
    command = ("python benchmarks/profile_decode.py" + (" --quick" if args.quick else "")
               + ("" if args.steps == 10 else f" --steps {args.steps}")
               + "".join(f" --model {word!r}" for word in args.model))
    print(render(results, command), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
