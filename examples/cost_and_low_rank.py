"""The quadratic cost (000, 001, 003), the low-rank claim (000 section 4.4) and what
multi-query attention saves (002).

    python examples/cost_and_low_rank.py [--plots DIR]

With ``--plots`` writes singular_values.png.
"""
from __future__ import annotations

import numpy as np
from _common import parse, save

from attention_ref.documents.experiments import (
    attention_cost,
    attention_pairs,
    energy_rank,
    kv_cache_comparison,
    softmax_spectrum,
)


def report() -> list[str]:
    lines = ["query-key pairs:"]
    for n in (1_000, 10_000):
        lines.append(f"  N = {n:>6,}: {attention_pairs(n):>13,} (causal {attention_pairs(n, True):,})")
    lines += ["", "one forward, d_model = 16, 4 heads (multiply-adds; numbers stored):",
              f"  {'N':>4} {'attention':>11} {'projections':>12} {'weights':>9} {'Q,K,V':>7}"]
    for n in (32, 64, 128):
        c = attention_cost(n, 16, 4)
        lines.append(f"  {n:>4} {c['attention_madds']:>11,} {c['projection_madds']:>12,}"
                     f" {c['weights_numbers']:>9,} {c['qkv_numbers']:>7,}")
    lines += ["", "singular values of softmax(t Q K^T / sqrt(d_k)), 64 x 64, d_k = 16:"]
    for t in (0.1, 1.0, 10.0):
        s = softmax_spectrum(scale=t)
        lines.append(f"  t = {t:>4}: top 3 {np.round(s[:3], 3).tolist()}, 90% energy in"
                     f" {energy_rank(s)}, nonzero {int((s > 1e-12).sum())}")
    lines += ["", "d_model = 64, 8 heads, 16 decoded tokens (no biases):"]
    for name, v in kv_cache_comparison().items():
        lines.append(f"  {name}: {v['kv_heads']} kv heads, {v['params']:,} parameters,"
                     f" KV cache {v['cache_bytes']:,} bytes")
    return lines


def main(argv=None) -> int:
    args = parse(__doc__.splitlines()[0], argv)
    print("\n".join(report()))
    save(args, ["singular_values.png"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
