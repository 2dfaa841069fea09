"""``check(name, attempt)``: run a student's backward on the exercise's inputs, compare it with
the library's, and name the mistake when it is wrong.

The attempt receives a copy of the cache of the library's forward (or of the student's own
``forward=``) and of an upstream gradient drawn from a fixed seed, so an attempt that writes
into them changes nothing else (and is told so). It is right when every output matches the
library's backward (see :mod:`attention_ref.exercises.diagnosis` for the tolerance);
otherwise each classic mistake of the exercise is run on the same inputs, and the one that
reproduces the attempt on every case is named; failing that,
:func:`~attention_ref.exercises.diagnosis.observe` describes what it can see.
"""
from __future__ import annotations

import copy
import textwrap
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .catalogue import EXERCISES
from .diagnosis import _FLOAT32_RTOL, ATOL, RTOL, as_gradient_array, close, observe
from .mistakes import ANY

__all__ = ["CheckResult", "check", "hint"]

WIDTH = 80
_PACKAGE = Path(__file__).resolve().parents[1]


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


def _flatten(names, result, keys=None):
    """An attempt's return value as ``[(name, value), ...]`` in the reference's order (``keys``:
    the reference's ``grads`` keys), or a sentence saying why it cannot be."""
    if len(names) == 1:
        if isinstance(result, (tuple, list)) and len(result) == 1:
            result = result[0]  # a one-element tuple or list: its element is the gradient
        values = (result,)
    elif isinstance(result, (tuple, list)):
        values = tuple(result)
    else:
        return f"your backward returned a {type(result).__name__}; it returns a tuple ({', '.join(names)})"
    if len(values) != len(names):
        return f"your backward returned {len(values)} values; it returns {len(names)}: ({', '.join(names)})"
    flat = []
    for name, value in zip(names, values):
        if name != "grads":
            flat.append((name, value))
            continue
        if not isinstance(value, Mapping):
            return f"grads must be a dict with the keys of params, got {type(value).__name__}"
        if keys is not None and set(value) != set(keys):
            missing, extra = [k for k in keys if k not in value], [k for k in value if k not in keys]
            return f"grads must have the keys of params: missing {missing}, unexpected {extra}"
        flat.extend((f"grads[{key!r}]", value[key]) for key in (keys if keys is not None else value))
    return flat


def _matches(got, predicted):
    """Whether the attempt's outputs equal a mistake's prediction (ANY: not predicted)."""
    for (_, g), (_, p) in zip(got, predicted):
        if p is ANY:
            continue
        if p is None or g is None:
            if p is not g:
                return False
        elif not close(g, np.asarray(p), rtol=_FLOAT32_RTOL if np.asarray(g).dtype == np.float32 else RTOL):
            return False
    return len(got) == len(predicted)


def _same(a, b) -> bool:
    """Two caches (or arrays) hold the same numbers."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, (tuple, list)) and type(a) is type(b) and len(a) == len(b):
        return all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return True  # numbers, strings, None: not arrays a backward could write into


def _axis_names(ndim):
    return {-4: "batch item", -3: "head" if ndim >= 4 else "batch item"}


def _where(exc) -> str:
    """The line of the student's code that raised, if any (frames outside this package and NumPy)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename).resolve()
        if _PACKAGE not in path.parents and "numpy" not in path.parts:
            return f" at line {frame.lineno} of {path.name}: {frame.line}" if frame.line else ""
    return ""


