"""Time and peak memory of the attention variants as the sequence length n grows.

Measures forward + backward of five paths on q, k, v of shape (H, n, d) = (4, n, 64) in
float32: the plain path (``scaled_dot_product_attention_*``, which holds H x n x n
arrays; at every n measured here H n^2 >= ``FAST_MIN_ELEMENTS``, so the public functions
run their fast path, ``attention_ref.fast``), the blockwise path (``flash_attention_*``),
blockwise causal, blockwise with a local window, and linear attention. For each n it records

* the tracemalloc peak of one forward + backward (inputs and ``dout`` are allocated
  before tracing starts, so the peak counts the output, the gradients and everything
  temporary) -- this first traced run also serves as the warm-up;
* the median wall time of further untraced runs (``time.perf_counter``), repeated until
  ``--min-time`` seconds have been spent or ``--max-repeats`` runs were made.

The plain path is skipped where its H x n x n probabilities and its backward's buffer for
their gradient would need more than 4 GiB.
Separately it measures the blockwise causal forward + backward peak at n = 8192, 4 heads,
d = 64, float32, and reports it (it does not assert anything).

BLAS runs on one thread unless ``OPENBLAS_NUM_THREADS`` (or ``OMP_NUM_THREADS``) is set.

It prints its tables and writes nothing unless asked. ``--write`` (full run only: the
small sizes of ``--quick`` must never become the committed numbers) rewrites
``docs/variants_costs.md`` (every number), ``docs/variants_costs.png`` (log-log plot) and
the measured columns of the table in ``docs/variants.md`` (between its ``BEGIN/END
MEASURED`` markers); ``--out DIR`` writes the first two into DIR instead (and updates
``DIR/variants.md`` if there is one).

Usage (from the repository root)::

    python benchmarks/variants.py --quick   # n = 256 ... 2048, a few minutes; prints only
    python benchmarks/variants.py           # n = 256 ... 16384; prints only
    python benchmarks/variants.py --write   # n = 256 ... 16384, then regenerate the docs
"""
from __future__ import annotations

import argparse
import os
import pathlib
import platform
import shlex
import statistics
import sys
import time
import tracemalloc
from datetime import datetime, timezone

# One BLAS thread by default: on a shared machine several threads per process fight for
# the same cores and make single timings swing by 10x. Set the variable to override.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attention_ref import (  # noqa: E402
    KVCache,
    MultiHeadAttention,
    causal_mask,
    flash_attention_backward,
    flash_attention_forward,
    linear_attention_backward,
    linear_attention_forward,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)
from attention_ref._atomic import atomic_path, write_atomic  # noqa: E402
from attention_ref.fast.attention import QUERY_BLOCK_ELEMENTS  # noqa: E402
from attention_ref.fast.dispatch import FAST_MIN_ELEMENTS  # noqa: E402

HEADS, D, DTYPE, WINDOW, BLOCK = 4, 64, np.float32, 128, 128
PLAIN_LIMIT = 4 * 2**30  # bytes
MIB = 2**20


def plain(q, k, v, dout):
    out, cache = scaled_dot_product_attention_forward(q, k, v)
    return scaled_dot_product_attention_backward(dout, cache)


def blockwise(q, k, v, dout, **options):
    out, cache = flash_attention_forward(q, k, v, block_size=BLOCK, **options)
    return flash_attention_backward(dout, cache)


def linear(q, k, v, dout):
    out, cache = linear_attention_forward(q, k, v)
    return linear_attention_backward(dout, cache)


METHODS = {
    "plain": plain,
    "blockwise": blockwise,
    "blockwise causal": lambda q, k, v, dout: blockwise(q, k, v, dout, causal=True),
    f"local window {WINDOW}": lambda q, k, v, dout: blockwise(q, k, v, dout, window=WINDOW),
    "linear": linear,
}


