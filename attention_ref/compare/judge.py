"""``compare.operation``: run a user's function on the cases of one operation, judge each output
against the reference, and name the mistake only when a mistaken variant reproduces it on every case.

Tolerances (docs/compare.md):

* float64 cases: ``max |user - reference| <= atol + rtol * max |reference|`` (``rtol`` 1e-10 by default:
  about a million times float64's resolution, far below any mistake of the catalogue);
* float32 cases: the reference is also computed in float32, and the user's error against the float64
  reference is divided by the reference's own float32 error (at least float32's resolution times the
  output's size): this R-ratio must be at most :data:`R_LIMIT` (4);
* masks: equal, entry by entry;
* entries that are padding (a query with no allowed key) are judged only for NaN and infinity.
"""
from __future__ import annotations

import math
import os
import sys
import traceback
import warnings
from numbers import Real

import numpy as np

from .._checks import signals_land_here
from .catalogue import MISTAKES
from .operations import OPERATIONS, Case
from .verdict import Comparison

__all__ = ["operation", "R_LIMIT", "PRECISION_FACTOR"]

#: The largest R-ratio (user's error over the reference's own error in that dtype) that passes
R_LIMIT = 4.0
#: A lower-precision variant reproduces an error when the two errors are within this factor
PRECISION_FACTOR = 10.0
#: A mistaken variant reproduces a float32 output within this many float32 resolutions of the output's
#: size (float64 outputs: within the float64 tolerance itself)
VARIANT_ULPS = 1000.0

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # attention_ref/: never the user's line
_LAYOUTS = ("half", "interleaved")


def operation(name, fn, **settings) -> Comparison:
    """Compare ``fn``, a user's implementation of the operation ``name``, with the reference.

    Parameters
    ----------
    name : one of ``"softmax"`` (``fn(x)``, last axis), ``"scaled_dot_product_attention"``
        (``fn(q, k, v, mask)``: q (B, H, Tq, D), k and v (B, Hkv, Tk, D), query head h reads
        key/value head h // (H // Hkv), mask None or bool with True = may attend, broadcastable to
        (B, H, Tq, Tk)), ``"causal_mask"`` (``fn(Tq, Tk, window)`` -> bool (Tq, Tk), query i at
        position p = i + Tk - Tq sees key j when j <= p and, with a window W, p - W < j), ``"rope"``
        (``fn(x, positions)``, x (B, H, T, D), positions (B, T) integers), ``"rms_norm"``
        (``fn(x, weight, eps)``), ``"layer_norm"`` (``fn(x, weight, bias, eps)``), ``"gelu"``
        (``fn(x)``) or ``"swiglu"`` (``fn(x, w_gate, w_up, w_down)``, w_gate and w_up (D, F), w_down (F, D))
    fn : the user's function; it may take and return NumPy arrays or torch tensors (tried with
        NumPy arrays first, then, when it fails on every case and torch is installed, with tensors)
    settings : keyword-only, the configuration the user meant:
        ``scaled_dot_product_attention``: ``scale`` (None: 1/sqrt(D)), ``softcap`` (None: off);
        ``rope``: ``layout`` ("half", transformers' Llama; or "interleaved"), ``theta`` (10000.0),
        ``rotary_dim`` (None: all D features), ``scaling`` (None, or a transformers rope_scaling dict);
        ``rms_norm``: ``offset`` (0.0; Gemma's 1.0 multiplies by 1 + weight);
        ``gelu``: ``approximate`` ("none", exact; or "tanh");
        every operation: ``rtol`` (1e-10, float64 cases), ``atol`` (0.0), ``seed`` (0, the cases' draw)

    Returns
    -------
    Comparison : ``.ok``, ``.mistake`` (a catalogue id or None), ``.where``, ``.inputs``;
        ``bool()`` is ``.ok``, ``.check()`` raises ``AssertionError``, ``str()`` is the verdict
    """
    spec, s = _check(name, fn, settings)
    rng = np.random.default_rng(s["seed"])
    cases = spec.cases(s, rng)
    outputs, torch = _run_all(fn, cases)

    def call(args):
        """The user's function on one probe's arguments (NumPy out), raising what it raises."""
        out = _call(fn, Case(tuple(args), {}), torch)
        if isinstance(out, _Raised):
            raise out.error
        return out
    return _judge(spec, s, cases, outputs, lambda: spec.probe(call, s, np.random.default_rng(s["seed"])))


