"""002's argument for the 1/sqrt(d_k) scale: score variance and softmax saturation.

    python examples/scaling_and_saturation.py [--plots DIR]

For each head width d_k: the sample variance of q.k and of q.k/sqrt(d_k) (i.i.d. N(0, 1)
components), the mean largest attention weight over 8 keys and the median norm of the
softmax Jacobian, without and with the scale. With ``--plots`` writes saturation.png.
"""
from __future__ import annotations

from _common import parse, save

from attention_ref.documents.experiments import DEFAULT_D_KS, saturation, score_variance


def table(d_ks=DEFAULT_D_KS) -> list[str]:
    lines = [f"{'d_k':>5} {'Var q.k':>9} {'scaled':>7} | {'max weight':>10} {'scaled':>7}"
             f" | {'|J| unscaled':>12} {'scaled':>7}", "-" * 69]
    for d_k in d_ks:
        v, vs = score_variance(d_k)
        raw, scaled = saturation(d_k, False), saturation(d_k, True)
        lines.append(f"{d_k:>5} {v:>9.1f} {vs:>7.3f} | {raw.max_weight:>10.3f} {scaled.max_weight:>7.3f}"
                     f" | {raw.grad_norm:>12.1e} {scaled.grad_norm:>7.3f}")
    return lines


def main(argv=None) -> int:
    args = parse(__doc__.splitlines()[0], argv)
    print("\n".join(table()))
    print("Unscaled, the variance grows like d_k, the largest weight tends to 1 and the")
    print("Jacobian (every gradient to q and k passes through it) vanishes; scaled, all")
    print("three stay put.")
    save(args, ["saturation.png"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
