"""``check(name, attempt)``: run a student's backward on the exercise's inputs, compare it with
the library's, and name the mistake when it is wrong.

The attempt receives the cache of the library's forward (or of the student's own ``forward=``),
and an upstream gradient drawn from a fixed seed. It is right when every output matches the
library's backward (see :mod:`attention_ref.exercises.diagnosis` for the tolerance); otherwise
each classic mistake of the exercise is run on the same inputs, and the one that reproduces the
attempt on every case is named; failing that, :func:`~attention_ref.exercises.diagnosis.observe`
describes what it can see.
"""
from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .catalogue import EXERCISES
from .diagnosis import ATOL, as_gradient_array, close, observe
from .mistakes import ANY

__all__ = ["CheckResult", "check", "hint"]


@dataclass(frozen=True)
class CheckResult:
    """The outcome of :func:`check`: ``.ok``, ``.diagnosis`` (one sentence), the report when printed."""

    name: str
    ok: bool
    diagnosis: str
    report: str

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return self.report

    def _repr_pretty_(self, printer, cycle):  # IPython shows the report
        printer.text(self.report)


def _exercise(name):
    if name not in EXERCISES:
        raise KeyError(f"no exercise {name!r}; the exercises are: {', '.join(EXERCISES)}")
    return EXERCISES[name]


def _flatten(names, result):
    """An attempt's return value as ``[(name, value), ...]``, or a sentence saying why it cannot be."""
    values = result if isinstance(result, (tuple, list)) and len(names) > 1 else (result,)
    if len(values) != len(names):
        return (f"your backward returned {len(values)} values; it returns {len(names)}:"
                f" ({', '.join(names)})")
    flat = []
    for name, value in zip(names, values):
        if name == "grads":
            if not isinstance(value, Mapping):
                return f"grads must be a dict with the keys of params, got {type(value).__name__}"
            flat.extend((f"grads[{key!r}]", g) for key, g in value.items())
        else:
            flat.append((name, value))
    return flat


def _matches(got, predicted):
    for (name, g), (_, p) in zip(got, predicted):
        if p is ANY:
            continue
        if p is None or g is None:
            if p is not g:
                return False
        elif not close(g, np.asarray(p)):
            return False
    return len(got) == len(predicted)


def _axis_names(ndim):
    return {-4: "batch item", -3: "head" if ndim >= 4 else "batch item"}


def hint(name: str, number: int = 1) -> str:
    """Hint ``number`` (from 1) of an exercise; each hint says more than the one before."""
    e = _exercise(name)
    if not 1 <= number <= len(e.hints):
        raise ValueError(f"{name} has hints 1 to {len(e.hints)}, got {number}")
    return f"hint {number} of {len(e.hints)}: {e.hints[number - 1]}"