def plain_bytes(n: int) -> int:
    """The plain path's H x n x n probabilities and the backward's buffer for their gradient
    (H x rows x n: blocks of query rows of about ``QUERY_BLOCK_ELEMENTS`` numbers), as the
    fast path holds them: the public functions run it from ``FAST_MIN_ELEMENTS`` numbers in
    the probabilities, H n^2 >= 2**18 from n = 256 (the reference, below that, holds a whole
    second H x n x n array in the backward; ``main`` checks that every n measured is above)."""
    rows = min(n, max(1, QUERY_BLOCK_ELEMENTS // (HEADS * n)))
    return HEADS * (n + rows) * n * np.dtype(DTYPE).itemsize


def inputs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((HEADS, n, D)).astype(DTYPE) for _ in range(4)]  # q, k, v, dout


def traced_peak(fn, args) -> tuple[float, float]:
    """(seconds, tracemalloc peak in bytes) of one call, tracing only that call."""
    tracemalloc.start()
    try:
        start = time.perf_counter()
        fn(*args)
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return seconds, peak


def measure(fn, args, min_time: float, max_repeats: int) -> tuple[float, float, int]:
    """Median seconds over untraced runs after a traced warm-up, the peak, and the run count."""
    _, peak = traced_peak(fn, args)  # warm-up and memory
    times = []
    while len(times) < max_repeats and (not times or sum(times) < min_time):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times), peak, len(times)


def run(ns, min_time, max_repeats, log=print):
    results = {name: {} for name in METHODS}  # name -> n -> (seconds, peak bytes, runs)
    for n in ns:
        args = inputs(n)
        for name, fn in METHODS.items():
            if name == "plain" and plain_bytes(n) > PLAIN_LIMIT:
                log(f"n={n:>6} {name:<18} skipped (needs {plain_bytes(n) / 2**30:.0f} GiB)")
                continue
            results[name][n] = measure(fn, args, min_time, max_repeats)
            seconds, peak, runs = results[name][n]
            log(f"n={n:>6} {name:<18} {seconds * 1e3:10.1f} ms {peak / MIB:10.1f} MiB  ({runs} runs)")
    return results


def decode_costs(ns, min_time, max_repeats, log=print):
    """One decoding step at context length T = n: with a KV cache versus recomputing.

    Layer: d_model = HEADS * D, HEADS heads of width D, float32, one sequence. With the
    cache the step attends one query to T cached keys (O(T d)); without it the whole
    causal forward over T tokens is recomputed to get the last output (O(T^2 d)).
    Returns name -> T -> (seconds, peak bytes, runs); for the cached step the memory is
    the cache itself (``KVCache.nbytes``) plus the step's own tracemalloc peak.
    """
    layer = MultiHeadAttention(HEADS * D, HEADS, seed=0, dtype=DTYPE)
    rng = np.random.default_rng(1)
    results = {"decode step, KV cache": {}, "decode step, recompute": {}}
    for T in ns:
        x = rng.standard_normal((T, HEADS * D)).astype(DTYPE)
        prefix_k = rng.standard_normal((HEADS, T - 1, D)).astype(DTYPE)
        prefix_v = rng.standard_normal((HEADS, T - 1, D)).astype(DTYPE)

        def fresh_cache():
            cache = KVCache()
            cache.append(prefix_k, prefix_v)  # the T - 1 earlier tokens, untimed
            return cache

        cache = fresh_cache()
        _, peak = traced_peak(layer.decode_step, (x[-1:], cache))
        times = []
        while len(times) < max_repeats and (not times or sum(times) < min_time):
            cache = fresh_cache()
            start = time.perf_counter()
            layer.decode_step(x[-1:], cache)
            times.append(time.perf_counter() - start)
        results["decode step, KV cache"][T] = (statistics.median(times), peak + cache.nbytes, len(times))
        if plain_bytes(T) <= PLAIN_LIMIT:
            mask = causal_mask(T)
            results["decode step, recompute"][T] = measure(lambda: layer(x, mask=mask), (), min_time, max_repeats)
        for name in results:
            if T in results[name]:
                seconds, peak, runs = results[name][T]
                log(f"T={T:>6} {name:<22} {seconds * 1e3:10.2f} ms {peak / MIB:10.1f} MiB  ({runs} runs)")
    return results


