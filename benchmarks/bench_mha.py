"""Forward+backward speed of multi-head attention: attention_ref's fast path and its
reference, against BLAS and PyTorch.

Run from the repository root::

    python benchmarks/bench_mha.py --quick    # tiny sizes, a few seconds: checks it runs
    python benchmarks/bench_mha.py            # full run, about 5 minutes on 2 cores (more with PyTorch)
    python benchmarks/bench_mha.py --case float32:1:2048   # one case of the full run, printed only
    python benchmarks/bench_mha.py --write    # full run, then regenerate the committed docs
    python benchmarks/bench_mha.py --render   # regenerate the docs from the committed JSON

Two paths of the library are timed side by side: the **fast path**
(``attention_ref.fast.multi_head_attention_forward_fast`` / ``_backward_fast``, what the public
functions run at these sizes) and the **reference** (``attention_ref.core``'s pair: the
formulas, without the speed tricks). The fast path is the main column: GFLOP/s, the fraction
of the matmul peak and the ratios to PyTorch are its own.

It prints a markdown table and writes nothing unless asked: ``--out FILE`` writes the table
to FILE with the raw numbers (JSON) beside it; ``--write`` (full run only: tiny sizes must
never become the committed numbers) rewrites ``docs/performance_table.md/.json/.png``, the
marked table of ``docs/performance.md`` and the marked table of the README's Performance
section, with the machine and the date of the run. Every path and library is timed in its
OWN fresh subprocess, one per case: NumPy's BLAS threads and PyTorch's thread pool fight
over the cores when they share a process, and memory one path freed stays resident for the
next. PyTorch is used only when it happens to be installed; it is never a dependency.

Timing: ``time.perf_counter``, one warm-up call, then the median of ``--repeats`` runs
(the spread, min..max, is recorded too, so noise is visible); a full run does that in
``--rounds`` (3) rounds of fresh processes per case (fast path, reference, PyTorch, in turn)
and keeps the median of the rounds.

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
import signal
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
PATHS = ("fast", "reference")  # attention_ref.fast and attention_ref.core


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


def _atomic():
    """This checkout's atomic writes (a temporary file beside the target, renamed over it)."""
    sys.path.insert(0, str(ROOT))
    from attention_ref import _atomic

    return _atomic


def _pair(path):
    """The multi-head forward and backward of ``path``: "fast" (``attention_ref.fast``,
    whatever the size) or "reference" (``attention_ref.core``, the formulas)."""
    sys.path.insert(0, str(ROOT))
    import attention_ref

    if path == "fast":
        return attention_ref.fast.multi_head_attention_forward_fast, attention_ref.fast.multi_head_attention_backward_fast
    return attention_ref.core.multi_head_attention_forward, attention_ref.core.multi_head_attention_backward


def numpy_worker(configs, dtypes, repeats, D, h, peak_n, path="fast", time_only=False):
    """Time one path of attention_ref (``"fast"`` or ``"reference"``) in this process; return
    a JSON-able dict with one row per case, its forward+backward ``time`` and, unless
    ``time_only``, its ``memory``. The fast path's worker also measures the BLAS matmul peak
    (a ``peak_n`` square product) just before its cases, unless ``time_only``."""
    import numpy as np

    forward, backward = _pair(path)
    blas_threads, blas = _blas_info()
    result = {"path": path, "peak": {}, "rows": [], "numpy": np.__version__, "blas_threads": blas_threads,
              "blas": blas}
    if path == "fast" and not time_only:
        for dtype in dtypes:  # BLAS peak: a large square matrix product, 2*n^3 FLOPs
            a = np.random.default_rng(0).standard_normal((peak_n, peak_n)).astype(dtype)
            b = a.T.copy()  # not a.T itself: NumPy would call syrk for a @ a.T
            t = median_time(lambda: a @ b, max(3, repeats))
            result["peak"][dtype] = 2 * peak_n ** 3 / t["median"] / 1e9
    for dtype in dtypes:
        for B, N in configs:
            x, dout, p = _inputs(np, B, N, D, dtype)

            def step():
                out, cache = forward(x, x, x, p, h)
                return backward(dout, cache)

            row = {"dtype": dtype, "B": B, "N": N, "D": D, "h": h, "flops": mha_flops(B, N, D, h)}
            if dtype in result["peak"]:
                row["peak"] = result["peak"][dtype]  # measured in this process, just before
            if not time_only:
                row["memory"] = peak_memory(step)  # first: before timing leaves freed memory resident
            row["time"] = median_time(step, repeats)
            result["rows"].append(row)
    return result


