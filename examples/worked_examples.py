"""004's worked examples (sections 4.2 and 4.1), recomputed with the library.

    python examples/worked_examples.py [--plots DIR]

Prints the two-head example step by step and then the single-token example, each value
beside the document's where they differ (see docs/claims.md for the verdicts); the same
text as ``python -m attention_ref --section example``. With ``--plots`` writes
attention_heads.png (the documents' example has one token, so its weights are all 1: the
figure shows a six-token causal example instead).
"""
from __future__ import annotations

from _common import parse, save

from attention_ref.documents.walkthrough import example_section


def main(argv=None) -> int:
    args = parse(__doc__.splitlines()[0], argv)
    print(example_section())
    save(args, ["attention_heads.png"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
