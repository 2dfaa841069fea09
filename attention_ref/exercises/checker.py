"""``check(name, attempt)``: run a student's backward on the exercise's inputs, compare it with
the library's, and name the mistake when it is wrong.

The attempt receives a copy of the cache of the library's forward (or of the student's own
``forward=``) and of an upstream gradient drawn from a fixed seed, so an attempt that writes
into them changes nothing else (and is told so). It is right when every output matches the
library's backward (see :mod:`attention_ref.exercises.diagnosis` for the tolerance);
otherwise each classic mistake of the exercise is run on the same inputs, and the one that
reproduces the attempt on every case is named; failing that,
:func:`~attention_ref.exercises.diagnosis.observe` describes what it can see.

Where there is ``fork`` (POSIX), the cases run in a forked child (:func:`.process._in_child`):
a time limit per case that ends the child's whole process group when the alarm does not stop
the student's code, a memory limit (Linux), a fresh temporary working folder; the caller's
signal handlers, NumPy settings and folder are never touched. Elsewhere they run here, under a
signal alarm where there is one. The student's ``sys.exit``, ``SystemExit`` and
``KeyboardInterrupt`` are reported as what they are.
"""
from __future__ import annotations

import copy
import textwrap
import traceback
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .._checks import signals_land_here
from ..gradcheck import first_write, parameter_names
from .catalogue import EXERCISES
from .diagnosis import (
    _FLOAT32_RTOL,
    ATOL,
    RTOL,
    as_gradient_array,
    close,
    close_or_same_nonfinite,
    observe,
    ratio,
)
from .contracts import PAIRS
from .mistakes import ANY
from .process import (
    MEMORY_LIMIT,
    ChildEnded,
    _can_fork,
    _check_arguments,
    _check_memory_limit,
    _in_child,
    _numpy_state_kept,
    _OutOfTime,
    _stopped,
    _student_code,
)

__all__ = ["CheckResult", "Run", "WrongOutput", "check", "hint"]

WIDTH = 80
_FLOAT32_RTOL_OF_RESULT = 1e-4  # a right float32 attempt and the library's float32 differ by rounding
_FLOAT32_ATOL = 1e-5
TIME_LIMIT = 5.0  # seconds the student's code may take on one case, by default
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
        elif np.asarray(p).dtype == np.float32 and as_gradient_array(g) is not None \
                and np.isfinite(np.asarray(p)).all():  # float32: the tolerance of a right answer
            if not _right(g, p):
                return False
        elif not close_or_same_nonfinite(g, np.asarray(p),
                                         rtol=_FLOAT32_RTOL if np.asarray(g).dtype == np.float32 else RTOL):
            return False
    return len(got) == len(predicted)


def _axis_names(ndim, name=""):
    if name in ("dheads", "heads"):  # (..., H, N, Dh): axis -3 is always the head axis
        return {-4: "batch item", -3: "head"}
    return {-4: "batch item", -3: "head" if ndim >= 4 else "batch item"}


