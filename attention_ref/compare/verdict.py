"""The verdict of a comparison: :class:`Comparison`, shared by every level of ``compare``.

A verdict states only what it tested (STYLE item 28): ``mistake`` is a catalogue id only when a
mistaken variant of the reference reproduced the user's outputs on every case judged;
otherwise the difference is located (``where``, ``inputs``, ``error``) and not named.
"""
from __future__ import annotations

from dataclasses import dataclass

from .catalogue import MISTAKES

__all__ = ["Comparison"]


@dataclass(frozen=True)
class Comparison:
    """What a comparison found.

    Attributes
    ----------
    ok : True when the user's code matches the reference on every case judged
    mistake : a catalogue id (:data:`attention_ref.compare.MISTAKES`) or None
    where : the step that first differs (or the failing call, a shape), None when ok
    inputs : the input features that separate the wrong cases from the right ones
    subject : what was compared (``"softmax"``, later a module's name)
    cases : how many cases were judged (after leaving out unsupported features)
    failed : how many of them differ
    error : the largest error of the float64 cases (and masks: 0 or inf), relative to the reference's
        size (inf for NaN or a wrong shape); None when no float64 case was judged
    r_ratio : the largest R-ratio of the float32 cases: the error over the reference's own error in
        float32 (at most :data:`attention_ref.compare.R_LIMIT` passes); None without such cases
    unsupported : features on which the user's code raised on every case (judged on the others)
    detail : one or more sentences for a person (the mistaken formula, the line that raised, ...)
    """

    ok: bool
    mistake: str | None = None
    where: str | None = None
    inputs: tuple = ()
    subject: str = ""
    cases: int = 0
    failed: int = 0
    error: float | None = 0.0
    unsupported: tuple = ()
    detail: str = ""
    r_ratio: float | None = None

    def __bool__(self) -> bool:
        return bool(self.ok)

    def check(self) -> None:
        """Raise ``AssertionError`` with the verdict unless the comparison matched (for pytest)."""
        if not self.ok:
            raise AssertionError(str(self))

    def __str__(self) -> str:
        lines = []
        sizes = [] if self.error is None else [f"largest relative error {self.error:.2g} in float64"]
        if self.r_ratio is not None:
            sizes.append(f"R-ratio {self.r_ratio:.2g} in float32")
        size = ", ".join(sizes) or "no case judged"
        if self.ok:
            lines.append(f"{self.subject}: matches the reference on all {self.cases} cases ({size}).")
        else:
            lines.append(f"{self.subject}: differs from the reference on {self.failed} of {self.cases} cases ({size})."
                         if self.cases else  # nothing ran: the weights did not load
                         f"{self.subject}: differs from the reference before any case ran.")
            if self.mistake is not None:
                m = MISTAKES[self.mistake]
                lines.append(f"Mistake: {self.mistake} (docs/compare.md): {m.symptom}.")
                lines.append(f"  wrong: {m.wrong}")
                lines.append(f"  right: {m.right}")
            else:
                lines.append("No mistake of the catalogue reproduces it on every case; located only.")
            if self.where:
                lines.append(f"Where: {self.where}.")
            if self.cases:
                lines.append("Inputs that show it: " + (", ".join(self.inputs) if self.inputs else "every case") + ".")
        if self.unsupported:
            lines.append("Not supported (it raised on every such case; judged on the others): "
                         + ", ".join(self.unsupported) + ".")
        if self.detail:
            lines.append(self.detail)
        return "\n".join(lines)
