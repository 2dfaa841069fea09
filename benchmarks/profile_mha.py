"""Where the time of multi-head attention goes: each numbered step of the forward and the
backward, timed on its own, next to what it would take at this machine's limits.

For one configuration (batch B, length N, width D = 512, h = 8 heads, query = key = value,
biases on) it runs the steps of the fast path's ``multi_head_attention_forward_fast`` /
``_backward_fast`` (``attention_ref.fast``, what the public functions run at these sizes) one by
one (the same operations, in the same order, on the same arrays; the backward's blocks of
query rows are timed as whole steps) and prints for each: its time, its matrix-product FLOPs
or the bytes it moves, and the time those would take at the measured matmul peak (a large
square product) or memory bandwidth (a large copy). The column "x limit" is how far each
step is from its limit; the last lines compare the sum of the steps with the library's own
forward+backward, on the fast path and on the reference (``attention_ref.core``, the
formulas without the speed tricks).

    python benchmarks/profile_mha.py                    # B=1, N=2048, float32 and float64
    python benchmarks/profile_mha.py --B 4 --N 512 --dtype float64
    python benchmarks/profile_mha.py --write            # also the table in docs/performance.md

Timings move from run to run and machine to machine; the table in the docs says where and
when it was measured.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import sys
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_mha, beside this script

from attention_ref import core, fast  # noqa: E402
from attention_ref.core.heads import _merge, _split  # noqa: E402
from attention_ref.fast.linear import _matmul_rows  # noqa: E402
from attention_ref.fast.row_blocks import BLOCK_ELEMENTS  # noqa: E402
from attention_ref.fast.softmax import softmax_backward_in_place, softmax_in_place  # noqa: E402
from bench_mha import median_time  # noqa: E402

DOC = ROOT / "docs" / "performance.md"
D, H = 512, 8


def _time(fn, repeats):
    """Median seconds of ``repeats`` calls after one warm-up call (bench_mha's timing)."""
    return median_time(fn, repeats)["median"]


def limits(dtype, repeats):
    """(matmul peak in FLOP/s, memory bandwidth in bytes/s), measured here."""
    n = 1536
    a = np.random.default_rng(0).standard_normal((n, n)).astype(dtype)
    b = a.T.copy()
    peak = 2 * n ** 3 / _time(lambda: a @ b, repeats)
    big = np.ones(32 * 2 ** 20 // np.dtype(dtype).itemsize * 4, dtype)  # 128 MiB
    dst = np.empty_like(big)
    bandwidth = 2 * big.nbytes / _time(lambda: np.copyto(dst, big), repeats)  # read + write
    return peak, bandwidth


def steps(B, N, dtype, repeats):
    """[(step, seconds, flops, bytes, part)] for the forward and backward, in the library's order; ``part``:
    a row timing a part of the step before it, left out of the sum of the steps."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, N, D)).astype(dtype)
    dout = rng.standard_normal((B, N, D)).astype(dtype)
    p = {f"W_{n}": (rng.standard_normal((D, D)) / math.sqrt(D)).astype(dtype) for n in "qkvo"}
    p.update({f"b_{n}": (0.1 * rng.standard_normal(D)).astype(dtype) for n in "qkvo"})
    dk = D // H
    scale = 1.0 / math.sqrt(dk)
    item = np.dtype(dtype).itemsize
    BND, BHNN = B * N * D, B * H * N * N
    mm_proj, mm_att = 2 * BND * D, 2 * B * N * N * D  # one projection; one of the four N x N products
    rows = []

    def step(name, fn, flops=0, nbytes=0, part=False, scale_time=1.0):
        """Time ``fn`` (times ``scale_time``: a sample's time scaled to the whole step) as one row."""
        rows.append((name, _time(fn, repeats) * scale_time, flops, nbytes, part))
        return fn()

    # forward
    Q = step("1. projections x W_q, x W_k, x W_v",
             lambda: [_matmul_rows(x, p[f"W_{n}"]) + p[f"b_{n}"] for n in "qkv"], 3 * mm_proj)
    q, k, v = (_split(a, H) for a in Q)  # (B, H, N, dk) views
    scores = step("3a. scores (q / sqrt(d_k)) k^T", lambda: (q * scale) @ k.swapaxes(-1, -2), mm_att)
    buffer = scores.copy()  # softmax of a softmax costs the same: the buffer is reused, no copy timed
    # max, subtract, exp, sum, divide: about 7 passes over the (B, H, N, N) array
    step("3b. softmax, in place", lambda: softmax_in_place(buffer), 0, 7 * BHNN * item)
    # the softmax's exp, in the cache as the softmax's blocks are: one block of the shifted scores (all <= 0),
    # out of place (the softmax writes over its block; run again, that would be exp of exp), its time scaled to
    # the whole array; its "x limit" compares an in-cache time with the memory bandwidth
    block = np.ascontiguousarray((scores - scores.max(axis=-1, keepdims=True)).reshape(-1)[:BLOCK_ELEMENTS])
    exps = np.empty_like(block)

    def exp_of_one_block():
        with np.errstate(under="ignore"):  # far below the maximum: 0, as in the softmax
            np.exp(block, out=exps)

    step("3b, of it: `np.exp`, timed on one cache-sized block (out of place) and scaled (not in the sum)",
         exp_of_one_block, 0, 2 * BHNN * item, part=True, scale_time=BHNN / block.size)
    del block, exps
    weights = softmax_in_place(scores.copy())
    o = step("3c. P v", lambda: weights @ v, mm_att)
    concat = step("5. merge heads (a copy)", lambda: _merge(o), 0, 2 * BND * item)
    step("6. output projection concat W_o", lambda: _matmul_rows(concat, p["W_o"]) + p["b_o"], mm_proj)
    # backward
    dconcat = step("b6. dW_o = concat^T dout, dconcat = dout W_o^T",
                   lambda: (concat.reshape(-1, D).T @ dout.reshape(-1, D), _matmul_rows(dout, p["W_o"].T))[1],
                   2 * mm_proj)
    do = _split(dconcat, H)
    step("b3c. dv = P^T do, dP = do v^T",
         lambda: (weights.swapaxes(-1, -2) @ do, do @ v.swapaxes(-1, -2)), 2 * mm_att)
    dP = do @ v.swapaxes(-1, -2)
    D_rows = (do * o).sum(-1, keepdims=True)  # (B, H, N, 1)
    buffer = dP.copy()  # the library writes dS over dP, in row blocks: the same call on one buffer
    step("b3b. dS = P * (dP - rowsum(do * out)), in place",
         lambda: softmax_backward_in_place(buffer, weights, D_rows), 0, 3 * BHNN * item)  # reads P, dP; writes dS
    dS = weights * (dP - D_rows)
    dq_dk = step("b3a. dq = dS k / sqrt(d_k), dk = dS^T q / sqrt(d_k)",
                 lambda: ((dS @ k) * scale, (dS.swapaxes(-1, -2) @ q) * scale), 2 * mm_att)
    grads = (*dq_dk, weights.swapaxes(-1, -2) @ do)  # (B, H, N, dk) each, contiguous per head
    step("b2. merge dq, dk, dv (copies)", lambda: [_merge(a) for a in grads], 0, 3 * 2 * BND * item)
    dQ = _merge(grads[0])
    step("b1. dW = x^T dQ (x3), dx = dQ W^T (x3)",
         lambda: [(x.reshape(-1, D).T @ dQ.reshape(-1, D), _matmul_rows(dQ, p["W_q"].T)) for _ in range(3)],
         6 * mm_proj)

    def library(forward, backward):
        def run():
            out, cache = forward(x, x, x, p, H)
            return backward(dout, cache)
        return run

    fast_pair = (fast.multi_head_attention_forward_fast, fast.multi_head_attention_backward_fast)
    reference_pair = (core.multi_head_attention_forward, core.multi_head_attention_backward)
    return rows, _time(library(*fast_pair), repeats), _time(library(*reference_pair), repeats)


def table(B, N, dtype, repeats):
    """The profile as markdown, and its total against the library's own time."""
    peak, bandwidth = limits(dtype, repeats)
    rows, fast_time, reference_time = steps(B, N, dtype, repeats)
    lines = [f"B = {B}, N = {N}, D = {D}, h = {H}, {dtype}: matmul peak {peak / 1e9:.0f} GFLOP/s,"
             f" memory bandwidth {bandwidth / 1e9:.1f} GB/s (copy)",
             "",
             "| step | ms | GFLOP | MB moved | ms at the limit | x limit |",
             "|---|---|---|---|---|---|"]
    total = 0.0
    for name, t, flops, nbytes, part in rows:
        limit = flops / peak if flops else nbytes / bandwidth
        total += 0.0 if part else t
        lines.append(f"| {name} | {t * 1e3:.1f} | {flops / 1e9:.2f} | {nbytes / 1e6:.0f} | {limit * 1e3:.1f} |"
                     f" {t / limit:.1f} |")
    flops = sum(f for _, _, f, _, _ in rows)
    lines += ["",
              f"Sum of the steps {total * 1e3:.0f} ms; the library's forward+backward on the fast path"
              f" (`attention_ref.fast`) {fast_time * 1e3:.0f} ms (the rest: bias additions, checks, caches),"
              f" on the reference (`attention_ref.core`) {reference_time * 1e3:.0f} ms."
              f" All matrix products at the peak: {flops / peak * 1e3:.0f} ms"
              f" ({flops / peak / fast_time:.0%} of the fast path's time)."]
    return "\n".join(lines)


def cpu() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one) and its core count."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--B", type=int, default=1)
    parser.add_argument("--N", type=int, default=2048)
    parser.add_argument("--dtype", choices=("float32", "float64", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="B=1, N=64, one repeat (a smoke test)")
    parser.add_argument("--write", action="store_true", help=f"write the tables into {DOC.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    if args.quick and args.write:
        parser.error("--quick sizes are not the documented configuration: run without --quick to --write")
    B, N, repeats = (1, 64, 1) if args.quick else (args.B, args.N, args.repeats)
    dtypes = ("float32", "float64") if args.dtype == "both" else (args.dtype,)
    blocks = [table(B, N, dtype, repeats) for dtype in dtypes]
    text = "\n\n".join(blocks)
    print(text)
    if args.write:
        machine = (f"Measured on {date.today().isoformat()} with `python benchmarks/profile_mha.py --write`:"
                   f" {cpu()}, NumPy {np.__version__},"
                   f" Python {platform.python_version()}.")
        doc = DOC.read_text()
        begin, end = "<!-- BEGIN profile_mha -->", "<!-- END profile_mha -->"
        if begin not in doc or end not in doc:
            parser.error(f"{DOC.relative_to(ROOT)} has no {begin} ... {end} markers")
        head, rest = doc.split(begin, 1)
        from attention_ref._atomic import write_atomic

        write_atomic(DOC, head + begin + "\n" + machine + "\n\n" + text + "\n" + rest[rest.index(end):])
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
