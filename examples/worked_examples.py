"""004's worked examples (sections 4.1 and 4.2), recomputed with the library.

    python examples/worked_examples.py [--plots DIR]

Prints the single-token example and the two-head example step by step, each value beside
the document's where they differ (see docs/claims.md for the verdicts). With ``--plots``
writes attention_heads.png (the example has one token, so its weights are all 1: the
figure shows a six-token causal example instead).
"""
from __future__ import annotations

from _common import parse, save

from attention_ref.claims import fmt
from attention_ref.documents import SINGLE_TOKEN
from attention_ref.walkthrough import example_section
from attention_ref.worked_examples import single_token_example


def single_token_lines() -> list[str]:
    r = single_token_example()
    return [
        "004 section 4.1: one query, one key, one value",
        f"  q.k             = {' + '.join(fmt(p) for p in r.products)} = {fmt(r.dot)}",
        f"  score = q.k/sqrt(3) = {fmt(r.score)}   (document: {fmt(SINGLE_TOKEN['printed_score'])})",
        f"  alpha           = {fmt(r.alpha)}   (softmax over one score)",
        f"  output          = {fmt(r.output)}",
    ]


def main(argv=None) -> int:
    args = parse(__doc__.splitlines()[0], argv)
    print("\n".join(single_token_lines()))
    print()
    print(example_section())
    save(args, ["attention_heads.png"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
