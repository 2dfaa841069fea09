"""Forward+backward speed of multi-head attention: attention_ref against BLAS and PyTorch.

Run from the repository root::

    python benchmarks/bench_mha.py --quick    # tiny sizes, a few seconds: checks it runs
    python benchmarks/bench_mha.py            # full run, about 8 minutes on 2 cores
    python benchmarks/bench_mha.py --write    # full run, then regenerate the committed docs
    python benchmarks/bench_mha.py --render   # regenerate the docs from the committed JSON

It prints a markdown table and writes nothing unless asked: ``--out FILE`` writes the table
to FILE with the raw numbers (JSON) beside it; ``--write`` (full run only: tiny sizes must
never become the committed numbers) rewrites ``docs/performance_table.md/.json/.png``, the
marked table of ``docs/performance.md`` and the marked table of the README's Performance
section, with the machine and the date of the run. Every library is timed in its OWN
subprocess: NumPy's BLAS threads and PyTorch's thread pool fight over the cores when they
share a process. PyTorch is used only when it happens to be installed; it is never a
dependency.

Timing: ``time.perf_counter``, one warm-up call, then the median of ``--repeats`` runs
(the spread, min..max, is recorded too, so noise is visible); a full run does that in
``--rounds`` (3) fresh processes per case and library and keeps the median of the three.

FLOP count (matrix products only, each ``(m, k) @ (k, n)`` counted as ``2*m*n*k``; the
elementwise softmax work is not counted), for B sequences of length N, model width
D = h * d_k and h heads, query = key = value:

* forward: projections ``Q, K, V`` and ``W^O``: ``4 * 2*B*N*D*D``; scores ``q k^T``:
  ``h * 2*B*N*N*d_k = 2*B*N*N*D``; ``P v``: ``2*B*N*N*D``. Total ``8*B*N*D^2 + 4*B*N^2*D``.
* backward: every product ``Y = A B`` needs ``dA = dY B^T`` and ``dB = A^T dY``, two
  products of the same size: twice the forward.
* forward + backward: ``24*B*N*D^2 + 12*B*N^2*D``  (:func:`mha_flops`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "performance_table.md"  # with .json and .png beside it
FULL_CONFIGS = [(8, 128), (4, 512), (1, 2048)]  # (B, N) with D = 512, h = 8
QUICK_CONFIGS = [(2, 16)]
DTYPES = ("float32", "float64")


def mha_flops(B: int, N: int, D: int, h: int) -> int:
    """Matrix-product FLOPs of one forward+backward: ``24*B*N*D^2 + 12*B*N^2*D``.

    ``h`` does not appear: h heads of width d_k = D / h do ``h * 2*N*N*d_k = 2*N*N*D``.
    """
    forward = 4 * (2 * B * N * D * D) + 2 * (2 * B * N * N * D)
    return 3 * forward  # backward = two products per forward product


def median_time(fn, repeats: int) -> dict:
    """One warm-up call, then ``repeats`` timed calls: median, min and max in seconds."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"median": statistics.median(times), "min": min(times), "max": max(times)}


def _status_kib(field: str):
    """A field of /proc/self/status in KiB (Linux), or None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_memory(fn, traced: bool = True) -> dict:
    """Peak memory of one call of ``fn``, in bytes: ``traced``, the peak of the allocations
    tracemalloc sees (NumPy's arrays; None for torch, whose allocator it does not see), and
    ``rss``, the growth of the process's resident set over what it held before the call
    (the kernel's high-water mark, reset first through /proc/self/clear_refs; None where
    that is not available)."""
    import tracemalloc

    before = None
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        before = _status_kib("VmRSS")
    except OSError:
        pass
    if traced:
        tracemalloc.start()
    try:
        fn()
        peak = tracemalloc.get_traced_memory()[1] if traced else None
    finally:
        if traced:
            tracemalloc.stop()
    after = _status_kib("VmHWM") if before is not None else None
    return {"traced": peak, "rss": None if after is None else max(0, after - before) * 1024}


# --------------------------------------------------------------------------- NumPy side
def _inputs(np, B, N, D, dtype, seed=0):
    """x, dout and a params dict with biases, all in ``dtype``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, N, D)).astype(dtype)
    dout = rng.standard_normal((B, N, D)).astype(dtype)
    params = {}
    for name in "qkvo":
        params["W_" + name] = (rng.standard_normal((D, D)) / D ** 0.5).astype(dtype)
        params["b_" + name] = (0.1 * rng.standard_normal(D)).astype(dtype)
    return x, dout, params


