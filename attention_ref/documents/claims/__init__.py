"""The claims table: every checkable claim of the five documents, recomputed.

``claim`` holds the row type and its number formatting; ``example_claims``,
``parameters_and_cost``, ``listings_and_masks`` and ``paths_and_variants`` build the rows from
the experiments, one function per claim; ``table`` orders the groups and renders ``docs/claims.md``.
"""
from .claim import VERDICTS, Claim, fmt, readings_verdict, tiny
from .table import all_claims, claim_groups, render_markdown, render_summary, render_text

__all__ = ["Claim", "VERDICTS", "all_claims", "claim_groups", "fmt", "readings_verdict", "render_markdown",
           "render_summary", "render_text", "tiny"]