def _check(name, fn, settings):
    if not isinstance(name, str) or name not in OPERATIONS:
        raise ValueError(f"name must be one of {tuple(OPERATIONS)}, got {name!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable ({OPERATIONS[name].signature}), got {type(fn).__name__}")
    spec = OPERATIONS[name]
    allowed = {**spec.settings, "rtol": 1e-10, "atol": 0.0, "seed": 0}
    unknown = sorted(set(settings) - set(allowed))
    if unknown:
        raise TypeError(f"compare.operation({name!r}) has no setting {unknown[0]!r}; its settings are"
                        f" {', '.join(sorted(allowed))}")
    s = {**allowed, **settings}
    for key in ("rtol", "atol"):
        if not isinstance(s[key], Real) or not s[key] >= 0:
            raise ValueError(f"{key} must be a non-negative real number, got {s[key]!r}")
    if isinstance(s["seed"], bool) or not isinstance(s["seed"], (int, np.integer)):
        raise TypeError(f"seed must be an integer, got {s['seed']!r}")
    for key in ("scale", "softcap", "theta"):
        if key in s and s[key] is not None and (isinstance(s[key], bool) or not isinstance(s[key], Real)
                                                or not 0 < s[key] < math.inf):
            raise ValueError(f"{key} must be a positive real number{' or None' if key != 'theta' else ''},"
                             f" got {s[key]!r}")
    if "layout" in s and s["layout"] not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, got {s['layout']!r}")
    if "approximate" in s and s["approximate"] not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {s['approximate']!r}")
    if "offset" in s and (isinstance(s["offset"], bool) or not isinstance(s["offset"], Real)
                          or not math.isfinite(s["offset"])):
        raise ValueError(f"offset must be a finite real number, got {s['offset']!r}")
    if s.get("rotary_dim") is not None:
        r = s["rotary_dim"]
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 2 or r % 2:
            raise ValueError(f"rotary_dim must be an even integer >= 2 or None, got {r!r}")
    if s.get("scaling") is not None:
        from ..nn.rope_scaling import rope_frequencies
        given = dict(s["scaling"])
        if "rope_theta" in given:  # transformers 5's rope_parameters carry the base
            if "theta" in settings and float(settings["theta"]) != float(given["rope_theta"]):
                raise ValueError(f"theta = {settings['theta']} and scaling['rope_theta'] = {given['rope_theta']}"
                                 " disagree: give one of them")
            s["theta"] = float(given["rope_theta"])
        scaling = {k: v for k, v in given.items() if k != "rope_theta"}
        rope_frequencies(16, float(s["theta"]), scaling)  # refuses a malformed dict by name
        s["scaling"] = scaling
    return spec, s


# ---------------------------------------------------------------- running the user's code
class _Raised:
    """An exception of the user's code, with the user's line that raised."""

    def __init__(self, error: BaseException):
        self.error = error
        self.line = _user_line(error)

    def __str__(self):
        return f"{self.line}: {type(self.error).__name__}: {self.error}"


def _library_dirs():
    dirs = [_PACKAGE, os.path.dirname(np.__file__)]
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        dirs.append(os.path.dirname(torch.__file__))
    return tuple(d + os.sep for d in dirs)


def _user_line(error):
    frames = traceback.extract_tb(error.__traceback__)
    skip = _library_dirs()
    mine = [f for f in frames if not os.path.abspath(f.filename).startswith(skip)]
    frame = (mine or frames or [None])[-1]
    if frame is None:
        return "(no line)"
    return f"{frame.filename}, line {frame.lineno}: {(frame.line or '').strip()}"


def _as_torch(a):
    import torch
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a.copy())  # the user's code may write into its tensors: never the case's own
    return a