def tricks_worker(np, N, D, h, dtype, repeats):
    """Each trick of the fast path measured alone, "before" against "after", on (1, h, N, N)
    scores; returns ``[(trick, before seconds, after seconds), ...]``. "Before" is the
    reference's way (``attention_ref.core``) or the fast path with that one trick switched off."""
    from attention_ref.core.attention import AttentionCache
    from attention_ref.core.softmax import _softmax
    from attention_ref.fast import attention, row_blocks
    from attention_ref.fast.softmax import softmax_backward_in_place, softmax_in_place

    rng = np.random.default_rng(1)
    d_k = D // h
    x = rng.standard_normal((N, D)).astype(dtype)
    W = [(rng.standard_normal((D, D)) / D ** 0.5).astype(dtype) for _ in range(3)]
    W_qkv = np.concatenate(W, axis=1)  # (D, 3D)
    q, k, v, dout = (rng.standard_normal((1, h, N, d_k)).astype(dtype) for _ in range(4))
    q_strided = (x @ W[0]).reshape(N, h, d_k).transpose(1, 0, 2)[None]  # a split-heads view
    scale = 1.0 / d_k ** 0.5
    S = (q * scale) @ k.swapaxes(-1, -2)
    P = _softmax(S, -1)
    dP = dout @ v.swapaxes(-1, -2)
    out = P @ v
    D_row = (dout * out).sum(axis=-1, keepdims=True)
    rows = []

    def pair(name, before, after, n=repeats):
        rows.append((name, median_time(before, n)["median"], median_time(after, n)["median"]))

    def without(module, name, value, fn):
        """``fn`` with ``module.name`` set to ``value`` during the call (a trick switched off)."""
        def run():
            default = getattr(module, name)
            setattr(module, name, value)
            try:
                return fn()
            finally:
                setattr(module, name, default)
        return run

    def unblocked(fn):
        return without(row_blocks, "BLOCK_ELEMENTS", 1 << 62, fn)  # every array is one row block

    def scores():
        return (q * scale) @ k.swapaxes(-1, -2)

    pair("scale folded into q: (q / sqrt(d_k)) k^T instead of (q k^T) / sqrt(d_k)",
         lambda: (q @ k.swapaxes(-1, -2)) * scale, lambda: (q * scale) @ k.swapaxes(-1, -2))
    pair("D_i = rowsum(dout_i * out_i) instead of rowsum(P_i * dP_i)",
         lambda: (P * dP).sum(axis=-1, keepdims=True), lambda: (dout * out).sum(axis=-1, keepdims=True))
    pair("softmax in place on the fresh scores instead of into new arrays (the reference's)",
         lambda: _softmax(scores(), -1), unblocked(lambda: softmax_in_place(scores())))
    pair("Python float scale instead of np.float64 scalar (float32 input: no upcast)",
         lambda: softmax_in_place((q * np.float64(scale)) @ k.swapaxes(-1, -2)),
         lambda: softmax_in_place(scores()))
    buf = np.empty_like(S)

    def softmax_fresh():
        np.copyto(buf, S)  # the same copy in "before" and "after"
        softmax_in_place(buf)

    dP_buf = np.empty_like(dP)

    def ds_fresh():
        np.copyto(dP_buf, dP)
        softmax_backward_in_place(dP_buf, P, D_row)

    pair("softmax over cache-sized row blocks (vs one pass per step)", unblocked(softmax_fresh), softmax_fresh)
    pair("dS = P * (dP - D) over row blocks", unblocked(ds_fresh), ds_fresh)
    cache = AttentionCache(q, k, v, P, out, scale)

    def backward():
        return attention._attention_backward(dout, cache)

    pair("backward's dP and dS over blocks of query rows in one buffer (vs one fresh (h, N, N) dP)",
         without(attention, "QUERY_BLOCK_ELEMENTS", 1 << 62, backward), backward)
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
_PARENT_ENV = "ATTENTION_REF_BENCH_PARENT"  # the driver's pid, handed to each worker


def _end_with_parent():
    """In a worker: end when the driver ends, however it ends. On Linux the kernel sends SIGKILL
    when the parent dies (``PR_SET_PDEATHSIG``); elsewhere a thread polls the parent's pid."""
    parent = int(os.environ.get(_PARENT_ENV, "0"))
    if not parent:
        return
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    else:
        import threading

        def watch():
            while os.getppid() == parent:
                time.sleep(0.2)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:  # the driver died before the line above
        os._exit(1)


