"""One row of the claims table, its verdicts, and how numbers are written in its cells."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Claim", "VERDICTS", "fmt", "readings_verdict", "rows_of", "tiny"]

VERDICTS = ("holds", "wrong", "ambiguous")


class Claim(NamedTuple):
    """One row of the claims table."""

    id: str
    claim: str
    source: str      # "004 4.2 (multi-head attention)": document number and section
    printed: str     # the document's value, as printed
    computed: str    # ours
    verdict: str     # one of VERDICTS
    note: str = ""   # interpretation chosen, or the correct value and how the mistake arises


def fmt(value, digits: int = 4) -> str:
    """A number or vector rounded to ``digits`` decimals, without trailing zeros."""
    a = np.asarray(value, dtype=float)
    if a.ndim == 0:
        v = round(float(a), digits)
        return f"{v:,.{digits}f}".rstrip("0").rstrip(".") if v != int(v) else f"{int(v):,}"
    return "[" + ", ".join(fmt(v, digits) for v in a.ravel()) + "]"


def _close(a, b, tol=1e-9) -> bool:
    """Whether two numbers or vectors agree to ``tol`` (absolute)."""
    return bool(np.allclose(np.asarray(a, float), np.asarray(b, float), atol=tol, rtol=0))


def tiny(x: float, bound: float = 1e-12) -> str:
    """``"< 1e-12"`` for a rounding-level number (machine-independent text), else the value."""
    return f"< {bound:.0e}" if abs(x) < bound else f"{x:.1e}"


def _verdict(ok: bool) -> str:
    """``"holds"`` or ``"wrong"``."""
    return "holds" if ok else "wrong"


def _readings(truth: dict) -> str:
    """Verdict from the claim's truth under each defensible reading (name -> bool):
    ``"holds"`` if true under all, ``"wrong"`` if under none, else ``"ambiguous"``."""
    values = [bool(v) for v in truth.values()]
    return "holds" if all(values) else "wrong" if not any(values) else "ambiguous"


readings_verdict = _readings


def rows_of(claim_functions) -> list[Claim]:
    """The rows of ``claim_functions``, called in order (each returns one Claim or a list of them)."""
    rows = []
    for f in claim_functions:
        out = f()
        rows += [out] if isinstance(out, Claim) else out
    return rows