def check(name: str, attempt, forward=None, *, seed: int = 0) -> CheckResult:
    """Check a student's backward for exercise ``name`` (the library function's name).

    Parameters
    ----------
    name : e.g. ``"softmax_backward"``; ``attention_ref.exercises.EXERCISES`` lists them
    attempt : the student's function, with the library function's signature
    forward : optional student forward with the library forward's signature; its output is
        compared with the library's and its cache is what ``attempt`` receives
    seed : the inputs and upstream gradients are drawn from this seed

    Returns
    -------
    CheckResult with ``.ok``, ``.diagnosis`` and the report as its text
    """
    e = _exercise(name)
    rng = np.random.default_rng(seed)
    cases = e.cases(rng)
    lines, failed, runs = [], [], []
    worst_rel = 0.0
    diagnosis = None
    for i, case in enumerate(cases, 1):
        out, cache = e.forward(*case.inputs, **case.kwargs)
        given = cache
        if forward is not None:
            try:
                mine, given = forward(*case.inputs, **case.kwargs)
            except Exception as exc:  # noqa: BLE001  (a student's code may raise anything)
                diagnosis = f"your forward raised {type(exc).__name__}: {exc}"
                break
            if not close(mine, out):
                diagnosis = (f"your forward's output differs from {e.forward_name}'s on {case.describe()}:"
                             " fix the forward first")
                break
        dout = rng.standard_normal(np.shape(out))
        truth = _flatten(e.returns, e.run(e.backward, dout, cache))
        try:
            result = e.run(attempt, dout.copy(), given)
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, NotImplementedError):
                diagnosis = f"{name} is not written yet: derive it, with the hints if you like"
            else:
                diagnosis = _name_the_crash(e, dout, cache, exc) or \
                    f"your backward raised {type(exc).__name__}: {exc} (on {case.describe()})"
            lines.append(f"case {i}: {case.describe()}: raised {type(exc).__name__}")
            break
        got = _flatten(e.returns, result)
        if isinstance(got, str):
            diagnosis = got
            break
        if [n for n, _ in got] != [n for n, _ in truth]:
            diagnosis = (f"your backward returned the gradients {[n for n, _ in got]}; expected"
                         f" {[n for n, _ in truth]}")
            break
        runs.append((case, dout, cache, got, truth))
        lines.append(f"case {i}: {case.describe()}")
        for (n, g), (_, t) in zip(got, truth):
            if t is None:
                ok = g is None
                lines.append(f"  {n:<16} {'None' if ok else 'expected None'}")
            else:
                t = np.asarray(t)
                ok = close(g, t)
                arr = as_gradient_array(g)
                if ok and t.size:
                    worst_rel = max(worst_rel, float(np.abs(arr - t).max()) / max(float(np.abs(t).max()), ATOL))
                shape = str(arr.shape) if arr is not None else type(g).__name__
                lines.append(f"  {n:<16} shape {shape:<14} {'ok' if ok else 'WRONG'}")
            if not ok:
                failed.append((case, n, g, t))
    if diagnosis is None and not failed:
        verdict = f"{name}: PASS on {len(cases)} cases"
        rel = "below 1e-10" if worst_rel < 1e-10 else f"{worst_rel:.1e}"
        diagnosis = f"correct: every gradient matches the library's (largest relative difference {rel})"
    else:
        verdict = f"{name}: FAIL"
        if diagnosis is None:
            diagnosis = _name_the_mistake(e, runs, failed)
    wrapped = textwrap.fill(f"diagnosis: {diagnosis}", 88, subsequent_indent="  ", break_on_hyphens=False)
    report = "\n".join([verdict, *lines, wrapped] + ([] if not (failed or verdict.endswith("FAIL")) else [
        f"next: hint(\"{name}\", 1) in Python, or python -m attention_ref exercise hint {name} 1"]))
    return CheckResult(name, diagnosis.startswith("correct"), diagnosis, report)


def _name_the_mistake(e, runs, failed) -> str:
    """The catalogue mistake that reproduces the attempt on every case, else what can be seen."""
    for mistake in e.mistakes:
        differs = False
        for case, dout, cache, got, truth in runs:
            try:
                predicted = _flatten(e.returns, e.run(mistake.backward, dout, cache))
            except (ValueError, IndexError):  # a product of the wrong shapes: not this attempt's mistake
                break
            if isinstance(predicted, str) or not _matches(got, predicted):
                break
            differs = differs or not _matches(predicted, truth)
        else:
            if differs:
                return mistake.sentence
    case, name, got, truth = failed[0]
    masked = case.masked if name == e.returns[0] else None
    arr = as_gradient_array(got)
    return observe(name, got, truth, case.factors, masked, _axis_names(arr.ndim if arr is not None else 0))


def _name_the_crash(e, dout, cache, exc):
    """The catalogue mistake that raises the same error on the same inputs (a product of the
    wrong shapes fails the same way whoever writes it), or None."""
    for mistake in e.mistakes:
        try:
            e.run(mistake.backward, dout, cache)
        except Exception as theirs:  # noqa: BLE001
            if type(theirs) is type(exc) and str(theirs) == str(exc):
                return f"{mistake.sentence} (here it fails: {type(exc).__name__}: {exc})"
    return None