def hint(name: str, number: int = 1) -> str:
    """Hint ``number`` (from 1) of an exercise; each hint says more than the one before."""
    e = _exercise(name)
    if not 1 <= number <= len(e.hints):
        raise ValueError(f"{name} has hints 1 to {len(e.hints)}, got {number}")
    return textwrap.fill(f"hint {number} of {len(e.hints)}: {e.hints[number - 1]}", WIDTH, subsequent_indent="    ")


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
    own_forward = None if forward is None else e.adapt_forward(forward)
    lines, failed, runs, notes = [], [], [], []
    worst_rel = 0.0
    diagnosis = None
    for i, case in enumerate(cases, 1):
        out, cache = e.forward(*case.inputs, **case.kwargs)
        given = cache
        if own_forward is not None:
            try:
                mine, given = own_forward(*case.inputs, **case.kwargs)
            except Exception as exc:  # noqa: BLE001  (a student's code may raise anything)
                diagnosis = f"your forward raised {type(exc).__name__}: {exc}{_where(exc)}"
                break
            if not close(mine, out):
                diagnosis = (f"your forward's output differs from {e.forward_name}'s on {case.describe()}:"
                             " fix the forward first")
                break
        dout = rng.standard_normal(np.shape(out))
        reference = e.run(e.backward, dout, cache)
        keys = list(reference[e.returns.index("grads")]) if "grads" in e.returns else None  # params' order
        truth = _flatten(e.returns, reference)
        theirs, their_dout = copy.deepcopy(given), dout.copy()
        try:
            result = e.run(attempt, their_dout, theirs)
        except Exception as exc:  # noqa: BLE001
            lines.append(textwrap.fill(f"case {i}: {case.describe()}: raised {type(exc).__name__}", WIDTH,
                                       subsequent_indent="    "))
            if isinstance(exc, NotImplementedError):
                diagnosis = f"{name} is not written yet: derive it, with the hints if you like"
            elif runs:  # the earlier cases may already show the mistake
                diagnosis = (_name_the_mistake(e, runs, failed) + f"; on case {i} it raised {type(exc).__name__}:"
                             f" {exc}{_where(exc)}") if failed else None
            if diagnosis is None:
                diagnosis = f"your backward raised {type(exc).__name__}: {exc}{_where(exc)} (on {case.describe()})"
            break
        if not (_same(theirs, given) and np.array_equal(their_dout, dout)):
            note = "your backward wrote into its arguments (the cache or dout); a backward must not"
            notes.append(note) if note not in notes else None
        got = _flatten(e.returns, result, keys)
        if isinstance(got, str):
            diagnosis = got
            break
        runs.append((case, dout, cache, got, truth, keys))
        lines.append(textwrap.fill(f"case {i}: {case.describe()}", WIDTH, subsequent_indent="    "))
        scale = max((float(np.abs(np.asarray(t)).max()) for _, t in truth if t is not None and np.size(t)),
                    default=0.0)
        for (n, g), (_, t) in zip(got, truth):
            if t is None:
                ok = g is None
                lines.append(f"  {n:<16} {'None' if ok else 'expected None'}")
            else:
                t = np.asarray(t)
                ok = close(g, t)
                arr = as_gradient_array(g)
                if ok and t.size:  # relative to the case's largest gradient: a zero gradient is rounding
                    worst_rel = max(worst_rel, float(np.abs(arr - t).max()) / max(scale, ATOL))
                shape = str(arr.shape) if arr is not None else type(g).__name__
                lines.append(f"  {n:<16} shape {shape:<14} {'ok' if ok else 'WRONG'}")
            if not ok:
                failed.append((case, n, g, t))
    right = diagnosis is None and not failed
    passed = right and not notes
    if passed:
        verdict = f"{name}: PASS on {len(cases)} cases"
        rel = "below 1e-10" if worst_rel < 1e-10 else f"{worst_rel:.1e}"
        diagnosis = f"correct: every gradient matches the library's (largest difference {rel} of the largest gradient)"
    else:
        verdict = f"{name}: FAIL"
        if right:
            diagnosis = "the gradients are right"
        elif diagnosis is None:
            diagnosis = _name_the_mistake(e, runs, failed)
        diagnosis = "; ".join([diagnosis, *notes])
    report = [verdict, *lines, textwrap.fill(f"diagnosis: {diagnosis}", WIDTH, subsequent_indent="  ",
                                             break_on_hyphens=False)]
    if not passed:
        report += [f"next: hint(\"{name}\", 1) in Python, or", f"  python -m attention_ref exercise hint {name} 1"]
    return CheckResult(name, passed, diagnosis, "\n".join(report))


def _name_the_mistake(e, runs, failed) -> str:
    """The catalogue mistake that reproduces the attempt on every case run, else what can be seen."""
    for mistake in e.mistakes:
        differs = False
        for _, dout, cache, got, truth, keys in runs:
            try:
                predicted = _flatten(e.returns, e.run(mistake.backward, dout, copy.deepcopy(cache)), keys)
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
    seen = observe(name, got, truth, case.factors, masked, _axis_names(arr.ndim if arr is not None else 0),
                   parameter=name.startswith("grads[") or name not in ("dx", "dq", "dk", "dv", "dquery", "dkey",
                                                                       "dvalue", "dheads"))
    wrong = sorted({i for i, (c, *_) in enumerate(runs, 1) if any(c is f[0] for f in failed)})
    if len(wrong) < len(runs):  # some cases are right: say which are not, the inputs tell why
        only = "; ".join(f"case {i} ({runs[i - 1][0].describe()})" for i in wrong)
        seen = f"only {only} {'is' if len(wrong) == 1 else 'are'} wrong, the other cases are right: {seen}"
    return seen