def naive_fwd_bwd(np, x, dout, p, h):
    """The same maths written the obvious way, as a "before" for the tricks in the core:
    scale on the (N, N) scores, a NumPy float64 scalar (upcasts float32 work), separate
    copies for every step, and ``D_i = rowsum(P_i * dP_i)``."""
    B, N, D = x.shape
    d_k = D // h
    scale = 1 / np.sqrt(np.float64(d_k))  # a NumPy float64 scalar

    def split(a):
        return a.reshape(B, N, h, d_k).transpose(0, 2, 1, 3).copy()

    Q, K, V = (x @ p["W_" + n] + p["b_" + n] for n in "qkv")
    q, k, v = split(Q), split(K), split(V)
    S = q @ k.transpose(0, 1, 3, 2) * scale  # (B, h, N, N), float64 for float32 input
    P = np.exp(S - S.max(axis=-1, keepdims=True))
    P = P / P.sum(axis=-1, keepdims=True)
    o = P @ v
    concat = o.transpose(0, 2, 1, 3).reshape(B, N, D)
    out = concat @ p["W_o"] + p["b_o"]
    dconcat = dout @ p["W_o"].T
    grads = {"W_o": concat.reshape(-1, D).T @ dout.reshape(-1, D), "b_o": dout.sum(axis=(0, 1))}
    do = split(dconcat)
    dv = P.transpose(0, 1, 3, 2) @ do
    dP = do @ v.transpose(0, 1, 3, 2)
    dS = P * (dP - (P * dP).sum(axis=-1, keepdims=True))
    dq = dS @ k * scale
    dk = dS.transpose(0, 1, 3, 2) @ q * scale
    dx = 0
    for n, d in zip("qkv", (dq, dk, dv)):
        dY = d.transpose(0, 2, 1, 3).reshape(B, N, D)
        grads["W_" + n] = x.reshape(-1, D).T @ dY.reshape(-1, D)
        grads["b_" + n] = dY.sum(axis=(0, 1))
        dx = dx + dY @ p["W_" + n].T
    return out, dx, grads