def check_8192(log=print):
    """Blockwise causal forward + backward at n = 8192, 4 heads, d = 64, float32."""
    args = inputs(8192)
    seconds, peak = traced_peak(METHODS["blockwise causal"], args)
    out_and_grads = 4 * HEADS * 8192 * D * np.dtype(DTYPE).itemsize
    log(f"n=8192 blockwise causal: peak {peak / MIB:.1f} MiB (output + 3 gradients = "
        f"{out_and_grads / MIB:.0f} MiB; plain path would hold {plain_bytes(8192) / 2**30:.2f} GiB),"
        f" {seconds:.1f} s traced")
    return peak, seconds


def slope(points):
    """Least-squares slope of log(y) against log(n): the empirical exponent of growth."""
    ns, ys = zip(*points)
    return float(np.polyfit(np.log(ns), np.log(ys), 1)[0])


def costs_markdown(results, ns, peak_8192, command, total_seconds) -> str:
    """docs/variants_costs.md: every measured number, with the command, date and machine of the run."""
    lines = ["# Measured cost of the attention variants", "",
             f"Generated on {datetime.now(timezone.utc):%Y-%m-%d} (UTC) by `{command}` "
             f"in {total_seconds / 60:.1f} min on {platform.machine()} / Python {platform.python_version()}"
             f" / NumPy {np.__version__}, BLAS threads {os.environ['OPENBLAS_NUM_THREADS']}. Forward + backward on q, k, v of shape ({HEADS}, n, {D}), float32;"
             f" the two decode rows are one decoding step of a {HEADS}-head layer (d_model = {HEADS * D})"
             " at context length T = n, with the KV cache (memory = cache + step) or recomputing the"
             " causal forward (no backward);"
             f" blockwise tiles of {BLOCK}; local window |i - j| <= {WINDOW}. Time is the median of"
             " untraced runs after a warm-up; peak is tracemalloc's peak of one forward + backward"
             " (inputs excluded, output and gradients included). '-' = skipped (over 4 GiB).", ""]
    names = list(results)
    lines.append("| n | " + " | ".join(f"{m} ms" for m in names) + " | "
                 + " | ".join(f"{m} MiB" for m in names) + " |")
    lines.append("|---:" * (1 + 2 * len(names)) + "|")
    for n in ns:
        t = [f"{results[m][n][0] * 1e3:.1f}" if n in results[m] else "-" for m in names]
        p = [f"{results[m][n][1] / MIB:.1f}" if n in results[m] else "-" for m in names]
        lines.append(f"| {n} | " + " | ".join(t) + " | " + " | ".join(p) + " |")
    lines += ["", "Empirical growth exponents (slope of log cost against log n over the measured n;"
              " 2 = quadratic, 1 = linear):", "", "| path | time | peak memory |", "|---|---:|---:|"]
    for m in names:
        pts = [(n, *results[m][n][:2]) for n in sorted(results[m])]
        if len(pts) >= 2:
            lines.append(f"| {m} | {slope([(n, s) for n, s, _ in pts]):.2f} | {slope([(n, b) for n, _, b in pts]):.2f} |")
    lines += ["", f"Blockwise causal forward + backward at n = 8192, 4 heads, d = 64, float32: tracemalloc"
              f" peak **{peak_8192 / MIB:.1f} MiB** (budget 96 MiB; the output and three gradients alone"
              f" are {4 * HEADS * 8192 * D * 4 / MIB:.0f} MiB; the plain path would hold"
              f" {plain_bytes(8192) / 2**30:.2f} GiB: the probabilities and the backward's buffer for"
              f" their gradient).", ""]
    return "\n".join(lines)


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in results:
        ns = sorted(results[name])
        if not ns:
            continue
        ax_t.loglog(ns, [results[name][n][0] for n in ns], "o-", label=name)
        ax_m.loglog(ns, [results[name][n][1] / MIB for n in ns], "o-", label=name)
    ax_t.set(xlabel="sequence length n", ylabel="time (s): forward + backward, or one decode step", title="Time")
    ax_m.set(xlabel="sequence length n", ylabel="tracemalloc peak (MiB)", title="Peak extra memory")
    for ax in (ax_t, ax_m):
        ax.grid(True, which="both", alpha=0.3)
    ax_m.legend(fontsize=8)
    fig.suptitle(f"Attention variants, {HEADS} heads, d = {D}, float32 (log-log)")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def measured_cell(results, name, small, large) -> str:
    """'t1 -> t2 ms; m1 -> m2 MiB' between two sizes, or what is missing."""
    r = results.get(name, {})
    if small not in r:
        return "-"
    big = max(n for n in r if n <= large)
    s, l = r[small], r[big]
    note = f" (n={big}; larger skipped, > 4 GiB)" if big != large else ""
    return (f"{s[0] * 1e3:.3g} &rarr; {l[0] * 1e3:.3g} ms; "
            f"{s[1] / MIB:.3g} &rarr; {l[1] / MIB:.3g} MiB{note}")