def _end_on_sigterm():
    """In the driver: SIGTERM unwinds like Ctrl-C, so the running worker is killed (below)."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def _run_worker(kind, args, extra=()):
    """Run one measurement in a fresh Python process; None if it cannot run (PyTorch absent).
    The worker never outlives this process: killed here on any exit, and by the kernel (or its own
    watch) if this process is killed outright."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind,
           "--repeats", str(args.repeats), *extra] + (["--quick"] if args.quick else [])
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, _PARENT_ENV: str(os.getpid())})
    try:
        stdout, stderr = child.communicate()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    proc = subprocess.CompletedProcess(cmd, child.returncode, stdout, stderr)
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
    """GFLOP/s of the fast path's forward+backward in row ``r``, and its fraction of the matmul peak."""
    gflops = r["flops"] / r["fast"]["median"] / 1e9
    return gflops, gflops / r.get("peak", numpy_result["peak"][r["dtype"]])


def _memory(memory) -> str:
    return f"{_mib(memory.get('traced'))} / {_mib(memory.get('rss'))}"


def make_table(numpy_result, torch_result) -> str:
    """The markdown table of one run."""
    torch_rows = _torch_rows(torch_result)
    lines = [
        "| dtype | B | N | fast ms | GFLOP/s | % of matmul peak | reference ms | reference / fast"
        " | torch MHA ms | fast / torch | torch (need_weights=False) ms | fast / that"
        " | fast peak MiB (traced / RSS) | reference peak MiB (traced / RSS)"
        " | torch (need_weights=False) peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in numpy_result["rows"]:
        t = r["fast"]["median"]
        gflops, of_peak = _speed(r, numpy_result)
        tr = torch_rows.get((r["dtype"], r["B"], r["N"]))
        torch_cols = ["-", "-", "-", "-"]
        if tr:
            torch_cols = [_ms(tr["torch"]), f"{t / tr['torch']['median']:.2f}",
                          _ms(tr["torch_no_weights"]), f"{t / tr['torch_no_weights']['median']:.2f}"]
        torch_memory = (tr or {}).get("torch_no_weights_memory", {})
        lines.append(" | ".join([
            f"| {r['dtype']}", str(r["B"]), str(r["N"]), _ms(r["fast"]), f"{gflops:.1f}", f"{100 * of_peak:.0f}%",
            _ms(r["reference"]), f"{r['reference']['median'] / t:.2f}", *torch_cols,
            _memory(r.get("fast_memory", {})), _memory(r.get("reference_memory", {})),
            _mib(torch_memory.get("rss"))]) + " |")
    peaks = ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in numpy_result["peak"].items())
    lines.append("")
    lines.append(f"fast: `attention_ref.fast.multi_head_attention_forward_fast` / `_backward_fast`; reference:"
                 f" `attention_ref.core`'s pair (the formulas, no speed tricks); each in its own fresh"
                 f" process per case. Matmul peak measured in the fast path's process just before each"
                 f" case (last: {peaks}); D = {r['D']}, h = {r['h']},"
                 f" biases on; forward+backward FLOPs = 24*B*N*D^2 + 12*B*N^2*D; {_timing_words(r)};"
                 f" NumPy {numpy_result['numpy']}"
                 + (f"; PyTorch {torch_result['torch']} ({torch_result['threads']} threads)"
                    if torch_result else "; PyTorch not installed") + ".")
    tricks = numpy_result.get("tricks")
    if tricks and any(d in tricks for d in DTYPES):
        lines += ["", f"Each trick alone, at B = 1, h = {r['h']}, N = {tricks['N']}, d_k = {r['D'] // r['h']}"
                  " (median ms, before -> after):", "",
                  "| trick | " + " | ".join(f"{d} before | {d} after" for d in DTYPES if d in tricks) + " |",
                  "|---|" + "---|---|" * sum(d in tricks for d in DTYPES)]
        first = next(d for d in DTYPES if d in tricks)
        for i, (name, _, _) in enumerate(tricks[first]):
            cells = [f"{tricks[d][i][1] * 1e3:.1f} | {tricks[d][i][2] * 1e3:.1f}" for d in DTYPES if d in tricks]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def make_plot(numpy_result, torch_result, path):
    """Bars of forward+backward time per configuration, one group per (dtype, B, N)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    torch_rows = _torch_rows(torch_result)
    series = [("fast", "attention_ref, fast path"), ("reference", "attention_ref, reference")]
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
    with _atomic().atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
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
    return (f"Run of {run['date']} (UTC) on {m['cpu']}, {m['cores']} cores;"
            f" NumPy {m['numpy']} ({blas}BLAS threads: {m['blas_threads']}), {torch}.")


def docs_table(run) -> str:
    """docs/performance_table.md: the machine line, then the full table of one run."""
    return machine_line(run) + "\n\n" + make_table(run["numpy"], run["torch"])


def readme_block(run) -> str:
    """The README's table: the fast path against the matmul peak, the reference and both PyTorch paths."""
    numpy_result, torch_result = run["numpy"], run["torch"]
    torch_rows = _torch_rows(torch_result)
    lines = ["| dtype | B | N | fast path | GFLOP/s | % of matmul peak | reference"
             " | `torch.nn.MultiheadAttention(..., need_weights=True)` (default) | fast path / that"
             " | `need_weights=False` (fused) | fast path / that |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in numpy_result["rows"]:
        t = r["fast"]["median"]
        gflops, of_peak = _speed(r, numpy_result)
        cells = [r["dtype"], str(r["B"]), f"{r['N']:,}", f"{t * 1e3:.0f} ms", f"{gflops:.1f}",
                 f"{100 * of_peak:.0f}%", f"{r['reference']['median'] * 1e3:.0f} ms"]
        tr = torch_rows.get((r["dtype"], r["B"], r["N"]))
        for key in ("torch", "torch_no_weights"):
            cells += [f"{tr[key]['median'] * 1e3:.0f} ms", f"{t / tr[key]['median']:.2f}"] if tr else ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    peaks = ", ".join(f"{k} {v:.0f}" for k, v in numpy_result["peak"].items())
    lines += ["", f"Forward + backward, D = {r['D']}, h = {r['h']}, biases on; fast path:"
              f" `attention_ref.fast.multi_head_attention_*_fast` (what the public functions run at these sizes),"
              f" reference: `attention_ref.core.multi_head_attention_*`; {_timing_words(r)};"
              f" matmul peak (a 2048 x 2048 product, measured before each case;"
              f" last: {peaks} GFLOP/s). {machine_line(run)}"]
    return "\n".join(lines) + "\n"


def save(run, out, plot):
    """The table to ``out``, the raw numbers to ``out`` with .json and, if ``plot``, bars to .png."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _atomic().write_atomic(out, docs_table(run))
    _atomic().write_atomic(out.with_suffix(".json"), json.dumps(run, indent=1))
    if plot:
        make_plot(run["numpy"], run["torch"], out.with_suffix(".png"))


def schema_problem(run):
    """Why ``run`` (a JSON of this script) cannot be rendered, or None: every row must have
    the fast path's and the reference's times (runs from before their split have "ours")."""
    rows = (run.get("numpy") or {}).get("rows") or []
    if not rows:
        return "it has no rows"
    if any("fast" not in r or "reference" not in r for r in rows):
        old = " (columns 'ours', 'ours in one piece', 'naive NumPy': a run from before the fast path" \
              " and the reference were timed apart)" if any("ours" in r for r in rows) else ""
        return f"its rows lack the 'fast' and 'reference' times{old}"
    return None


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


def _cases(run):
    """(numpy row, torch row or None) per case of ``run``."""
    torch_rows = _torch_rows(run["torch"])
    return [(r, torch_rows.get((r["dtype"], r["B"], r["N"]))) for r in run["numpy"]["rows"]]


def _ratio(r, tr, key):
    return r["fast"]["median"] / tr[key]["median"]


def summary_block(run) -> str:
    """The run in a few sentences: the fast path against PyTorch both ways and against the reference."""
    cases = _cases(run)
    lines = []
    if all(tr for _, tr in cases):
        with_w = [_ratio(r, tr, "torch") for r, tr in cases]
        fused = [_ratio(r, tr, "torch_no_weights") for r, tr in cases]
        lines.append(f"Against `torch.nn.MultiheadAttention` with its default `need_weights=True`, the fast path"
                     f" takes {min(with_w):.2f}-{max(with_w):.2f}x its time (faster in {sum(x < 1 for x in with_w)}"
                     f" of {len(cases)} cases); against the fused `need_weights=False` path"
                     f" {min(fused):.2f}-{max(fused):.2f}x (faster in {sum(x < 1 for x in fused)} of {len(cases)}).")
    speedups = [r["reference"]["median"] / r["fast"]["median"] for r, _ in cases]
    lines.append(f"The reference takes {min(speedups):.2f}-{max(speedups):.2f}x the fast path's time"
                 f" (the fast path faster in {sum(x > 1 for x in speedups)} of {len(cases)} cases).")
    big = max(cases, key=lambda c: (c[0]["N"], c[0]["dtype"] == "float32"))[0]
    fast, reference = big["fast"]["median"], big["reference"]["median"]
    than = (f"{reference / fast:.2f}x faster than" if reference >= fast else
            f"{fast / reference:.2f}x slower than")
    lines.append(f"At B = {big['B']}, N = {big['N']:,} {big['dtype']} the fast path is {than} the reference,"
                 f" the same maths without the speed tricks ({fast:.2f} s against {reference:.2f} s).")
    return " ".join(lines) + "\n"


def targets_block(run) -> str:
    """The speed targets, each with this run's number and whether it is met."""
    cases = {(r["dtype"], r["B"], r["N"]): (r, tr) for r, tr in _cases(run)}
    lines = ["| target | measured | status |", "|---|---|---|"]
    for what, dtype, B, N, bound in TARGETS:
        r, tr = cases.get((dtype, B, N), (None, None))
        if r is None or tr is None:
            lines.append(f"| {what}: fast / torch (need_weights=False) <= {bound} | not measured | - |")
            continue
        x = _ratio(r, tr, "torch_no_weights")
        lines.append(f"| {what}: fast / torch (need_weights=False) <= {bound} | {x:.2f}"
                     f" (need_weights=True: {_ratio(r, tr, 'torch'):.2f}) | {'met' if x <= bound else 'not met'} |")
    r, _ = cases.get(("float32", 1, 2048), (None, None))
    if r is not None:
        _, frac = _speed(r, run["numpy"])
        lines.append(f"| >= {PEAK_TARGET:.0%} of the measured matmul peak, B = 1, N = 2048, float32 (fast path) |"
                     f" {frac:.0%} | {'met' if frac >= PEAK_TARGET else 'not met'} |")
        r64, _ = cases.get(("float64", 1, 2048), (None, None))
        secs = [r["fast"]["median"]] + ([r64["fast"]["median"]] if r64 else [])
        lines.append(f"| a student's run at N = 2,048 well under a second (fast path) | forward+backward"
                     f" {' s float32, '.join(f'{t:.2f}' for t in secs)} s{' float64' if r64 else ''} |"
                     f" {'met' if max(secs) < 1 else 'not met'} |")
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


def _parse_case(text):
    """``"float32:1:2048"`` -> ``("float32", 1, 2048)``; ValueError if it is not DTYPE:B:N."""
    dtype, B, N = text.split(":")
    if dtype not in DTYPES or int(B) < 1 or int(N) < 1:
        raise ValueError(text)
    return dtype, int(B), int(N)


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
    parser.add_argument("--case", metavar="DTYPE:B:N",
                        help="only this case, e.g. float32:1:2048 (D = 512, h = 8; D = 16, h = 2 with --quick),"
                             " with the trick table at its N unless --no-tricks; cannot --write")
    parser.add_argument("--no-tricks", action="store_true", help="skip the table of the tricks measured alone")
    parser.add_argument("--plot", action="store_true", help="also plot in --quick mode (with --out)")
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch even if installed")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of fresh processes per case (fast path, reference, PyTorch), each"
                             " time the median over them (default 3; 1 with --quick)")
    parser.add_argument("--worker", choices=("numpy", "torch", "tricks"), help=argparse.SUPPRESS)
    parser.add_argument("--path", choices=PATHS, default="fast", help=argparse.SUPPRESS)  # numpy worker
    parser.add_argument("--time-only", action="store_true", help=argparse.SUPPRESS)  # no memory, no peak
    args = parser.parse_args(argv)
    if args.quick and args.write:
        parser.error("--write regenerates the committed docs and needs the full run: --quick sizes"
                     " must never become the committed numbers (use --out FILE to keep a quick run)")
    if args.case and (args.write or args.render):
        parser.error("--case measures one case: it cannot --write the committed docs (the full run) nor --render")
    if args.render:
        run = json.loads(TABLE.with_suffix(".json").read_text())
        problem = schema_problem(run)
        if problem:
            print(f"error: cannot render {TABLE.with_suffix('.json').relative_to(ROOT)}: {problem}. Regenerate it"
                  " with a full run: python benchmarks/bench_mha.py --write", file=sys.stderr)
            return 1
        _atomic().write_atomic(TABLE, docs_table(run))
        print(f"wrote {TABLE.relative_to(ROOT)}")
        update_docs(run)
        return 0
    if args.repeats is None:
        args.repeats = 2 if args.quick else 7
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    configs, dtypes = QUICK_CONFIGS if args.quick else FULL_CONFIGS, DTYPES
    D, h = (16, 2) if args.quick else (512, 8)
    if args.case:
        try:
            dtype, B, N = _parse_case(args.case)
        except ValueError:
            parser.error(f"--case wants DTYPE:B:N with DTYPE in {', '.join(DTYPES)}, e.g. float32:1:2048;"
                         f" got {args.case!r}")
        configs, dtypes = [(B, N)], (dtype,)
    if args.worker:
        _end_with_parent()
    if args.worker == "numpy":  # one path, one case
        print(json.dumps(numpy_worker(configs, dtypes, args.repeats, D, h, 64 if args.quick else 2048,
                                      path=args.path, time_only=args.time_only)))
        return 0
    if args.worker == "tricks":  # each trick alone at B = 1 and the case's N
        import numpy as np

        sys.path.insert(0, str(ROOT))
        print(json.dumps({d: tricks_worker(np, configs[-1][1], D, h, d, args.repeats) for d in dtypes}))
        return 0
    if args.worker == "torch":
        print(json.dumps(torch_worker(configs, dtypes, args.repeats, D, h)))
        return 0
    # One fresh process per path or library AND per case, in turn (fast path, reference,
    # PyTorch), so a change in the machine's load during the run hits every column of a
    # case alike; and --rounds such rounds per case, each time the median over the rounds:
    # on a shared machine one process can be far off (docs/performance.md). The first
    # round's processes also measure memory (and the fast path's the matmul peak).
    numpy_result, torch_result, torch_ok = None, None, not args.no_torch
    for dtype in dtypes:
        for B, N in configs:
            case = ["--case", f"{dtype}:{B}:{N}"]
            paths, torch_rounds = {path: [] for path in PATHS}, []
            for i in range(args.rounds):
                for path in PATHS:
                    paths[path].append(_run_worker("numpy", args, case + ["--path", path]
                                                   + ([] if i == 0 else ["--time-only"])))
                t = _run_worker("torch", args, case) if torch_ok else None
                torch_ok = t is not None  # not installed: stop trying
                if t is not None:
                    torch_rounds.append(t)
            first = paths["fast"][0]
            row = {key: value for key, value in first["rows"][0].items() if key not in ("time", "memory")}
            for path in PATHS:
                row[path] = _over_rounds([w["rows"][0]["time"] for w in paths[path]])
                row[path + "_memory"] = paths[path][0]["rows"][0]["memory"]
            if numpy_result is None:
                numpy_result = {key: first[key] for key in ("numpy", "blas_threads", "blas")}
                numpy_result.update(peak={}, rows=[])
            numpy_result["rows"].append(row)
            numpy_result["peak"].update(first["peak"])
            if torch_rounds:
                t = torch_rounds[0]
                for key in ("torch", "torch_no_weights"):
                    t["rows"][0][key] = _over_rounds([x["rows"][0][key] for x in torch_rounds])
                if torch_result is None:
                    torch_result = t
                else:
                    torch_result["rows"] += t["rows"]
    if not args.no_tricks:
        n_tricks = configs[-1][1]  # each trick alone at the longest sequence, B = 1
        numpy_result["tricks"] = {"N": n_tricks}
        for dtype in dtypes:
            numpy_result["tricks"].update(_run_worker("tricks", args, ["--case", f"{dtype}:1:{n_tricks}"]))
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


def _timing_words(row) -> str:
    """How a row's times were taken, in words."""
    rounds = row["fast"].get("rounds", 1)
    each = "median of the timed runs after one warm-up"
    return each if rounds == 1 else f"{each}, then the median over {rounds} rounds of fresh processes per case"


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
    _atomic().write_atomic(doc, head + begin + "\n" + block + rest[rest.index(end):])
    return True


if __name__ == "__main__":
    _end_on_sigterm()  # the script only: main() called from Python leaves the caller's handlers alone
    sys.exit(main())