def _where(exc) -> str:
    """The line of the student's code that raised, if any: the innermost frame of a real file
    outside this package and NumPy (NumPy 1.x adds frames such as "<__array_function__
    internals>", which are no file)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.startswith("<"):
            continue
        path = Path(frame.filename).resolve()
        if _PACKAGE not in path.parents and "numpy" not in path.parts:
            return f" at line {frame.lineno} of {path.name}: {frame.line}" if frame.line else ""
    return ""


#: exercise name -> the hints read in this process (``check``'s "next:" suggests the next unread)
_HINTS_READ: dict = {}


def hint(name: str, number: int = 1) -> str:
    """Hint ``number`` (from 1) of an exercise; each hint says more than the one before."""
    e = _exercise(name)
    if not 1 <= number <= len(e.hints):
        raise ValueError(f"{name} has hints 1 to {len(e.hints)}, got {number}")
    _HINTS_READ.setdefault(name, set()).add(number)
    return textwrap.fill(f"hint {number} of {len(e.hints)}: {e.hints[number - 1]}", WIDTH, subsequent_indent="    ")


def check(name: str, attempt, forward=None, *, seed: int = 0, hints_read=None,
          time_limit: float | None = TIME_LIMIT, memory_limit: float | None = MEMORY_LIMIT) -> CheckResult:
    """Check a student's backward for exercise ``name`` (the library function's name).

    Parameters
    ----------
    name : e.g. ``"softmax_backward"``; ``attention_ref.exercises.EXERCISES`` lists them
    attempt : the student's function, with the library function's signature
    forward : optional student forward with the library forward's signature; its output is
        compared with the library's and its cache is what ``attempt`` receives
    seed : the inputs and upstream gradients are drawn from this seed
    hints_read : the hint numbers already read, for the report's "next:" line (default: those
        :func:`hint` returned in this process)
    time_limit : seconds the student's code may take on one case (None: no limit); the case
        that runs out is named and the check fails
    memory_limit : MiB the student's code may add to its process's address space (Linux; None:
        no limit); an allocation beyond it raises MemoryError in the student's code

    Returns
    -------
    CheckResult with ``.ok``, ``.diagnosis`` and the report as its text; NumPy's error
    settings, print options and global random state are left as they were
    """
    e = _exercise(name)
    _check_arguments(seed, time_limit)
    _check_memory_limit(memory_limit)
    hints_read = set(_HINTS_READ.get(name, ())) if hints_read is None else hints_read
    if not _can_fork():  # Windows: in this process, under the alarm where there is one
        return _check_here(e, attempt, forward, seed, hints_read, time_limit)
    return _in_a_child(e, lambda: _check_here(e, attempt, forward, seed, hints_read, time_limit), hints_read,
                       memory_limit)


def _check_here(e, attempt, forward, seed, hints_read, time_limit) -> CheckResult:
    """:func:`check` in this process (the child's, or the only one where there is no fork)."""
    with _numpy_state_kept():
        return _check(e, attempt, forward, seed, hints_read, time_limit)


def _in_a_child(e, work, hints_read, memory_limit) -> CheckResult:
    """``work()``'s CheckResult from a forked child (see :func:`.process._in_child`), or a FAIL
    that says how the child's student code ran out of time or ended its process."""
    result = _in_child(work, memory_limit)
    return result if not isinstance(result, ChildEnded) else _ended(e, result, hints_read)


def _ended(e, ended, hints_read) -> CheckResult:
    """The report when the student's code ran past its time limit and ignored the alarm, or
    ended the process it ran in."""
    who, where = ended.label if isinstance(ended.label, tuple) else ("code", "")
    if ended.why == "time":
        diagnosis = (f"your {who} ran out of time{where}: {ended.how} (an ignored alarm? a thread, or a"
                     " process it started?), so the check ended it")
    else:
        diagnosis = f"your {who} ended the process it ran in{where}: {ended.how}"
    lines = [_fill(f"{where.strip()[3:]}: {'ran out of time' if ended.why == 'time' else 'ended'}")] if where else []
    report = [f"{e.name}: FAIL", *lines, textwrap.fill(f"diagnosis: {diagnosis}", WIDTH, subsequent_indent="  ",
                                                       break_on_hyphens=False)]
    return CheckResult(e.name, False, diagnosis, "\n".join(report + _next(e, diagnosis, hints_read)))


class Run(NamedTuple):
    """One case the attempt returned from: its inputs, the upstream gradient, the library's
    cache, the attempt's outputs and the true ones (``[(name, value), ...]``), params' keys."""

    case: object
    dout: np.ndarray
    cache: object
    got: list
    truth: list
    keys: list | None


class WrongOutput(NamedTuple):
    """One output of one case that is not the library's."""

    case: object
    name: str
    got: object
    truth: object


@dataclass
class _Outcome:
    """What running the cases gave: the table, the runs, the wrong outputs, the notes (writes
    into an argument), why the run stopped early if it did, the largest difference of a right
    output."""

    cases: list
    lines: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    wrong: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    stopped: str | None = None
    worst_rel: float = 0.0
    quiet: list = field(default_factory=list)  # right cases of the covering set, not in the table


def _check(e, attempt, forward, seed, hints_read, time_limit) -> CheckResult:
    """:func:`check` once its arguments are known to be good: run the cases and compare, then
    diagnose, then write the report."""
    outcome = _run_cases(e, attempt, forward, seed, time_limit)
    passed, diagnosis = _diagnose(e, outcome)
    return _report(e, outcome, passed, diagnosis, hints_read)


def _argument_names(e, attempt):
    """The attempt's own names for its upstream gradient and cache (for "wrote into dy")."""
    documented = e.signature.split("(", 1)[1].split(")", 1)[0].split(", ") + ["cache"]  # (dy, cache)
    mine = parameter_names(attempt, 2) or parameter_names(attempt, 1) or []
    return (mine[0] if mine else documented[0]), (mine[1] if len(mine) > 1 else documented[1])


def _run_cases(e, attempt, forward, seed, time_limit) -> _Outcome:
    """Step 1: each case through the library's forward and backward and the attempt, compared
    output by output; stops at the first case the attempt (or its forward) cannot finish."""
    rng = np.random.default_rng(seed)
    o = _Outcome(e.cases(rng))
    own_forward = None if forward is None else e.adapt_forward(forward)
    dout_name, cache_name = _argument_names(e, attempt)
    for i, case in enumerate(o.cases, 1):
        out, cache = e.forward(*case.inputs, **case.kwargs)
        given = cache if own_forward is None else _their_cache(e, own_forward, case, i, out, time_limit, o)
        if o.stopped:
            break
        dout = rng.standard_normal(np.shape(out)).astype(np.result_type(out))  # float32 out: float32 dout
        reference = e.run(e.backward, dout, cache)
        keys = list(reference[e.returns.index("grads")]) if "grads" in e.returns else None  # params' order
        truth = _flatten(e.returns, reference)
        theirs, their_dout = copy.deepcopy(given), dout.copy()
        try:
            with _student_code(time_limit, ("backward", f" on case {i} ({case.describe()})")):
                result = e.run(attempt, their_dout, theirs)
        except _OutOfTime:
            o.lines.append(_fill(f"case {i}: {case.describe()}: ran out of time"))
            o.stopped = _out_of_time("backward", i, case, time_limit)
        except (SystemExit, KeyboardInterrupt) as exc:
            o.lines.append(_fill(f"case {i}: {case.describe()}: {type(exc).__name__}"))
            o.stopped = _stopped("backward", exc, f" on case {i}{_where(exc)}")
        except Exception as exc:  # noqa: BLE001  (a student's code may raise anything)
            o.lines.append(_fill(f"case {i}: {case.describe()}: raised {type(exc).__name__}"))
            o.stopped = _crashed(e, exc, i, case, o)
        if o.stopped:
            break
        place = first_write(their_dout, dout, dout_name) or first_write(theirs, given, cache_name)
        note = f"your backward wrote into {place}; a backward must not change its arguments" if place else None
        if note and note not in o.notes:
            o.notes.append(note)
        got = _flatten(e.returns, result, keys)
        if isinstance(got, str):
            o.stopped = got
            break
        o.runs.append(Run(case, dout, cache, got, truth, keys))
        wrong_before = len(o.wrong)
        rows = _compare(o, case, got, truth)
        if case.feature.startswith(PAIRS) and len(o.wrong) == wrong_before:
            o.quiet.append(i)  # a right case of the covering set: counted, not shown
            continue
        o.lines.append(_fill(f"case {i}: {case.describe()}"))
        o.lines.extend(rows)
    return o


def _their_cache(e, own_forward, case, i, out, time_limit, o):
    """The cache of the student's own forward, after checking its output; sets ``o.stopped``
    when the forward fails."""
    try:
        with _student_code(time_limit, ("forward", f" on case {i} ({case.describe()})")):
            mine, given = own_forward(*copy.deepcopy(case.inputs), **copy.deepcopy(case.kwargs))
    except _OutOfTime:
        o.stopped = _out_of_time("forward", i, case, time_limit)
        return None
    except (SystemExit, KeyboardInterrupt) as exc:
        o.stopped = _stopped("forward", exc, f" on case {i}{_where(exc)}")
        return None
    except Exception as exc:  # noqa: BLE001  (a student's code may raise anything)
        o.stopped = f"your forward raised {type(exc).__name__}: {exc}{_where(exc)}"
        return None
    if not close(mine, out):
        o.stopped = (f"your forward's output differs from {e.forward_name}'s on {case.describe()}:"
                     " fix the forward first")
    return given


def _crashed(e, exc, i, case, o) -> str:
    """The diagnosis when the attempt raised on case ``i``: not written yet; the mistake the
    earlier cases show; or the crash with the student's line and what is new in this case."""
    if isinstance(exc, NotImplementedError):
        return f"{e.name} is not written yet: derive it, with the hints if you like"
    if o.runs and o.wrong:  # the earlier cases may already show the mistake
        return (_name_the_mistake(e, o.runs, o.wrong) + f"; on case {i} it raised {type(exc).__name__}:"
                f" {exc}{_where(exc)}")
    said = f"your backward raised {type(exc).__name__}: {exc}{_where(exc)} (on {case.describe()})"
    new = _what_differs([r.case for r in o.runs] + [case], [len(o.runs) + 1]) if o.runs else ""
    return said + (f"; new in this case: {new}" if new else "")  # the cases before were right


def _compare(o, case, got, truth) -> list:
    """One case's table rows; the wrong outputs go to ``o.wrong``, the largest difference of a
    right one (against the case's largest gradient) to ``o.worst_rel``."""
    scale = max((float(np.abs(np.asarray(t)).max()) for _, t in truth if t is not None and np.size(t)),
                default=0.0)
    rows = []  # (output, shape, verdict, size of the error)
    for (n, g), (_, t) in zip(got, truth):
        if t is None:
            ok = g is None
            rows.append((n, "", "None" if ok else "expected None", ""))
        else:
            t = np.asarray(t)
            arr = as_gradient_array(g)
            ok = _right(g, t) or _rounding_only(arr, t, scale)
            if ok and t.size:  # relative to the case's largest gradient: a zero gradient is rounding
                o.worst_rel = max(o.worst_rel, float(np.abs(arr - t).max()) / max(scale, ATOL))
            shape = str(arr.shape) if arr is not None else type(g).__name__
            rows.append((n, f"shape {shape}", "ok" if ok else "WRONG", _size_of_error(arr, t)))
        if not ok:
            o.wrong.append(WrongOutput(case, n, g, t))
    return _table(rows)


def _rounding_only(arr, t, scale) -> bool:
    """A true gradient that is rounding next to the case's largest one (at most 1e-8 of it, 1e-4
    in float32: a softmax saturated to one key makes dS zero up to rounding) is matched by any
    answer of its shape and dtype within that much: the digits of rounding are no evidence."""
    if arr is None or arr.shape != t.shape or arr.dtype != t.dtype or not t.size or not np.isfinite(arr).all():
        return False
    floor = (1e-4 if t.dtype == np.float32 else 1e-8) * scale
    return float(np.abs(t).max()) <= floor and float(np.abs(arr - t).max()) <= floor


def _diagnose(e, o) -> tuple:
    """Step 2: (passed, the diagnosis sentence)."""
    right = o.stopped is None and not o.wrong
    if right and not o.notes:
        rel = "below 1e-10" if o.worst_rel < 1e-10 else f"{o.worst_rel:.1e}"
        return True, f"correct: every gradient matches the library's (largest difference {rel} of the largest gradient)"
    said = "the gradients are right" if right else o.stopped or _name_the_mistake(e, o.runs, o.wrong)
    return False, "; ".join([said, *o.notes])


def _report(e, o, passed, diagnosis, hints_read) -> CheckResult:
    """Step 3: the verdict, the table, the diagnosis and what to do next."""
    verdict = f"{e.name}: PASS on {len(o.cases)} cases" if passed else f"{e.name}: FAIL"
    quiet = [_fill(f"cases {_numbers(o.quiet)} (pairs of feature values): every output right")] if o.quiet else []
    report = [verdict, *o.lines, *quiet, textwrap.fill(f"diagnosis: {diagnosis}", WIDTH, subsequent_indent="  ",
                                               break_on_hyphens=False)]
    if not passed:
        report += _next(e, diagnosis, hints_read)
    return CheckResult(e.name, passed, diagnosis, "\n".join(report))


def _numbers(numbers) -> str:
    """[3, 4, 5, 7] -> "3-5, 7"."""
    spans = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _table(rows) -> list:
    """One case's rows, columns as wide as their longest entry; a row that would pass 80
    columns puts the size of its error on the next line."""
    name_w = max((len(n) for n, *_ in rows), default=0)
    shape_w = max((len(shape) for _, shape, *_ in rows), default=0)
    lines = []
    for name, shape, verdict, size in rows:
        line = f"  {name:<{name_w}} {shape:<{shape_w}} {verdict}" if shape else f"  {name:<{name_w}} {verdict}"
        if len(line + size) <= WIDTH:
            lines.append(line + size)
        else:
            lines.extend([line, _fill(" " * 4 + size.strip(), " " * 5)] if size else [line[:WIDTH]])
    return lines


def _out_of_time(who, i, case, time_limit) -> str:
    return (f"your {who} ran out of time on case {i} ({case.describe()}): it took more than {time_limit:g} s"
            " (an endless loop? the limit is check(..., time_limit=) or --time-limit)")


def _fill(text, indent="    ") -> str:
    return textwrap.fill(text, WIDTH, subsequent_indent=indent, break_on_hyphens=False)


def _rtol(t) -> float:
    """How close a right answer comes to the library's: float64 rounding, or float32's."""
    return _FLOAT32_RTOL_OF_RESULT if np.asarray(t).dtype == np.float32 else RTOL


def _right(g, t) -> bool:
    """An output is right when it has the library's dtype and equals it within the tolerance
    (in float32, a gradient that is zero up to rounding, such as b_k's, is zero within 1e-5)."""
    arr, t = as_gradient_array(g), np.asarray(t)
    if arr is None or arr.dtype != t.dtype:
        return False
    if t.dtype == np.float32 and arr.shape == t.shape and np.isfinite(arr).all() and t.size:
        return float(np.abs(arr - t).max()) <= _rtol(t) * float(np.abs(t).max()) + _FLOAT32_ATOL
    return close(arr, t, _rtol(t))


def _size_of_error(arr, t) -> str:
    """After WRONG: the expected shape when it differs, else the largest error against the
    largest entry (or where NaN appears)."""
    if arr is None or arr.shape != t.shape:
        return f" (expected {t.shape})"
    if not t.size:
        return ""
    if not np.isfinite(arr).all():
        return " (NaN/inf)"
    if arr.dtype != t.dtype:
        return f" (dtype {arr.dtype}, expected {t.dtype})"
    err, big = float(np.abs(arr - t).max()), float(np.abs(t).max())
    return f" (max error {err:.1e}, max |true| {big:.1e})" if err > _tolerance_of(t) else ""


def _tolerance_of(t):
    return _rtol(t) * (float(np.abs(t).max()) if t.size else 0.0) + (_FLOAT32_ATOL if t.dtype == np.float32 else ATOL)


def _next(e, diagnosis, hints_read) -> list:
    """The "next:" lines: what to do about the dtype or an argument written into, else the next
    unread hint, else none left."""
    if diagnosis.startswith("the gradients are right; your backward wrote into"):
        return ["next: compute into new arrays (no +=, *= or out= on the cache or dout), then check again"]
    if "dtype" in diagnosis and "precision" in diagnosis or "float32's precision" in diagnosis:
        return ["next: compute each gradient in its input's dtype (no .astype); check again"]
    read = set(hints_read if hints_read is not None else _HINTS_READ.get(e.name, ()))
    unread = [i for i in range(1, len(e.hints) + 1) if i not in read]
    if not unread:
        return [f"next: all {len(e.hints)} hints are read; compare your steps with the forward's, in reverse:",
                f"  python -m pydoc attention_ref.{e.forward_name}"]
    n = unread[0]
    return [f"next: hint {n} of {len(e.hints)}:", f"  python -m attention_ref exercise hint {e.name} {n}",
            f"  (in Python: hint(\"{e.name}\", {n}))"]


def _name_the_mistake(e, runs, failed) -> str:
    """What is wrong, most specific first: outputs in the wrong order; a catalogue mistake that
    reproduces the attempt on every case; a factor that varies with the cases; then the step
    the wrong outputs point at, with what can be seen."""
    swapped = _swapped(e, runs)
    if swapped:
        return swapped
    # a mistake that reproduces the attempt on every run; failing that, on every run where no
    # output has the wrong shape: that is a second mistake (a broadcast axis not summed back),
    # said after the name
    misshapen = [i for i, r in enumerate(runs, 1) if _misshapen(r[3], r[4])]
    # (only gradients left at a broadcast shape: a mistake that matches the square cases alone,
    # where another shape mistake does not show, is not named)
    unsummed_only = misshapen and len(misshapen) < len(runs) and all(_unsummed(runs[i - 1][3], runs[i - 1][4])
                                                                       for i in misshapen)
    for skipped in ([], misshapen if unsummed_only else []):
        for mistake in e.mistakes:
            if _reproduces(e, mistake, [r for i, r in enumerate(runs, 1) if i not in skipped]):
                return mistake.sentence + (_also_misshapen(e, runs, failed, skipped) if skipped else "")
    # outputs of the wrong shape on some cases and wrong values on others: two mistakes, the
    # values' first (their cases say where), the shapes' after
    # (only a gradient left at a broadcast shape: a shape mistake that a square case hides is one)
    unsummed = [i for i, r in enumerate(runs, 1) if _unsummed(r[3], r[4])]
    shaped = [f for f in failed if not any(f[0] is runs[i - 1][0] for i in unsummed)]
    besides = ""
    if unsummed and shaped and set(unsummed) == set(misshapen):
        besides, failed = _also_misshapen(e, runs, failed, misshapen), shaped
    case, name, got, truth = failed[0]
    factor = _factor_across_cases([r for i, r in enumerate(runs, 1) if i not in misshapen or not besides], name)
    if factor:
        return factor + besides
    run = next((r for r in runs if r.case is case), None)
    said = [_said_of(e, runs, c, n, g, t, run) for c, n, g, t in failed if c is case]  # every wrong output there
    specific = [x for x in said if "none of the classic mistakes explains" not in x]
    skipped = [x for x in specific if "was never computed" in x]  # a block of zeros says the most
    if not skipped and any("is exactly 0 on case" in x for x in said):  # zeros here: a block of them elsewhere?
        for r_i, r in enumerate(runs, 1):
            blocks = [_observe(e, c, n, g, t, r) for c, n, g, t in failed if c is r.case and c is not case]
            blocks = [x for x in blocks if "was never computed" in x]
            if blocks:
                skipped = [next(x for x in said if "is exactly 0 on case" in x) + f"; on case {r_i}, " + blocks[0]]
                break
    seen = (skipped or specific or said)[0]
    if "float32's precision" in seen:  # only when a float32 step reproduces the error on every case
        seen = _unless_float32_everywhere(e, runs, failed, case, seen)
    varying = _varying_ratio(runs, name)
    if varying and ("times the true gradient (ratio " in seen or "multiple of the true gradient (ratio " in seen):  # one case's number is no factor of all
        seen = varying
    overflow = _overflow_note(runs, failed)
    # which cases are wrong and which right, judged on every wrong output (the table's WRONG
    # rows): a right case whose true gradients of those outputs are zero (one key: the softmax
    # is constant) says nothing and is left out
    outputs = list(dict.fromkeys(f[1] for f in failed))
    by_output = {n: sorted({i for i, (c, *_) in enumerate(runs, 1) if any(c is f[0] and f[1] == n for f in failed)})
                 for n in outputs}
    wrong = sorted(set().union(*by_output.values()))
    # a gradient given where None belongs, or None where one belongs: every case with the output
    # right says something, however small its true value (b_k's is zero up to rounding)
    presence = any((as_gradient_array(f[2]) is None) != (f[3] is None) for f in failed)
    right = [i for i in range(1, len(runs) + 1) if i not in wrong and not (besides and i in misshapen)
             and (presence or _informative(runs[i - 1][4], set(outputs)))]
    if right:  # some cases are right: say which are not, the inputs tell why
        if len(wrong) <= min(3, len(right)):
            which = "only " + "; ".join(f"case {i} ({runs[i - 1][0].describe()})" for i in wrong) + \
                f" {'is' if len(wrong) == 1 else 'are'} wrong, the other cases are right"
        elif len(right) <= 3:
            which = (f"cases {_numbers(wrong)} are wrong; only "
                     + "; ".join(f"case {i} ({runs[i - 1][0].describe()})" for i in right)
                     + f" {'is' if len(right) == 1 else 'are'} right")
        else:
            which = f"cases {_numbers(wrong)} are wrong, cases {_numbers(right)} are right"
        if len({tuple(v) for v in by_output.values()}) > 1:  # the outputs are wrong on different cases
            which += " (" + "; ".join(f"{_short(n)} on case{'s' if len(v) > 1 else ''} {_numbers(v)}"
                                      for n, v in by_output.items()) + ")"
        differs = _separating(runs, wrong, right)
        if differs and "none of the classic mistakes explains" in seen:
            seen = ""  # what separates the cases says more than a largest error does
        seen = f"{which}: " + (differs + "; " + seen if seen and differs else differs or seen)
    return _locate(e, runs, failed) + seen + overflow + besides


def _separating(runs, wrong, right) -> str:
    """What the wrong cases share and the right ones do not: one feature's values on all the
    cases; failing that, on the cases that change one feature (said so); failing that, two
    features' values together that every wrong case has and no right case."""
    kept = sorted(wrong + right)
    differs = _what_differs([runs[i - 1][0] for i in kept], [kept.index(i) + 1 for i in wrong])
    if differs:
        return differs
    single = [i for i in kept if not runs[i - 1][0].feature.startswith(PAIRS)]
    if set(wrong) & set(single) and set(right) & set(single):
        differs = _what_differs([runs[i - 1][0] for i in single], [single.index(i) + 1 for i in wrong if i in single])
        if differs:
            return "among the cases that change one feature, " + differs
    return _pair_in_every_wrong_case([runs[i - 1][0] for i in wrong], [runs[i - 1][0] for i in right])


def _pair_in_every_wrong_case(wrong, right) -> str:
    """"dtype = 'float32' with activation = 'gelu_exact' in every wrong case and in no right one"."""
    if not wrong or not all(c.features for c in wrong + right):
        return ""
    names = list(wrong[0].features)
    found = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pair = (wrong[0].features[a], wrong[0].features[b])
            if all((c.features[a], c.features[b]) == pair for c in wrong) and \
                    not any((c.features[a], c.features[b]) == pair for c in right):
                found.append(f"{a} = {pair[0]!r} with {b} = {pair[1]!r}")
    if not found:
        return ""
    return (f"{' and '.join(found[:2])} in every wrong case and in no right one (each alone is right: a mistake"
            " that shows only where the two meet)")


def _reproduces(e, mistake, runs) -> bool:
    """Whether ``mistake`` gives the attempt's outputs on every run, and differs from the truth
    on one at least."""
    differs = False
    for _, dout, cache, got, truth, keys in runs:
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():  # a mistake may overflow
                warnings.simplefilter("ignore")
                predicted = _flatten(e.returns, e.run(mistake.backward, dout, copy.deepcopy(cache)), keys)
                signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
        except Exception:  # noqa: BLE001  (a product of the wrong shapes: not this attempt's mistake)
            return False
        if isinstance(predicted, str) or not _matches(got, predicted):
            return False
        differs = differs or not _matches(predicted, truth)
    return differs


def _misshapen(got, truth) -> bool:
    """Whether an output of a run has another shape than the true gradient's."""
    return any(t is not None and as_gradient_array(g) is not None and as_gradient_array(g).shape != np.shape(t)
               for (_, g), (_, t) in zip(got, truth))


def _unsummed(got, truth) -> bool:
    """Whether every output of a run with another shape than the truth's has the shape the
    truth broadcasts to (a gradient not summed back over its input's broadcast axes)."""
    def broadcasts_to(g, t):
        try:
            return np.broadcast_shapes(g.shape, np.shape(t)) == g.shape
        except ValueError:
            return False

    pairs = [(as_gradient_array(g), t) for (_, g), (_, t) in zip(got, truth) if t is not None
             and as_gradient_array(g) is not None and as_gradient_array(g).shape != np.shape(t)]
    return bool(pairs) and all(broadcasts_to(g, t) for g, t in pairs)


def _also_misshapen(e, runs, failed, misshapen) -> str:
    """"; and on case 6 (batch = k, v broadcast), dk has shape ...": the second mistake."""
    if not misshapen or len(misshapen) == len(runs):
        return ""
    i = misshapen[0]
    case = runs[i - 1][0]
    shape_wrong = [(c, n, g, t) for c, n, g, t in failed if c is case and
                   as_gradient_array(g) is not None and as_gradient_array(g).shape != np.shape(t)]
    c, n, g, t = shape_wrong[0]
    where = f"case {i}" + (f" ({case.feature})" if case.feature else "")
    return f"; besides, on {where}: " + _observe(e, c, n, g, t)


def _informative(truth, names) -> bool:
    """Whether a case's true gradients of ``names`` are more than rounding (largest entry above
    1e-8 of the case's largest gradient, 1e-4 in float32): a zero gradient is right whatever
    the mistake."""
    def biggest(t):
        return float(np.abs(np.asarray(t, dtype=np.float64)).max()) if t is not None and np.size(t) else 0.0

    scale = max((biggest(t) for _, t in truth), default=0.0)
    return any(biggest(t) > (1e-4 if np.asarray(t).dtype == np.float32 else 1e-8) * scale
               for n, t in truth if n in names and t is not None)


def _overflow_note(runs, failed) -> str:
    """NaN or infinity only in a case whose scores are near 800: exp overflowed there."""
    bad = [i for i, (c, *_) in enumerate(runs, 1) if "800" in c.feature and any(
        c is f[0] and as_gradient_array(f[2]) is not None and not np.isfinite(as_gradient_array(f[2])).all()
        for f in failed)]
    if not bad:
        return ""
    return (f"; on case {bad[0]} ({runs[bad[0] - 1][0].feature}) it gives NaN or infinity: exp overflows there,"
            " subtract the row maximum before exp (or use the saved statistics)")


def _features(case) -> dict:
    """What may explain why a mistake shows in some cases only: the contract's features of
    the case; for a case built by hand, head count and width, the number of axes of the first
    input, and the keyword arguments."""
    if case.features:
        return dict(case.features)
    found = dict(case.sizes)
    first = case.inputs[0] if case.inputs else None
    if isinstance(first, np.ndarray):
        found["the first input's ndim"] = first.ndim
    for key, value in case.kwargs.items():
        found[key] = ("a bool mask" if value.dtype == bool else "a float mask") if isinstance(value, np.ndarray) \
            else value
    return found


_WHY = {"h": "are the head count and width read from the arguments, the cache or the shapes, not from a"
             " global? is every head computed?",
        "d_head": "is the head width read from the shapes, not from a global?",
        "the first input's ndim": "a fixed axis, .T or a reshape that assumes a number of batch axes?",
        "axis": "is the sum along cache.axis?", "norm_first": "the pre-norm and post-norm branches differ.",
        "causal": "is the causal rule applied, with the queries aligned to the last keys?",
        "window": "is the window applied, with the queries aligned to the last keys?",
        "mask": "is the mask applied, for every kind of mask?",
        "rule": "are the causal rule and the window applied, alone and together, with the queries aligned to"
                " the last keys?",
        "dtype": "float32 inputs get float32 gradients: is every step in the inputs' dtype?",
        "scale": "is the scale read from cache.scale, not computed from a shape?",
        "batch": "are the batch axes any number, and is a gradient summed over the axes its input was"
                 " broadcast along?",
        "ndim": "a fixed axis, .T or a reshape that assumes a number of axes?",
        "leading": "a fixed axis, .T or a reshape that assumes a number of leading axes?",
        "size_1": "a squeeze(), or a shape test, that an axis of size 1 fools?",
        "widths": "is each width read from its own array's shape?",
        "head_widths": "is each head width read from its own array (d_v from v, d_k from q)?",
        "model_width": "is the head width read from the shapes, not d_model // h?",
        "input_widths": "are the key's and value's widths read from their own arrays?",
        "lengths": "are n_q and n_k read from their own arrays?",
        "bias": "an absent bias gets None; is a present one summed over every leading axis?",
        "block_size": "do the tiles cover every row when block_size does not divide n?",
        "activation": "is the feed-forward's activation derivative the one of cache's activation?",
        "scores": "is the row maximum subtracted before exp (or the saved statistics used)?",
        "attention": "self-attention: the query, key and value paths all reach the one input."}


#: what the right cases share, said without a cause, when the feature's question does not apply
#: (an axis of size 1 in the right cases: a squeeze() would break those, not the others)
_WHY_RIGHT = {"size_1": "the right cases share an axis of size 1.",
              "dtype": "the float32 cases are judged to float32's tolerance: an error smaller than that passes"
                       " there."}


def _tiles_fit(case) -> bool:
    """Whether a blockwise case's block_size divides both n_q and n_k."""
    size = case.kwargs.get("block_size")
    if not size or len(case.inputs) < 2:
        return True
    return case.inputs[0].shape[-2] % size == 0 and case.inputs[1].shape[-2] % size == 0


def _what_differs(cases, wrong) -> str:
    """The features whose values in the wrong cases and in the right ones do not overlap."""
    features = [_features(c) for c in cases]  # once per case
    bad_features = [f for j, f in enumerate(features, 1) if j in wrong]
    good_features = [f for j, f in enumerate(features, 1) if j not in wrong]
    said, why = [], []
    for key in dict.fromkeys(k for f in features for k in f):
        bad = {repr(f.get(key)) for f in bad_features}
        good = {repr(f.get(key)) for f in good_features}
        if bad and good and not bad & good:
            said.append(f"{key} = {', '.join(sorted(bad))} in the wrong cases and {', '.join(sorted(good))}"
                        " in the right ones")
            active = key in ("h", "d_head", "the first input's ndim", "axis", "norm_first") or \
                not bad & {"None", "False"}  # a rule's question only where the wrong cases use it
            active = active and not (key == "size_1" and "'none'" in bad)  # size 1 only in right cases
            active = active and not (key == "dtype" and "'float32'" not in bad)  # float64 wrong: no dtype question
            if key == "block_size":  # the question only when the wrong sizes are those that do not divide n
                bad_cases = [c for j, c in enumerate(cases, 1) if j in wrong]
                good_cases = [c for j, c in enumerate(cases, 1) if j not in wrong]
                active = active and not any(map(_tiles_fit, bad_cases)) and all(map(_tiles_fit, good_cases))
            why.append(_WHY.get(key, "") if active else _WHY_RIGHT.get(key, ""))
    if not said:
        return ""
    right_h = {f.get("h") for f in good_features}
    one_head = right_h == {1} and any(s.startswith("h = ") for s in said)
    extra = " With one head, a mistake in the order of the heads cannot show." if one_head else ""
    said_why = f"{' '.join(w for w in dict.fromkeys(why) if w)}{extra}"
    return f"{'; '.join(said)}" + (f" ({said_why})" if said_why else "")


def _said_of(e, runs, case, name, got, truth, run) -> str:
    """The observation of one wrong output; "missing" only when the output is zero on every
    case where its true gradient is not."""
    said = _observe(e, case, name, got, truth, run)
    if "this gradient is missing" not in said or _zero_wherever_informative(runs, name):
        return said
    i = next(j for j, r in enumerate(runs, 1) if r.case is case)
    return (f"{_short(name)} is exactly 0 on case {i} where the true gradient is not, but not on every case:"
            " a part of the work (a tile, a branch) is skipped on some inputs")


def _unless_float32_everywhere(e, runs, failed, case, seen) -> str:
    """``seen`` (a float32-precision sentence) when the reference recomputed in float32 is off by
    about as much as the attempt (a factor 10 either way) on every float64 case where the output
    is more than rounding; otherwise the size of the error, with the case that rules float32 out."""
    name = next(n for c, n, *_ in failed if c is case and seen.startswith(_short(n)))
    first = next(i for i, r in enumerate(runs, 1) if r.case is case)
    for i, r in enumerate(runs, 1):
        t = dict(r.truth).get(name)
        if t is None or np.asarray(t).dtype != np.float64 or not _informative(r.truth, {name}):
            continue
        g, f32 = as_gradient_array(dict(r.got).get(name)), _float32_error(e, r, name)
        if g is None or g.shape != np.shape(t) or f32 is None:
            continue
        rel = float(np.abs(g.astype(np.float64) - t).max()) / max(float(np.abs(t).max()), ATOL)
        if not f32 / 10 <= rel <= 10 * f32:
            rel_first = float(seen.split("only to about ", 1)[1].split(" ", 1)[0]) if "only to about " in seen else 0
            how = "right" if rel <= _rtol(t) else f"off by {rel:.0e}"
            return (f"{_short(name)} is wrong by about {rel_first:.0e} relative on case {first}, and {how} on case"
                    f" {i}, where a float32 step would be off by {f32:.0e}: not float32's rounding; a small term"
                    " added or left out (an eps, a clip such as 1e-8, a constant)?")
    return seen


def _zero_wherever_informative(runs, name) -> bool:
    """Whether output ``name`` is exactly zero on every case where its true gradient is not."""
    for r in runs:
        t = dict(r.truth).get(name)
        if t is None or not _informative(r.truth, {name}):
            continue
        g = as_gradient_array(dict(r.got).get(name))
        if g is None or g.shape != np.shape(t) or g.any():
            return False
    return True


def _observe(e, case, name, got, truth, run=None) -> str:
    masked = case.masked if name == e.returns[0] else None
    arr = as_gradient_array(got)
    return observe(name, got, truth, case.factors, masked, _axis_names(arr.ndim if arr is not None else 0, name),
                   parameter=name.startswith("grads[") or name not in ("dx", "dq", "dk", "dv", "dquery", "dkey",
                                                                       "dvalue", "dheads"),
                   product=e.name not in ("split_heads_backward", "merge_heads_backward"),
                   float32_error=None if run is None else _float32_error(e, run, name))


def _to_float32(x):
    """A cache (NamedTuples, dicts, lists of arrays) with every float64 array cast to float32."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float32) if x.dtype == np.float64 else x
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_to_float32(v) for v in x))
    if isinstance(x, (tuple, list)):
        return type(x)(_to_float32(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_float32(v) for k, v in x.items()}
    return x


def _float32_error(e, run, name):
    """The relative error of output ``name`` when the reference backward runs on the case's
    cache and upstream gradient cast to float32 (what "done in float32" gives); None when the
    case is float32 already or the reference cannot run so."""
    truth = dict(run.truth).get(name)
    if truth is None or np.asarray(truth).dtype != np.float64 or not np.size(truth):
        return None
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            low = _flatten(e.returns, e.run(e.backward, run.dout.astype(np.float32),
                                            _to_float32(copy.deepcopy(run.cache))), run.keys)
            signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    except Exception:  # noqa: BLE001  (a backward that insists on float64: no measure)
        return None
    got = as_gradient_array(dict(low).get(name)) if not isinstance(low, str) else None
    if got is None or got.shape != np.shape(truth):
        return None
    return float(np.abs(got.astype(np.float64) - truth).max()) / max(float(np.abs(truth).max()), ATOL)


def _swapped(e, runs):
    """"your dx equals the true dW": an output that is wrong in place but equals another output's
    true value in every case (outputs returned in another order, dict entries exchanged)."""
    names = [n for n, _ in runs[0][4]]

    def right(g, t):
        return g is None if t is None else _right(g, t)

    for i, name in enumerate(names):
        if all(right(r[3][i][1], r[4][i][1]) for r in runs):
            continue
        for j, other in enumerate(names):
            if j != i and all(r[4][j][1] is not None and np.size(r[4][j][1]) and _right(r[3][i][1], r[4][j][1])
                              for r in runs):
                if name.startswith("grads[") and other.startswith("grads["):  # a dict: no order to fix
                    return (f"your {_short(name)} equals the true {_short(other)}: two entries of the dict grads"
                            f" are exchanged; grads[{_short(name)!r}] holds the gradient of {_short(name)}")
                shown = ", ".join(e.returns)  # grads stays one dict, as the function returns it
                return (f"your {_short(name)} equals the true {_short(other)}: the outputs are in the wrong"
                        f" order; return ({shown}) in that order")
    return None


def _factor_across_cases(runs, name):
    """A factor that changes with the cases: ``name`` is c_i times the truth on case i, with
    c_i = the same named factor of every case (1/h is 1 where h = 1, 1/3 where h = 3)."""
    ratios = []
    for case, _, _, got, truth, _ in runs:
        g = dict(got).get(name)
        t = dict(truth).get(name)
        g = as_gradient_array(g)
        if t is None and g is None:
            continue  # an absent bias, rightly None
        if g is None or t is None or g.shape != np.shape(t) or not np.isfinite(g).all():
            return None
        if not _informative(truth, {name}) or np.asarray(t).dtype == np.float32:
            continue  # a zero gradient says nothing about a factor; float32 rounding blurs one
        c = ratio(g.astype(np.float64), np.asarray(t, dtype=np.float64))
        if c is None:
            return None
        ratios.append((case, c))
    if not ratios:
        return None
    if len({round(c, 9) for _, c in ratios}) < 2:
        return None  # one ratio for every case: observe names it, with the case's factors
    common = set.intersection(*(set(case.factors) for case, _ in ratios))
    matching = [label for label in sorted(common)
                if all(abs(c - case.factors[label]) <= 1e-6 * max(1.0, abs(c)) for case, c in ratios)]
    if not matching:
        return None
    label, shown = matching[0], ", ".join(f"{c:.4g}" for _, c in ratios)
    why = " (a mean over the rows where a sum belongs)" if label.startswith("1/rows") else ""
    alike = f"; {' and '.join(matching)} are equal on these cases" if len(matching) > 1 else ""  # none chosen
    return (f"{_short(name)} is {label} times the true gradient in every case (ratios {shown}, as {label}"
            f" changes from case to case{alike}): a factor {label} is missing or extra{why}")


def _varying_ratio(runs, name):
    """"dq is a multiple of the true gradient that changes from case to case": when the ratio
    is constant within each case but not across them, and no named factor tracks it."""
    ratios = []
    for case, _, _, got, truth, _ in runs:
        g, t = as_gradient_array(dict(got).get(name)), dict(truth).get(name)
        if g is None or t is None or g.shape != np.shape(t) or not np.isfinite(g).all() \
                or not _informative(truth, {name}) or np.asarray(t).dtype == np.float32:
            continue
        c = ratio(g.astype(np.float64), np.asarray(t, dtype=np.float64))
        if c is None:
            return None
        ratios.append(c)
    if len({round(c, 9) for c in ratios}) < 2:
        return None
    shown = ", ".join(dict.fromkeys(f"{c:.4g}" for c in ratios))
    return (f"{_short(name)} is a multiple of the true gradient that changes from case to case (ratios {shown}):"
            " a factor that depends on the inputs' sizes or options is missing or extra")


def _locate(e, runs, failed) -> str:
    """"dv is right, dq and dk are wrong: the error is in <step>: ", from the exercise's steps;
    when several steps feed exactly the wrong outputs, all of them are said; empty when none does."""
    names = [n for n, _ in runs[0][4]]
    wrong = {n for _, n, _, _ in failed}
    # absent biases are never wrong, and an output whose true gradient is zero in every case
    # (b_k's) is right whatever the mistake: neither says where the error is
    present = {_short(n) for r in runs for n, t in r[4] if t is not None and (n in wrong or _informative(r[4], {n}))}
    right = [n for n in names if n not in wrong and _short(n) in present]
    if not e.steps or not right:
        return ""
    steps = [step for step, outputs in e.steps if set(outputs) & present == {_short(n) for n in wrong}]
    if not steps:
        return ""
    ordered = [n for n in names if n in wrong]
    r = ", ".join(_short(n) for n in right)
    w = ", ".join(_short(n) for n in ordered)
    where = steps[0] if len(steps) == 1 else \
        "one of: " + "; ".join(f"({i}) {step}" for i, step in enumerate(steps, 1))  # all said, none chosen
    return (f"{r} {'is' if len(right) == 1 else 'are'} right, {w} {'is' if len(ordered) == 1 else 'are'}"
            f" wrong: the error is in {where}; ")


def _short(name):
    """grads['W_q'] -> W_q, for the sentences."""
    return name[7:-2] if name.startswith("grads[") else name