def first_win(results, ours, theirs, index):
    """Smallest measured n from which ``ours`` stays below ``theirs`` (index 0 time, 1 memory)."""
    common = sorted(set(results[ours]) & set(results[theirs]))
    wins = [results[ours][n][index] < results[theirs][n][index] for n in common]
    for i, n in enumerate(common):
        if all(wins[i:]):
            return n
    return None


#: (variant, API, what it computes, time, extra memory, measured key, where it wins)
ROWS = [
    ("Plain attention", "`scaled_dot_product_attention_forward`",
     "softmax(q k^T / sqrt(d) + mask) v", "O(n^2 d)", "O(n^2): probabilities kept for the backward",
     "plain", "short sequences: fewest Python steps, one big BLAS call"),
    ("Blockwise (flash)", "`flash_attention_forward`",
     "the same numbers (to 1e-12 in float64) by tiles with an online softmax", "O(n^2 d)",
     "O(n d) + one tile", "blockwise", "long sequences: memory stays linear in n"),
    ("Blockwise, causal", "`flash_attention_forward(..., causal=True)`",
     "plain attention with `causal_mask`", "O(n^2 d / 2): future tiles skipped", "O(n d)",
     "blockwise causal", "decoder training at long n"),
    (f"Local window (w = {WINDOW})", "`flash_attention_forward(..., window=w)`, `local_window_mask`",
     "each query sees keys with &#124;i - j&#124; <= w", "O(n w d)", "O(n d)",
     f"local window {WINDOW}", "long inputs whose dependencies are mostly local (Longformer)"),
    ("Linear attention", "`linear_attention_forward`",
     "phi(q) (phi(k)^T v) / (phi(q) . sum phi(k)): different weights, not softmax", "O(n d_k d_v)",
     "O(n d + d_k d_v); causal O(n d_k d_v)", "linear", "long n with small head width d"),
    ("KV-cache decoding", "`MultiHeadAttention.decode_step`, `KVCache`",
     "the next token's output, equal to the causal forward", "O(T d) per token",
     "cache 2 h_kv T d_k itemsize bytes", "decode step, KV cache", "generation, one token at a time"),
    ("Decoding without cache", "`MultiHeadAttention.forward` with `causal_mask`",
     "the same output by recomputing all T tokens", "O(T^2 d) per token", "O(T^2)",
     "decode step, recompute", "never for generation; it is the reference"),
    ("Grouped / multi-query", "`num_kv_heads=` on `multi_head_attention_forward`, `MultiHeadAttention`",
     "query head i uses key/value head i // (h / h_kv)", "as MHA; K, V projections / (h / h_kv)",
     "KV cache / (h / h_kv)", None, "decoding, where reading the cache dominates"),
    ("Rotary positions (RoPE)", "`rope_forward`", "rotates feature pairs by position; q.k depends on m - n",
     "O(n d)", "O(n d)", None, "relative positions inside a plain dot product"),
    ("Head mask", "`head_mask=` on the multi-head forward", "scales each head's output; "
     "`grads['head_mask']` is each head's first-order sensitivity", "O(n d)", "O(h)", None, "pruning studies"),
]