def _as_numpy(out):
    if isinstance(out, tuple):
        raise TypeError(f"fn returned a tuple of {len(out)} items; compare needs the output array alone"
                        " (this package's *_forward functions return (output, cache))")
    if hasattr(out, "detach") and hasattr(out, "cpu"):
        out = out.detach().cpu()
        if str(out.dtype) == "torch.bfloat16":
            out = out.float()
        out = out.numpy()
    out = np.asarray(out)
    if out.dtype.kind not in "biuf":
        raise TypeError(f"fn returned an array of dtype {out.dtype}; compare needs real numbers (or booleans)")
    return out


def _call(fn, case: Case, torch: bool):
    args = tuple(_as_torch(a) for a in case.args) if torch else tuple(
        a.copy() if isinstance(a, np.ndarray) else a for a in case.args)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            out = fn(*args)
            signals_land_here()
        return _as_numpy(out)
    except Exception as error:  # the user's code: any exception is a verdict
        return _Raised(error)


def _run_all(fn, cases):
    """The user's outputs on every case, and whether the function was called with torch tensors."""
    outputs = [_call(fn, c, False) for c in cases]
    if all(isinstance(o, _Raised) for o in outputs):
        try:
            import torch  # noqa: F401
        except ImportError:
            return outputs, False
        with_torch = [_call(fn, c, True) for c in cases]
        first = str(outputs[0].error)
        if sum(isinstance(o, _Raised) for o in with_torch) < len(cases) or "Tensor" in first:
            return with_torch, True  # a torch function: its own errors, not NumPy arrays' TypeError
    return outputs, False


# ---------------------------------------------------------------- judging
def _deviation(u, t, skip):
    """max |u - t| over the entries not skipped; NaN or inf where the other is finite counts as inf."""
    u, t = np.broadcast_arrays(np.asarray(u, np.float64), np.asarray(t, np.float64))
    keep = np.ones(u.shape, bool) if skip is None else ~np.broadcast_to(skip, u.shape)
    u, t = u[keep], t[keep]
    same_nonfinite = (np.isnan(u) & np.isnan(t)) | (np.isinf(u) & (u == t))
    finite = np.isfinite(u) & np.isfinite(t)
    if not np.all(finite | same_nonfinite):
        return math.inf
    with np.errstate(over="ignore"):  # two finite values 1e308 apart: inf, an infinite deviation
        largest = float(np.max(np.abs(u[finite] - t[finite]), initial=0.0))
        signals_land_here()
    return largest


class _Judged:
    """One case's verdict: the reference, the tolerance, the user's deviation."""

    def __init__(self, spec, s, case, out):
        self.case = case
        self.ref = spec.reference(case, s, np.float64) if case.dtype is not None else spec.reference(case, s)
        self.exact = spec.exact
        self.shape_ok = tuple(out.shape) == tuple(self.ref.shape)
        self.out = out
        if self.exact:
            self.allow, self.scale = 0.0, 1.0
            self.variant_allow = 0.0
        elif case.dtype == np.float64:
            size = _deviation(self.ref, 0 * self.ref, case.finite_only)
            self.allow, self.scale = s["atol"] + s["rtol"] * size, max(size, np.finfo(np.float64).tiny)
            self.variant_allow = self.allow
        else:
            size = _deviation(self.ref, 0 * self.ref, case.finite_only)
            own = _deviation(spec.reference(case, s, case.dtype), self.ref, case.finite_only)
            floor = max(own, float(np.finfo(case.dtype).eps) * size, np.finfo(np.float64).tiny)
            self.allow, self.scale = s["atol"] + R_LIMIT * floor, floor
            # a mistaken variant rounds differently from the reference in this dtype (larger scores, ...):
            # it reproduces a float32 output within VARIANT_ULPS of the output's size
            self.variant_allow = max(self.allow, VARIANT_ULPS * float(np.finfo(case.dtype).eps) * size)
        self.deviation = self.against(self.ref) if self.shape_ok else math.inf
        self.ok = self.deviation <= self.allow
        self.nan_rows = bool(self.shape_ok and case.finite_only is not None and not np.all(
            np.isfinite(np.asarray(out, np.float64))[np.broadcast_to(case.finite_only, out.shape)]))

    def against(self, target, dont_care=None):
        skip = self.case.finite_only
        if dont_care is not None:
            skip = dont_care if skip is None else (skip | dont_care)
        if self.exact:
            return 0.0 if np.array_equal(np.asarray(self.out, bool), np.asarray(target, bool)) and \
                self.out.dtype == np.bool_ else math.inf
        return _deviation(self.out, target, skip)

    @property
    def error(self):
        """Relative to the reference's size (float64) or the R-ratio (float32); inf for NaN or a shape."""
        return self.deviation / self.scale if not self.exact else (0.0 if self.ok else math.inf)


