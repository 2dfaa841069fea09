"""Parameter counts (002, 001) and the two implementation strategies (000 section 3.2).

    python examples/parameter_count.py

Counts the scalars of MultiHeadAttention layers (d_k = d_v = d_model / h) with and
without biases, for ordinary, grouped-query and multi-query attention, and checks that
separate single heads and the weight-split parallel form give the same output.
"""
from __future__ import annotations

from _common import parse

from attention_ref.documents.claims import tiny
from attention_ref.documents.experiments import parameter_count, strategies_max_difference, sum_formula_difference

CONFIGS = ((512, 1), (512, 8), (768, 12), (1024, 16))


def table() -> list[str]:
    lines = [f"{'d_model':>7} {'h':>3} {'no bias':>11} {'4 d^2':>11} {'with bias':>11} {'4 d^2 + 4 d':>12}",
             "-" * 60]
    for d, h in CONFIGS:
        lines.append(f"{d:>7} {h:>3} {parameter_count(d, h, bias=False):>11,} {4 * d * d:>11,}"
                     f" {parameter_count(d, h, bias=True):>11,} {4 * d * d + 4 * d:>12,}")
    d, h = 512, 8
    lines += ["", f"d_model={d}, h={h}, no bias: key/value heads -> parameters"]
    for hkv in (8, 2, 1):
        lines.append(f"  {hkv} kv heads: {parameter_count(d, h, bias=False, num_kv_heads=hkv):,}")
    return lines


def main(argv=None) -> int:
    parse(__doc__.splitlines()[0], argv)
    print("\n".join(table()))
    print()
    # rounding-level differences are shown as a bound: their digits depend on the BLAS
    print(f"separate heads vs parallel form: max |difference| {tiny(strategies_max_difference())}")
    print(f"001's sum over heads (W^O split by rows) vs Concat W^O: max |difference|"
          f" {tiny(sum_formula_difference())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