def variants_table(results, ns) -> list:
    small, large = ns[0], ns[-1]
    hkv_cache = {hkv: 2 * hkv * large * D * np.dtype(DTYPE).itemsize / MIB for hkv in (HEADS, 2, 1)}
    lines = [f"| Variant | API | Computes | Time as n grows | Extra memory as n grows |"
             f" Measured n = {small} &rarr; {large} (time; peak) | Wins when |",
             "|---|---|---|---|---|---|---|"]
    for label, api, what, cost, memory, key, wins in ROWS:
        if key is not None:
            cell = measured_cell(results, key, small, large)
        elif label.startswith("Grouped"):
            cell = (f"KV cache at T = {large}, {HEADS} heads of {D}, float32: "
                    + ", ".join(f"h_kv = {h}: {m:.3g} MiB" for h, m in hkv_cache.items()))
        else:
            cell = "not timed (O(n d), negligible next to attention)"
        lines.append(f"| {label} | {api} | {what} | {cost} | {memory} | {cell} | {wins} |")
    return lines


def measured_block(results, ns, command="python benchmarks/variants.py --write") -> list:
    """The lines of docs/variants.md between its MEASURED markers: the table and who wins where."""
    block = [*variants_table(results, ns), ""]
    for ours, theirs, index, what in [("linear", "plain", 0, "Linear attention is faster than the plain path"),
                                      ("blockwise causal", "plain", 1, "Blockwise causal needs less memory than the plain path"),
                                      (f"local window {WINDOW}", "blockwise", 0, "The local window is faster than full blockwise"),
                                      ("decode step, KV cache", "decode step, recompute", 0,
                                       "A cached decoding step is faster than recomputing")]:
        n = first_win(results, ours, theirs, index)
        block.append(f"- {what} " + (f"from n = {n} on (measured)." if n else "at no measured n."))
    block += ["", f"(Generated by `{command}`; every measured number with its setting"
              " is in [variants_costs.md](variants_costs.md), plotted in [variants_costs.png](variants_costs.png).)"]
    return block


def update_variants_doc(results, ns, path, command="python benchmarks/variants.py --write"):
    """Rewrite the generated table of docs/variants.md between its markers."""
    text = path.read_text()
    begin, end = "<!-- BEGIN MEASURED -->", "<!-- END MEASURED -->"
    if begin not in text or end not in text:
        return False
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    write_atomic(path, head + "\n".join([begin, "", *measured_block(results, ns, command), "", end]) + tail)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 256 ... 2048 only")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds of timed runs per point")
    parser.add_argument("--max-repeats", type=int, default=5)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", type=pathlib.Path, metavar="DIR",
                       help="also write variants_costs.md/.png into DIR (default: print only)")
    where.add_argument("--write", action="store_true",
                       help="full run only: regenerate docs/variants_costs.md/.png and the table of docs/variants.md")
    args = parser.parse_args(argv)
    if args.quick and args.write:
        parser.error("--write regenerates the committed docs and needs the full run: --quick sizes"
                     " must never become the committed numbers (use --out DIR to keep a quick run)")
    ns = [256 * 2**i for i in range(4 if args.quick else 7)]  # 256 ... 2048 or 16384
    # the plain path's memory (plain_bytes) is the fast path's: the public functions must run it at every n
    assert all(HEADS * n * n >= FAST_MIN_ELEMENTS for n in ns), "the plain path would run the reference"
    start = time.perf_counter()
    results = run(ns, args.min_time, args.max_repeats)
    results.update(decode_costs(ns, args.min_time, args.max_repeats))
    peak_8192, _ = check_8192()
    total = time.perf_counter() - start
    command = shlex.join(["python", "benchmarks/variants.py", *(sys.argv[1:] if argv is None else argv)])
    costs = costs_markdown(results, ns, peak_8192, command, total)
    print("\n" + costs + "\n" + "\n".join(measured_block(results, ns, command)))
    out = ROOT / "docs" if args.write else args.out
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "variants_costs.md", costs)
        plot(results, out / "variants_costs.png")
        updated = (out / "variants.md").exists() and update_variants_doc(results, ns, out / "variants.md", command)
        print(f"wrote {out / 'variants_costs.md'}, {out / 'variants_costs.png'}"
              f"{' and the measured block of variants.md' if updated else ''} in {total:.0f} s")
    print(f"n=8192 blockwise causal peak: {peak_8192 / MIB:.1f} MiB ({'within' if peak_8192 <= 96 * MIB else 'OVER'} 96 MiB)")


if __name__ == "__main__":
    main()
