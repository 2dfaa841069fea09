"""002's thought experiment: keys (10,0), (0,10), (5,5), (2,2); no single query ranks the
balanced key (5,5) first, and what two heads do and do not change.

    python examples/convex_hull.py [--plots DIR]

With ``--plots`` writes convex_hull.png.
"""
from __future__ import annotations

import numpy as np
from _common import parse, save

from attention_ref import softmax_forward
from attention_ref.documents.claims import fmt
from attention_ref.documents import HULL
from attention_ref.documents.experiments import hull_scores, hull_single_query_search, hull_vertices


def report() -> list[str]:
    keys = np.array(HULL["keys"])
    search = hull_single_query_search()
    s1, s2 = (hull_scores([q])[0] for q in HULL["head_queries"])
    tie = hull_scores([[1.0, 1.0]])[0]
    lines = [
        "keys k1..k4: " + ", ".join(fmt(k) for k in keys),
        f"min(k_1, k_2) per key: {fmt(keys.min(axis=1))}  -> the balanced winner is k3",
        f"queries tried: {search['n_queries']:,}; strictly first per key: {search['strictly_first']}",
        f"best margin of k3 over max(k1, k2): {fmt(search['best_margin_k3'])} (never positive)",
        f"hull vertices: {hull_vertices()} (k3 is on the edge k1-k2, not a vertex)",
        f"q = (1, 1) ties k1, k2, k3: scores {fmt(tie)}",
        f"  and the softmax splits the weight: {fmt(softmax_forward(tie)[0], 3)}",
        f"head 1, q = (1, 0): scores {fmt(s1)}",
        f"head 2, q = (0, 1): scores {fmt(s2)}",
        f"per-token min over the two heads: {fmt(np.minimum(s1, s2))} -> k{int(np.argmax(np.minimum(s1, s2))) + 1}",
        f"a*s1 + b*s2 is the single query (a, b): (1, 1) gives {fmt(s1 + s2)}",
    ]
    return lines


def main(argv=None) -> int:
    args = parse(__doc__.splitlines()[0], argv)
    print("\n".join(report()))
    save(args, ["convex_hull.png"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