def numpy_worker(configs, dtypes, repeats, D, h, peak_n, tricks=True, one_piece=False, only_ours=False):
    """Time attention_ref (and BLAS) in this process; return a JSON-able dict. ``one_piece``:
    only our forward+backward, with the (batch, head) blocks on threads switched off;
    ``only_ours``: only our forward+backward, as the library runs."""
    import numpy as np

    sys.path.insert(0, str(ROOT))
    import attention_ref as ar
    from attention_ref import _batch_blocks

    blas_threads, blas = _blas_info()
    if one_piece:
        _batch_blocks.MIN_ELEMENTS = 1 << 62  # no region opens: BLAS keeps its threads
    result = {"peak": {}, "rows": [], "numpy": np.__version__, "blas_threads": blas_threads, "blas": blas,
              "block_threads": 0 if one_piece or _batch_blocks._blas_controller() is None else blas_threads}
    for dtype in dtypes:  # BLAS peak: a large square matrix product, 2*n^3 FLOPs
        a = np.random.default_rng(0).standard_normal((peak_n, peak_n)).astype(dtype)
        b = a.T.copy()  # not a.T itself: NumPy would call syrk for a @ a.T
        t = median_time(lambda: a @ b, max(3, repeats))
        result["peak"][dtype] = 2 * peak_n ** 3 / t["median"] / 1e9
    for dtype in dtypes:
        for B, N in configs:
            x, dout, p = _inputs(np, B, N, D, dtype)

            def parallel():
                out, cache = ar.multi_head_attention_forward(x, x, x, p, h)
                return ar.multi_head_attention_backward(dout, cache)

            def separate():
                out, cache = ar.multi_head_attention_separate_heads_forward(x, x, x, p, h)
                return ar.multi_head_attention_separate_heads_backward(dout, cache)

            row = {"dtype": dtype, "B": B, "N": N, "D": D, "h": h, "flops": mha_flops(B, N, D, h),
                   "peak": result["peak"][dtype]}  # measured in this process, just before
            if one_piece or only_ours:
                row["ours"] = median_time(parallel, repeats)
                result["rows"].append(row)
                continue
            row["memory"] = peak_memory(parallel)  # first: before timing leaves freed memory resident
            row["ours"] = median_time(parallel, repeats)
            row["separate_heads"] = median_time(separate, repeats)
            row["naive"] = median_time(lambda: naive_fwd_bwd(np, x, dout, p, h), max(1, repeats // 2))
            result["rows"].append(row)
    if not tricks:
        return result
    N = max(n for _, n in configs)
    result["tricks"] = {"N": N, **{dtype: tricks_worker(np, N, D, h, dtype, repeats) for dtype in dtypes}}
    return result


def tricks_worker(np, N, D, h, dtype, repeats):
    """Each trick of the core measured alone, "before" against "after", on (1, h, N, N)
    scores; returns ``[(trick, before seconds, after seconds), ...]``."""
    from attention_ref.core import attention
    from attention_ref.core.attention import _attend_backward, _softmax_rows_backward
    from attention_ref.core.softmax import _softmax, _softmax_plain

    rng = np.random.default_rng(1)
    d_k = D // h
    x = rng.standard_normal((N, D)).astype(dtype)
    W = [(rng.standard_normal((D, D)) / D ** 0.5).astype(dtype) for _ in range(3)]
    W_qkv = np.concatenate(W, axis=1)  # (D, 3D)
    q, k, v, dout = (rng.standard_normal((1, h, N, d_k)).astype(dtype) for _ in range(4))
    q_strided = (x @ W[0]).reshape(N, h, d_k).transpose(1, 0, 2)[None]  # a split-heads view
    scale = 1.0 / d_k ** 0.5
    S = (q * scale) @ k.swapaxes(-1, -2)
    P = _softmax(S.copy(), -1, out=None)
    dP = dout @ v.swapaxes(-1, -2)
    out = P @ v
    rows = []

    def pair(name, before, after, n=repeats):
        rows.append((name, median_time(before, n)["median"], median_time(after, n)["median"]))

    pair("scale folded into q: (q / sqrt(d_k)) k^T instead of (q k^T) / sqrt(d_k)",
         lambda: (q @ k.swapaxes(-1, -2)) * scale, lambda: (q * scale) @ k.swapaxes(-1, -2))
    pair("D_i = rowsum(dout_i * out_i) instead of rowsum(P_i * dP_i)",
         lambda: (P * dP).sum(axis=-1, keepdims=True), lambda: (dout * out).sum(axis=-1, keepdims=True))

    def scores():
        return (q * scale) @ k.swapaxes(-1, -2)

    pair("softmax in place (out=scores) instead of into new arrays",
         lambda: _softmax_plain(scores(), -1), lambda: _softmax_plain(S1 := scores(), -1, out=S1))
    pair("Python float scale instead of np.float64 scalar (float32 input: no upcast)",
         lambda: _softmax_plain(T := (q * np.float64(scale)) @ k.swapaxes(-1, -2), -1, out=T),
         lambda: _softmax_plain(T := scores(), -1, out=T))
    buf = np.empty_like(S)

    def softmax_fresh(f):
        np.copyto(buf, S)  # the same copy in "before" and "after"
        f(buf, -1, out=buf)

    dP_buf = np.empty_like(dP)

    def ds_fresh(f):
        np.copyto(dP_buf, dP)
        f(dP_buf, P, D_row)

    def ds_plain(dP_, P_, D_):
        dP_ -= D_
        dP_ *= P_

    D_row = (dout * out).sum(axis=-1, keepdims=True)
    pair("softmax over cache-sized row blocks (vs one pass per step)",
         lambda: softmax_fresh(_softmax_plain), lambda: softmax_fresh(_softmax))
    pair("dS = P * (dP - D) over row blocks", lambda: ds_fresh(ds_plain),
         lambda: ds_fresh(_softmax_rows_backward))

    def backward(block):
        def run():
            attention.QUERY_BLOCK_ELEMENTS = block
            return _attend_backward(dout, q, k, v, P, out, scale)
        return run

    default = attention.QUERY_BLOCK_ELEMENTS
    pair("backward's dP and dS over blocks of query rows in one buffer (vs one fresh (h, N, N) dP)",
         backward(1 << 62), backward(default))
    attention.QUERY_BLOCK_ELEMENTS = default
    pair("contiguous q for q k^T (a copy) instead of the split-heads view",
         lambda: q_strided @ k.swapaxes(-1, -2), lambda: np.ascontiguousarray(q_strided) @ k.swapaxes(-1, -2))
    pair("one fused x W_qkv (D, 3D) instead of x W_q, x W_k, x W_v",
         lambda: [x @ w for w in W], lambda: x @ W_qkv)
    return rows


def _blas_info():
    """BLAS threads of this process and NumPy's BLAS build (e.g. ``openblas 0.3.31 (SkylakeX)``),
    as threadpoolctl reports them; without it, the thread variables and "not recorded"."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        threads = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or "library default"
        return threads, "not recorded (install threadpoolctl)"
    blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
    builds = [f"{p['internal_api']} {p.get('version') or ''} ({p.get('architecture') or '?'})".replace("  ", " ")
              for p in blas]
    return max((p["num_threads"] for p in blas), default=None), ", ".join(builds) or "not found"


# --------------------------------------------------------------------------- torch side
def torch_worker(configs, dtypes, repeats, D, h):
    """Time torch.nn.MultiheadAttention (biases on) forward+backward in this process."""
    import torch

    result = {"rows": [], "torch": torch.__version__, "threads": torch.get_num_threads()}
    for dtype in dtypes:
        tdtype = getattr(torch, dtype)
        for B, N in configs:
            torch.manual_seed(0)
            mha = torch.nn.MultiheadAttention(D, h, bias=True, batch_first=True, dtype=tdtype)
            x = torch.randn(B, N, D, dtype=tdtype, requires_grad=True)
            dout = torch.randn(B, N, D, dtype=tdtype)
            row = {"dtype": dtype, "B": B, "N": N}
            for key, need_weights in (("torch_no_weights", False), ("torch", True)):
                def step(need_weights=need_weights):
                    x.grad = None
                    mha.zero_grad(set_to_none=True)
                    out, _ = mha(x, x, x, need_weights=need_weights)
                    out.backward(dout)

                if not need_weights:  # the first call of this fresh process: nothing freed is resident yet
                    row[key + "_memory"] = peak_memory(step, traced=False)
                row[key] = median_time(step, repeats)
            result["rows"].append(row)
    return result


# --------------------------------------------------------------------------- driver
def _run_worker(kind, args, extra=()):
    """Run one library's measurements in a fresh Python process; None if it cannot run."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind,
           "--repeats", str(args.repeats), *extra] + (["--quick"] if args.quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        if kind == "torch" and "ModuleNotFoundError" in proc.stderr:
            return None
        raise RuntimeError(f"{kind} worker failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _mib(nbytes):
    """Bytes as MiB with no decimals, or "-" when not measured."""
    return "-" if nbytes is None else f"{nbytes / 2 ** 20:.0f}"


def _ms(t):
    return f"{t['median'] * 1e3:.1f}"


def _torch_rows(torch_result) -> dict:
    """PyTorch's rows of a run by case ``(dtype, B, N)``; empty when it was not installed."""
    return {(r["dtype"], r["B"], r["N"]): r for r in (torch_result or {}).get("rows", [])}


def _speed(r, numpy_result):
    """GFLOP/s of our forward+backward in row ``r``, and its fraction of the matmul peak."""
    gflops = r["flops"] / r["ours"]["median"] / 1e9
    return gflops, gflops / r.get("peak", numpy_result["peak"][r["dtype"]])


def make_table(numpy_result, torch_result) -> str:
    """The markdown table of one run."""
    torch_rows = _torch_rows(torch_result)
    lines = [
        "| dtype | B | N | ours ms | GFLOP/s | % of matmul peak | ours in one piece ms | separate heads ms"
        " | naive NumPy ms | torch MHA ms | ours / torch | torch (need_weights=False) ms"
        " | ours / that | ours peak MiB (traced / RSS) | torch (need_weights=False) peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in numpy_result["rows"]:
        t = r["ours"]["median"]
        gflops, of_peak = _speed(r, numpy_result)
        tr = torch_rows.get((r["dtype"], r["B"], r["N"]))
        torch_cols = ["-", "-", "-", "-"]
        if tr:
            torch_cols = [_ms(tr["torch"]), f"{t / tr['torch']['median']:.2f}",
                          _ms(tr["torch_no_weights"]), f"{t / tr['torch_no_weights']['median']:.2f}"]
        memory = r.get("memory", {})
        torch_memory = (tr or {}).get("torch_no_weights_memory", {})
        lines.append(" | ".join([
            f"| {r['dtype']}", str(r["B"]), str(r["N"]), _ms(r["ours"]), f"{gflops:.1f}",
            f"{100 * of_peak:.0f}%", _ms(r["ours_one_piece"]) if "ours_one_piece" in r else "-",
            _ms(r["separate_heads"]),
            _ms(r["naive"]), *torch_cols,
            f"{_mib(memory.get('traced'))} / {_mib(memory.get('rss'))}", _mib(torch_memory.get("rss"))]) + " |")
    peaks = ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in numpy_result["peak"].items())
    lines.append("")
    lines.append(f"Matmul peak measured in the same run, in the same process just before each"
                 f" case (last: {peaks}); D = {r['D']}, h = {r['h']},"
                 f" biases on; forward+backward FLOPs = 24*B*N*D^2 + 12*B*N^2*D; {_timing_words(r)};"
                 f" NumPy {numpy_result['numpy']}"
                 + (f"; PyTorch {torch_result['torch']} ({torch_result['threads']} threads)"
                    if torch_result else "; PyTorch not installed") + ".")
    tricks = numpy_result.get("tricks")
    if tricks:
        lines += ["", f"Each trick alone, at B = 1, h = {r['h']}, N = {tricks['N']}, d_k = {r['D'] // r['h']}"
                  " (median ms, before -> after):", "",
                  "| trick | " + " | ".join(f"{d} before | {d} after" for d in DTYPES if d in tricks) + " |",
                  "|---|" + "---|---|" * sum(d in tricks for d in DTYPES)]
        for i, (name, _, _) in enumerate(tricks[DTYPES[0]]):
            cells = [f"{tricks[d][i][1] * 1e3:.1f} | {tricks[d][i][2] * 1e3:.1f}" for d in DTYPES if d in tricks]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def make_plot(numpy_result, torch_result, path):
    """Bars of forward+backward time per configuration, one group per (dtype, B, N)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    torch_rows = _torch_rows(torch_result)
    series = [("ours", "attention_ref"), ("separate_heads", "separate heads"), ("naive", "naive NumPy")]
    if torch_rows:
        series += [("torch", "torch MHA"), ("torch_no_weights", "torch MHA, need_weights=False")]
    rows = numpy_result["rows"]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / len(series)
    for j, (key, label) in enumerate(series):
        ys = [(torch_rows.get((r["dtype"], r["B"], r["N"]), {}) if key.startswith("torch") else r)
              .get(key, {"median": float("nan")})["median"] * 1e3 for r in rows]
        ax.bar([i + (j - len(series) / 2 + 0.5) * width for i in range(len(rows))], ys, width, label=label)
    ax.set_xticks(range(len(rows)), [f"{r['dtype']}\nB={r['B']} N={r['N']}" for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("forward + backward, ms (median, log scale)")
    ax.set_title(f"Multi-head attention, D = {rows[0]['D']}, h = {rows[0]['h']}, biases on")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine(numpy_result, torch_result) -> dict:
    """Where a run was made: CPU model, core count, library versions and their threads."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    return {"cpu": (names[0] if names else platform.processor()) or platform.machine(),
            "cores": os.cpu_count(), "numpy": numpy_result["numpy"],
            "blas_threads": numpy_result.get("blas_threads"), "blas": numpy_result.get("blas"),
            "torch": torch_result["torch"] if torch_result else None,
            "torch_threads": torch_result["threads"] if torch_result else None}


def machine_line(run) -> str:
    """One sentence saying where and when ``run`` was measured."""
    m = run.get("machine")
    if m is None:
        return "Machine and date: not recorded in this run's JSON (it predates their recording)."
    torch = f"PyTorch {m['torch']} ({m['torch_threads']} threads)" if m["torch"] else "PyTorch not installed"
    blas = f"BLAS {m['blas']}, " if m.get("blas") else ""
    threads = run["numpy"].get("block_threads")  # None: a run from before the blocks
    blocks = {None: "", 0: "; attention_ref in one piece (no threadpoolctl or one BLAS thread)"}.get(
        threads, f"; attention_ref's blocks on {threads} threads where B h N^2 >= 2**24")
    return (f"Run of {run['date']} (UTC) on {m['cpu']}, {m['cores']} cores;"
            f" NumPy {m['numpy']} ({blas}BLAS threads: {m['blas_threads']}), {torch}{blocks}.")


def docs_table(run) -> str:
    """docs/performance_table.md: the machine line, then the full table of one run."""
    return machine_line(run) + "\n\n" + make_table(run["numpy"], run["torch"])


def readme_block(run) -> str:
    """The README's table: ours against the matmul peak and against both PyTorch paths."""
    numpy_result, torch_result = run["numpy"], run["torch"]
    torch_rows = _torch_rows(torch_result)
    lines = ["| dtype | B | N | ours | GFLOP/s | % of matmul peak"
             " | `torch.nn.MultiheadAttention(..., need_weights=True)` (default) | ours / that"
             " | `need_weights=False` (fused) | ours / that |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in numpy_result["rows"]:
        t = r["ours"]["median"]
        gflops, of_peak = _speed(r, numpy_result)
        cells = [r["dtype"], str(r["B"]), f"{r['N']:,}", f"{t * 1e3:.0f} ms", f"{gflops:.1f}",
                 f"{100 * of_peak:.0f}%"]
        tr = torch_rows.get((r["dtype"], r["B"], r["N"]))
        for key in ("torch", "torch_no_weights"):
            cells += [f"{tr[key]['median'] * 1e3:.0f} ms", f"{t / tr[key]['median']:.2f}"] if tr else ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    peaks = ", ".join(f"{k} {v:.0f}" for k, v in numpy_result["peak"].items())
    lines += ["", f"Forward + backward, D = {r['D']}, h = {r['h']}, biases on; {_timing_words(r)};"
              f" matmul peak (a 2048 x 2048 product, measured before each case;"
              f" last: {peaks} GFLOP/s). {machine_line(run)}"]
    return "\n".join(lines) + "\n"


def save(run, out, plot):
    """The table to ``out``, the raw numbers to ``out`` with .json and, if ``plot``, bars to .png."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(docs_table(run))
    out.with_suffix(".json").write_text(json.dumps(run, indent=1))
    if plot:
        make_plot(run["numpy"], run["torch"], out.with_suffix(".png"))


# What the numbers of a run say, as generated text: the prose of docs/performance.md quotes
# only these blocks, so a new run can never leave a hand-written number behind.
TARGETS = [  # (what, dtype, B, N, ratio against torch need_weights=False at most): issue 13
    ("float32, B = 1, N = 2048", "float32", 1, 2048, 1.25),
    ("float64, B = 1, N = 2048", "float64", 1, 2048, 1.25),
    ("float32, B = 4, N = 512", "float32", 4, 512, 1.25),
    ("float64, B = 4, N = 512", "float64", 4, 512, 1.25),
    ("float32, B = 8, N = 128", "float32", 8, 128, 1.5),
    ("float64, B = 8, N = 128", "float64", 8, 128, 1.5),
]
PEAK_TARGET = 0.55  # fraction of the matmul peak at B = 1, N = 2048, float32
BLOCKS_GAIN = 0.10  # the blocks on threads stay only if faster everywhere, by this much at N = 2048


def _cases(run):
    """(numpy row, torch row or None) per case of ``run``."""
    torch_rows = _torch_rows(run["torch"])
    return [(r, torch_rows.get((r["dtype"], r["B"], r["N"]))) for r in run["numpy"]["rows"]]


def _ratio(r, tr, key):
    return r["ours"]["median"] / tr[key]["median"]


def summary_block(run) -> str:
    """The run in a few sentences: against PyTorch both ways, against naive code."""
    cases = _cases(run)
    lines = []
    if all(tr for _, tr in cases):
        with_w = [_ratio(r, tr, "torch") for r, tr in cases]
        fused = [_ratio(r, tr, "torch_no_weights") for r, tr in cases]
        lines.append(f"Against `torch.nn.MultiheadAttention` with its default `need_weights=True`, ours takes"
                     f" {min(with_w):.2f}-{max(with_w):.2f}x its time (faster in {sum(x < 1 for x in with_w)}"
                     f" of {len(cases)} cases); against the fused `need_weights=False` path"
                     f" {min(fused):.2f}-{max(fused):.2f}x (faster in {sum(x < 1 for x in fused)} of {len(cases)}).")
    gains = _blocks_gains(run)
    if gains:
        g = [x for _, x in gains]
        threads = run["numpy"].get("block_threads")
        ratios = [1 - x for x in g]
        lines.append(f"With the (batch, head) blocks on {threads} threads ours takes {min(ratios):.2f}-{max(ratios):.2f}x"
                     f" the time of the same code in one piece with BLAS's own threads (faster in"
                     f" {sum(x > 0 for x in g)} of {len(g)} cases where they open, in this run; the blocks rule is"
                     f" decided with `--blocks-ab`).")
    big = max(cases, key=lambda c: (c[0]["N"], c[0]["dtype"] == "float32"))[0]
    lines.append(f"At B = {big['B']}, N = {big['N']:,} {big['dtype']} the careful code is"
                 f" {big['naive']['median'] / big['ours']['median']:.1f}x faster than the same maths written"
                 f" naively ({big['ours']['median']:.2f} s against {big['naive']['median']:.2f} s).")
    return " ".join(lines) + "\n"


def _blocks_open(B: int, h: int, N: int) -> bool:
    """Whether ours cuts blocks at this size: (B, h, N, N) probabilities of at least
    ``MIN_ELEMENTS`` numbers (below, "with the blocks" and "in one piece" are the same code)."""
    sys.path.insert(0, str(ROOT))
    from attention_ref._batch_blocks import MIN_ELEMENTS

    return B * h * N * N >= MIN_ELEMENTS


def _blocks_gains(run):
    """[(row, 1 - time with the blocks / time in one piece)] for the rows that measured both
    at a size where the blocks open."""
    return [(r, 1 - r["ours"]["median"] / r["ours_one_piece"]["median"])
            for r in run["numpy"]["rows"] if "ours_one_piece" in r and _blocks_open(r["B"], r["h"], r["N"])]


def targets_block(run) -> str:
    """The speed targets, each with this run's number and whether it is met."""
    cases = {(r["dtype"], r["B"], r["N"]): (r, tr) for r, tr in _cases(run)}
    lines = ["| target | measured | status |", "|---|---|---|"]
    for what, dtype, B, N, bound in TARGETS:
        r, tr = cases.get((dtype, B, N), (None, None))
        if r is None or tr is None:
            lines.append(f"| {what}: ours / torch (need_weights=False) <= {bound} | not measured | - |")
            continue
        x = _ratio(r, tr, "torch_no_weights")
        lines.append(f"| {what}: ours / torch (need_weights=False) <= {bound} | {x:.2f}"
                     f" (need_weights=True: {_ratio(r, tr, 'torch'):.2f}) | {'met' if x <= bound else 'not met'} |")
    r, _ = cases.get(("float32", 1, 2048), (None, None))
    if r is not None:
        _, frac = _speed(r, run["numpy"])
        lines.append(f"| >= {PEAK_TARGET:.0%} of the measured matmul peak, B = 1, N = 2048, float32 |"
                     f" {frac:.0%} | {'met' if frac >= PEAK_TARGET else 'not met'} |")
        r64, _ = cases.get(("float64", 1, 2048), (None, None))
        secs = [r["ours"]["median"]] + ([r64["ours"]["median"]] if r64 else [])
        lines.append(f"| a student's run at N = 2,048 well under a second | forward+backward"
                     f" {' s float32, '.join(f'{t:.2f}' for t in secs)} s{' float64' if r64 else ''} |"
                     f" {'met' if max(secs) < 1 else 'not met'} |")
    gains = _blocks_gains(run)
    if gains:
        big = [g for r, g in gains if r["N"] == max(q["N"] for q, _ in gains)]
        met = all(g > 0 for _, g in gains) and all(g >= BLOCKS_GAIN for g in big)
        lines.append(f"| the blocks on threads: faster than one piece at every size, by >= {BLOCKS_GAIN:.0%} at the"
                     f" longest N in both dtypes, where they open (in this run; decided with `--blocks-ab`) | faster in"
                     f" {sum(g > 0 for _, g in gains)} of {len(gains)}, by"
                     f" {', '.join(f'{100 * g:.0f}%' for _, g in gains)} (in table order) |"
                     f" {'met' if met else 'not met'} in this run |")
    return "\n".join(lines) + "\n"


def update_docs(run):
    """Rewrite the marked blocks of docs/performance.md and of the README from ``run``."""
    performance = ROOT / "docs" / "performance.md"
    for doc, block, name in [(performance, docs_table(run), "bench_mha"),
                             (performance, summary_block(run), "bench_mha summary"),
                             (performance, targets_block(run), "bench_mha targets"),
                             (ROOT / "README.md", readme_block(run), "bench_mha readme")]:
        if _update_doc(doc, block, name):
            print(f"wrote the {name} block of {doc.relative_to(ROOT)}")
        else:
            print(f"warning: {doc.relative_to(ROOT)} has no <!-- BEGIN {name} --> ... <!-- END {name} --> block")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a few seconds")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per case")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", default=None, metavar="FILE",
                       help="also write the table to FILE and the raw numbers to FILE's .json (default: print only)")
    where.add_argument("--write", action="store_true",
                       help="full run only: regenerate docs/performance_table.md/.json/.png and the tables"
                            " of docs/performance.md and README.md")
    where.add_argument("--render", action="store_true",
                       help="regenerate docs/performance_table.md and those tables from the committed"
                            " docs/performance_table.json, timing nothing")
    parser.add_argument("--plot", action="store_true", help="also plot in --quick mode (with --out)")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch even if installed")
    parser.add_argument("--rounds", type=int, default=None,
                        help="fresh processes per case and library, each timing the median over them"
                             " (default 3; 1 with --quick)")
    parser.add_argument("--blocks-ab", type=int, metavar="PAIRS", default=0,
                        help="only ours, with and without the blocks on threads, alternating fresh processes"
                             " PAIRS times per case; prints the medians and the blocks rule (writes nothing)")
    parser.add_argument("--worker", choices=("numpy", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)  # dtype:B:N, one case per worker
    parser.add_argument("--tricks", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--one-piece", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--one-piece-only", action="store_true", help=argparse.SUPPRESS)  # ours alone
    args = parser.parse_args(argv)
    if args.quick and args.write:
        parser.error("--write regenerates the committed docs and needs the full run: --quick sizes"
                     " must never become the committed numbers (use --out FILE to keep a quick run)")
    if args.blocks_ab and (args.write or args.render):
        parser.error("--blocks-ab only prints: it cannot be combined with --write or --render")
    if args.render:
        run = json.loads(TABLE.with_suffix(".json").read_text())
        TABLE.write_text(docs_table(run))
        print(f"wrote {TABLE.relative_to(ROOT)}")
        update_docs(run)
        return 0
    if args.repeats is None:
        args.repeats = 2 if args.quick else 7
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    configs = QUICK_CONFIGS if args.quick else FULL_CONFIGS
    D, h = (16, 2) if args.quick else (512, 8)
    if args.case:  # a worker measures one (dtype, B, N) case
        dtype, B, N = args.case.split(":")
        configs, dtypes = [(int(B), int(N))], (dtype,)
    else:
        dtypes = DTYPES
    if args.worker == "numpy":
        print(json.dumps(numpy_worker(configs, dtypes, args.repeats, D, h,
                                      64 if args.quick else 2048, tricks=args.tricks,
                                      one_piece=args.one_piece, only_ours=args.one_piece_only)))
        return 0
    if args.worker == "torch":
        print(json.dumps(torch_worker(configs, dtypes, args.repeats, D, h)))
        return 0
    if args.blocks_ab:
        print(blocks_ab(args, configs, args.blocks_ab))
        return 0
    # One fresh process per library AND per case, alternating NumPy and PyTorch, so a
    # change in the machine's load during the run hits both sides of each ratio alike; and
    # --rounds such rounds per case (ours, ours in one piece, PyTorch), each time the median
    # over the rounds: on a shared machine one process can be far off (docs/performance.md).
    numpy_result, torch_result, torch_ok = None, None, not args.no_torch
    for dtype in DTYPES:
        for B, N in configs:
            case = ["--case", f"{dtype}:{B}:{N}"]
            ours, one_piece, torch_rounds = [], [], []
            for i in range(args.rounds):
                ours.append(_run_worker("numpy", args, case + ([] if i == 0 else ["--one-piece-only"])))
                one_piece.append(_run_worker("numpy", args, case + ["--one-piece"]))
                t = _run_worker("torch", args, case) if torch_ok else None
                torch_ok = t is not None  # not installed: stop trying
                if t is not None:
                    torch_rounds.append(t)
            r = ours[0]  # the first round's full row: memory, separate heads, naive NumPy
            row = r["rows"][0]
            row["ours"] = _over_rounds([x["rows"][0]["ours"] for x in ours])
            row["ours_one_piece"] = _over_rounds([x["rows"][0]["ours"] for x in one_piece])
            if numpy_result is None:
                numpy_result = r
            else:
                numpy_result["rows"] += r["rows"]
                numpy_result["peak"].update(r["peak"])
            if torch_rounds:
                t = torch_rounds[0]
                for key in ("torch", "torch_no_weights"):
                    t["rows"][0][key] = _over_rounds([x["rows"][0][key] for x in torch_rounds])
                if torch_result is None:
                    torch_result = t
                else:
                    torch_result["rows"] += t["rows"]
    n_tricks = configs[-1][1]  # each trick alone at the longest sequence, B = 1
    numpy_result["tricks"] = {"N": n_tricks}
    for dtype in DTYPES:
        r = _run_worker("numpy", args, ["--tricks", "--case", f"{dtype}:1:{n_tricks}"])
        numpy_result["tricks"][dtype] = r["tricks"][dtype]
    run = {"numpy": numpy_result, "torch": torch_result, "machine": machine(numpy_result, torch_result),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}
    print(docs_table(run))
    if args.out:
        save(run, Path(args.out), plot=args.plot or not args.quick)
        print(f"wrote {args.out} and its .json" + (", .png" if args.plot or not args.quick else ""))
    if args.write:
        save(run, TABLE, plot=True)
        print(f"wrote {TABLE.relative_to(ROOT)}, .json, .png")
        update_docs(run)
    return 0


def blocks_ab(args, configs, pairs) -> str:
    """Ours with the blocks on threads against ours in one piece, alternating fresh processes
    ``pairs`` times per case (on a noisy machine one run of each cannot decide); the
    markdown table of the medians over the pairs, and the blocks rule's verdict."""
    D, h = (16, 2) if args.quick else (512, 8)
    lines = ["| dtype | B | N | with the blocks ms (median of the pairs) | in one piece ms | gain |",
             "|---|---|---|---|---|---|"]
    gains = {}
    for dtype in DTYPES:
        for B, N in configs:
            if not _blocks_open(B, h, N):
                lines.append(f"| {dtype} | {B} | {N} | in one piece either way (below MIN_ELEMENTS) | - | - |")
                continue
            case = ["--case", f"{dtype}:{B}:{N}"]
            times = {"blocks": [], "one_piece": []}
            for _ in range(pairs):
                for key, extra in (("blocks", []), ("one_piece", ["--one-piece"])):
                    times[key].append(_run_worker("numpy", args, case + ["--one-piece-only"] + extra)
                                      ["rows"][0]["ours"]["median"])
            on, off = statistics.median(times["blocks"]), statistics.median(times["one_piece"])
            gains[(dtype, N)] = 1 - on / off
            lines.append(f"| {dtype} | {B} | {N} | {on * 1e3:.1f} | {off * 1e3:.1f} | {100 * gains[(dtype, N)]:.0f}% |")
    longest = max(n for _, n in configs)
    met = bool(gains) and all(g > 0 for g in gains.values()) and all(
        g >= BLOCKS_GAIN for (_, n), g in gains.items() if n == longest)
    lines += ["", f"{pairs} alternating pairs of fresh processes per case; the rule (faster at every size where"
                  f" the blocks open, by >= {BLOCKS_GAIN:.0%} at N = {longest} in both dtypes):"
                  f" {'met' if met else 'not met'}."]
    return "\n".join(lines)


def _timing_words(row) -> str:
    """How a row's times were taken, in words."""
    rounds = row["ours"].get("rounds", 1)
    each = "median of the timed runs after one warm-up"
    return each if rounds == 1 else f"{each}, then the median over {rounds} fresh processes per case and library"


def _over_rounds(timings):
    """One timing from several rounds' ``{"median", "min", "max"}``: the median of their
    medians, the smallest minimum, the largest maximum, and how many rounds."""
    return {"median": statistics.median(t["median"] for t in timings), "min": min(t["min"] for t in timings),
            "max": max(t["max"] for t in timings), "rounds": len(timings)}


def _update_doc(doc, block, name="bench_mha") -> bool:
    """Replace the text between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` of ``doc``;
    False (and nothing written) unless both markers exist."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    if not doc.exists():
        return False
    text = doc.read_text()
    if begin not in text or end not in text:
        return False
    head, rest = text.split(begin, 1)
    doc.write_text(head + begin + "\n" + block + rest[rest.index(end):])
    return True


if __name__ == "__main__":
    sys.exit(main())