def _label(name, value):
    return name if value is True else f"{name} = {value}"


def _feature_values(case):
    return {_label(k, v) for k, v in case.features.items() if v is not False and v is not None}


def _judge(spec, s, cases, outputs, probe) -> Comparison:
    raised = {i for i, o in enumerate(outputs) if isinstance(o, _Raised)}
    subject = spec.name
    # features whose every case raised (and that leave other cases): not supported, judged without them
    unsupported = []
    for feature in ("dtype",) + tuple(spec.optional):  # a float32-only port is judged on float32
        values = {c.features.get(feature) for c in cases} - {None, False}
        for value in sorted(values, key=str):
            with_it = {i for i, c in enumerate(cases) if c.features.get(feature) == value}
            if with_it and with_it <= raised and len(with_it) < len(cases):
                unsupported.append((feature, value, with_it))
    unsupported = [u for u in unsupported  # a feature inside a wider unsupported one is not listed
                   if not any(u[2] < other[2] for other in unsupported)]
    left_out = set().union(*(w for _, _, w in unsupported)) if unsupported else set()
    judged_ids = [i for i in range(len(cases)) if i not in left_out]
    unsupported_labels = tuple(_label(f, v) for f, v, _ in unsupported)
    if not judged_ids or all(i in raised for i in judged_ids):
        first = outputs[judged_ids[0] if judged_ids else 0]
        return Comparison(False, None, "the call raised", (), subject, len(judged_ids), len(judged_ids), math.inf,
                          unsupported_labels, f"It raised on every case: {first}")
    failures = [i for i in judged_ids if i in raised]
    if failures:
        i = failures[0]
        shown = _separating([cases[j] for j in judged_ids], [cases[j] for j in failures])
        return Comparison(False, None, "the call raised", shown, subject, len(judged_ids), len(failures),
                          math.inf, unsupported_labels,
                          f"It raised on {len(failures)} case(s) of features it handles elsewhere, first on a case"
                          f" with {', '.join(sorted(_feature_values(cases[i])))}:\n  {outputs[i]}")
    judged = [_Judged(spec, s, cases[i], outputs[i]) for i in judged_ids]
    error = max([j.error for j in judged if j.case.dtype in (None, np.float64)], default=None)
    ratios = [j.error for j in judged if j.case.dtype not in (None, np.float64)]
    extra = {"r_ratio": max(ratios) if ratios else None}
    wrong = [j for j in judged if not j.ok]
    nan_rows = [j for j in judged if j.nan_rows]
    n = len(judged)
    if not wrong and not nan_rows:
        return Comparison(True, None, None, (), subject, n, 0, error, unsupported_labels, **extra)
    if not wrong:
        return Comparison(False, "masked_row_nan", "softmax", ("fully masked rows",), subject, n, len(nan_rows),
                          math.inf, unsupported_labels,
                          "Every value matches, but rows with no allowed key hold NaN or inf.", **extra)
    not_bool = [j for j in wrong if spec.exact and j.shape_ok and j.out.dtype != np.bool_]
    if not_bool:
        return Comparison(False, None, "the output's dtype", (), subject, n, len(wrong), error, unsupported_labels,
                          f"It returned dtype {not_bool[0].out.dtype}; a boolean mask (True = may attend) is"
                          " expected.", **extra)
    shapes = [j for j in wrong if not j.shape_ok]
    inputs = _separating([j.case for j in judged], [j.case for j in wrong])
    if shapes:
        j = shapes[0]
        return Comparison(False, None, "the output's shape", inputs, subject, n, len(wrong), math.inf,
                          unsupported_labels, f"It returned shape {tuple(j.out.shape)} where the reference has"
                          f" {tuple(j.ref.shape)}.", **extra)
    variant = _name(spec, s, judged)
    nan_note = " It also returns NaN or inf on rows with no allowed key (masked_row_nan)." if nan_rows else ""
    if variant is not None:
        how = ("in size (within a factor of 10 on every case)" if variant.precision else
               "on every case, within the tolerance")
        return Comparison(False, variant.mistake, variant.step, inputs, subject, n, len(wrong), error,
                          unsupported_labels, f"Reproduced by the reference with '{variant.key}' {how}.{nan_note}",
                          **extra)
    where = _locate(spec, inputs, probe)
    first = [j for j in wrong if j.case.dtype in (None, np.float64)] or wrong  # float64 first: the plainer size
    worst = max(first, key=lambda j: j.error)
    kind = "relative error" if worst.case.dtype in (None, np.float64) else "R-ratio"
    features = ", ".join(sorted(_feature_values(worst.case)))
    return Comparison(False, None, where, inputs, subject, n, len(wrong), error, unsupported_labels,
                      f"Largest {kind} {worst.error:.3g} on a case with {features} ({len(wrong)} of {n} cases"
                      f" differ).{nan_note}", **extra)


def _separating(cases, wrong):
    """The input features that separate the ``wrong`` cases from the right ones among ``cases``: those
    every wrong case has and the fewest right cases have; else the fewest feature values, each seen
    only on wrong cases, that cover the wrong cases. () when every case is wrong."""
    wrong_ids = {id(c) for c in wrong}
    right = [c for c in cases if id(c) not in wrong_ids]
    if not right:
        return ()
    common = set.intersection(*(_feature_values(c) for c in wrong))
    common -= set.intersection(*(_feature_values(c) for c in right))
    if common:  # the most telling of them: those seen on the fewest right cases
        seen = {v: sum(v in _feature_values(c) for c in right) for v in common}
        return tuple(sorted(v for v in common if seen[v] == min(seen.values())))
    candidates = {}
    for c in cases:
        for value in _feature_values(c):
            candidates.setdefault(value, set()).add(id(c))
    showing = {v: ids for v, ids in candidates.items() if ids <= wrong_ids}
    chosen, covered = [], set()
    for value, ids in sorted(showing.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        if not ids <= covered:
            chosen.append(value)
            covered |= ids
        if covered == wrong_ids:
            break
    return tuple(chosen)


def _name(spec, s, judged):
    """The first variant that reproduces the user's outputs on every judged case, or None."""
    for variant in spec.variants(s, judged[0].case):
        if all(_reproduces(variant, s, j) for j in judged):
            return variant
    return None


def _reproduces(variant, s, j):
    try:
        value, dont_care = variant.compute(j.case, s)
    except Exception:  # a variant that does not apply to this case's shapes reproduces nothing
        return False
    if np.shape(value) != np.shape(j.ref):
        return False
    if not variant.precision:
        return j.against(value, dont_care) <= j.variant_allow
    floor = max(j.allow, np.finfo(np.float64).tiny)
    user = max(j.deviation, floor)
    theirs = max(_deviation(value, j.ref, j.case.finite_only if dont_care is None else
                            (dont_care if j.case.finite_only is None else dont_care | j.case.finite_only)), floor)
    return 1 / PRECISION_FACTOR <= user / theirs <= PRECISION_FACTOR


def _locate(spec, inputs, probe):
    """The step a probe isolates (inputs chosen so that the other steps are the identity); else the
    step the separating features point to; else the operation's output."""
    if spec.probe is not None:
        try:
            step = probe()
        except Exception:  # a probe the user's code cannot take locates nothing
            step = None
        if step is not None:
            return step
    steps = [spec.feature_steps[v.split(" = ")[0]] for v in inputs if v.split(" = ")[0] in spec.feature_steps]
    if steps:
        return min(steps, key=spec.steps.index)
    return f"{spec.name}'s output (no input feature separates the wrong cases from the right ones)"
