"""Check any hand-written (forward, backward) pair against finite differences.

For a forward ``out, cache = forward(*inputs)`` and a random upstream gradient ``dout``,
the scalar ``L = sum(out * dout)`` has gradient ``backward(dout, cache)`` with respect to
each input. :func:`gradcheck` estimates the same gradient entry by entry with central
differences, ``(L(x + eps e_i) - L(x - eps e_i)) / (2 eps)``, in float64, and reports the
worst disagreement per input.

An entry passes when ``|analytic - numerical| <= atol + rtol * scale``, where ``scale`` is
the largest gradient entry of that input (numerical or analytic). Relative error is
measured against that largest entry, not entry by entry, because entry-wise relative
error is meaningless for gradients that are exactly zero (the key bias ``b_k`` of
attention, for example, whose gradient is zero up to rounding).

Every call of the pair gets its own copies: each ``forward`` call fresh copies of the inputs,
the ``backward`` a copy of ``dout`` and a deep copy of the cache. The finite differences use
the originals, so a pair that writes into what it is given cannot change the verdict's
numbers; and the write itself fails the check, named: "backward wrote into dout".
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ._checks import as_generator

__all__ = ["GradcheckError", "GradcheckReport", "GradcheckRow", "gradcheck", "numerical_gradient"]


class GradcheckError(AssertionError):
    """Raised by :meth:`GradcheckReport.raise_if_failed`; the message is the report's table."""


@dataclass(frozen=True)
class GradcheckRow:
    """The comparison for one differentiable input (or one entry of a dict input)."""

    name: str
    shape: tuple
    ok: bool
    max_abs_err: float = np.nan
    rel_err: float = np.nan  # max_abs_err / scale; nan when the gradient is ~zero
    scale: float = np.nan  # largest |gradient| entry of this input
    worst_index: tuple | None = None
    message: str = ""  # why it failed when there are no numbers to compare


@dataclass(frozen=True)
class GradcheckReport:
    """Result of :func:`gradcheck`: ``.ok``, ``.rows``, a table when printed."""

    rows: tuple
    atol: float
    rtol: float
    eps: float
    errors: tuple = field(default=())  # problems not tied to one input

    @property
    def ok(self) -> bool:
        return not self.errors and all(r.ok for r in self.rows)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = f"{'input':<16} {'shape':<16} {'max|grad|':>10} {'max abs err':>11} {'rel err':>9}  {'worst index':<14} status"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            if r.message:
                lines.append(f"{r.name:<16} {str(r.shape):<16} FAIL: {r.message}")
                continue
            rel = "-" if np.isnan(r.rel_err) else f"{r.rel_err:.1e}"
            # where a passing input's largest error sits is rounding noise (it moves with the
            # BLAS and the CPU): the position is shown only where it points at a mistake
            worst = str(r.worst_index) if not r.ok else "-"
            lines.append(
                f"{r.name:<16} {str(r.shape):<16} {r.scale:>10.3g} {r.max_abs_err:>11.1e} {rel:>9}"
                f"  {worst:<14} {'ok' if r.ok else 'FAIL'}"
            )
        lines.extend(f"FAIL: {e}" for e in self.errors)
        lines.append(f"(pass: abs err <= {self.atol:g} + {self.rtol:g} * max|grad|; eps = {self.eps:g};"
                     " rel err '-' means the gradient is zero to within atol;"
                     " worst index is shown for failing inputs)")
        return "\n".join(lines)

    def raise_if_failed(self) -> None:
        """Raise :class:`GradcheckError` with the table unless every input passed."""
        if not self.ok:
            raise GradcheckError("gradient check failed\n" + str(self))


def numerical_gradient(f, x, eps: float = 1e-6) -> np.ndarray:
    """Central-difference gradient of a scalar function ``f`` at ``x``, in float64.

    ``grad_i = (f(x + eps e_i) - f(x - eps e_i)) / (2 eps)``. ``f`` receives a float64
    copy of ``x`` (perturbed one entry at a time); the caller's ``x`` is never touched.

    Parameters
    ----------
    f : callable taking an array shaped like ``x`` and returning a real scalar
    x : array
    eps : step size

    Returns
    -------
    grad : float64 array shaped like ``x``
    """
    x = np.array(x, dtype=np.float64, order="C")  # a private copy we may perturb (C order: ravel below is a view)
    grad = np.zeros_like(x)
    flat, gflat = x.ravel(), grad.ravel()  # views (both fresh and C-contiguous, whatever x's layout), one entry per position
    for i in range(flat.size):
        orig = flat[i]
        flat[i] = orig + eps
        f_plus = float(f(x))
        flat[i] = orig - eps
        f_minus = float(f(x))
        flat[i] = orig
        gflat[i] = (f_plus - f_minus) / (2 * eps)
    return grad


def _is_differentiable(x) -> bool:
    """Floating arrays and dicts of floating arrays get gradients; nothing else does."""
    if isinstance(x, Mapping):
        return len(x) > 0 and all(
            v is None or (isinstance(v, np.ndarray) and v.dtype.kind == "f") for v in x.values()
        )
    return isinstance(x, np.ndarray) and x.dtype.kind == "f"


def _private_copy(x):
    """A float64 copy of a differentiable input: an array, or each array of a dict."""
    if isinstance(x, Mapping):
        return {k: None if v is None else np.array(v, dtype=np.float64) for k, v in x.items()}
    return np.array(x, dtype=np.float64)


def first_write(after, before, path, depth=0):
    """The first place where ``after`` (a copy handed to a function, after the call) no longer
    holds ``before``'s numbers, as a path such as ``cache.y`` or ``cache.attention.q``; None
    when nothing was written into. Arrays, tuples (named or not), lists, dicts, dataclasses
    and plain objects are walked; anything else cannot be written into by a backward."""
    if depth > 20:
        return None
    if isinstance(before, np.ndarray):
        if not isinstance(after, np.ndarray) or after.shape != before.shape or after.dtype != before.dtype:
            return path
        same = np.array_equal(after, before, equal_nan=before.dtype.kind in "fc")
        return None if same else path
    if isinstance(before, (tuple, list)):
        if type(after) is not type(before) or len(after) != len(before):
            return path
        names = getattr(before, "_fields", None) or [f"[{i}]" for i in range(len(before))]
        for name, x, y in zip(names, after, before):
            found = first_write(x, y, path + name if name.startswith("[") else f"{path}.{name}", depth + 1)
            if found:
                return found
        return None
    if isinstance(before, Mapping):
        if not isinstance(after, Mapping) or list(after.keys()) != list(before.keys()):
            return path
        for key in before:
            found = first_write(after[key], before[key], f"{path}[{key!r}]", depth + 1)
            if found:
                return found
        return None
    if dataclasses.is_dataclass(before) and not isinstance(before, type):
        for f in dataclasses.fields(before):
            found = first_write(getattr(after, f.name, None), getattr(before, f.name), f"{path}.{f.name}",
                                 depth + 1)
            if found:
                return found
        return None
    if type(before).__module__.split(".")[0] not in ("builtins", "numpy") and hasattr(before, "__dict__") \
            and not callable(before) and not inspect.ismodule(before):
        for name, value in vars(before).items():
            found = first_write(getattr(after, name, None), value, f"{path}.{name}", depth + 1)
            if found:
                return found
        return None
    return None  # numbers, strings, None, functions: nothing a backward could write into


def parameter_names(fn, count):
    """The first ``count`` positional parameter names of ``fn``; None when it has no such
    signature (a builtin, ``*args``)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return positional[:count] if len(positional) >= count else None


def _wrote(who, path) -> str:
    return (f"{who} wrote into {path}; a {who} must not change its arguments (compute into new arrays:"
            " no +=, *=, [...] = or out=)")


def _compare(name, analytic, numerical, atol, rtol) -> GradcheckRow:
    """One row of the report."""
    shape = numerical.shape
    if analytic is None:
        return GradcheckRow(name, shape, False, message="missing gradient (backward returned None)")
    try:
        analytic = np.asarray(analytic)
    except ValueError as exc:  # ragged nested lists
        return GradcheckRow(name, shape, False, message=f"gradient is not an array: {exc}")
    if analytic.dtype.kind not in ("f", "i", "u"):  # float, signed or unsigned integer
        return GradcheckRow(name, shape, False, message=f"gradient has dtype {analytic.dtype}")
    if analytic.shape != shape:
        return GradcheckRow(name, shape, False,
                            message=f"gradient has shape {analytic.shape}, expected {shape}")
    if numerical.size == 0:
        return GradcheckRow(name, shape, True, 0.0, np.nan, 0.0)  # no worst index
    diff = np.abs(analytic - numerical)  # float64: numerical is
    worst = np.unravel_index(int(np.argmax(diff)), shape)
    max_abs = float(diff[worst])
    scale = float(max(np.abs(numerical).max(), np.abs(analytic).max()))
    ok = bool(np.isfinite(max_abs)) and max_abs <= atol + rtol * scale
    rel = max_abs / scale if scale > atol else np.nan
    return GradcheckRow(name, shape, ok, max_abs, rel, scale, tuple(int(i) for i in worst))


def _out_and_cache(result):
    """Unpack ``forward``'s ``(out, cache)``; a clear TypeError for anything else."""
    if isinstance(result, tuple) and len(result) == 2:
        out, cache = result
        if isinstance(out, np.ndarray) or np.isscalar(out):
            return out, cache
        got = f"a tuple whose first entry is a {type(out).__name__}, not an array"
    elif isinstance(result, tuple):
        got = f"a tuple of length {len(result)}"
    elif isinstance(result, np.ndarray):
        got = f"a bare array of shape {result.shape}"
    else:
        got = f"a {type(result).__name__}"
    raise TypeError(f"gradcheck: forward must return a tuple (out, cache), got {got}; wrap a function "
                    "that returns only the output as `lambda *a: (f(*a), None)` with a backward that "
                    "ignores the cache")


def gradcheck(forward, backward, *inputs, eps=1e-6, atol=1e-5, rtol=1e-3, seed=0,
              names=None) -> GradcheckReport:
    """Compare ``backward`` with central finite differences of ``forward``, in float64.

    Parameters
    ----------
    forward : callable, ``forward(*inputs) -> (out, cache)``
    backward : callable, ``backward(dout, cache)`` returning one gradient per
        differentiable input, in order: a bare array when there is one such input, a
        tuple otherwise; a dict input gets a dict gradient with the same keys. Extra
        trailing ``None`` entries are ignored (``linear_backward`` returns ``db = None``).
    *inputs : the differentiable inputs are the leading floating-point arrays and dicts of
        them; the first input that is neither (``num_heads``, a boolean mask, ``None``)
        and everything after it are passed through unchanged and get no gradient. Wrap a
        float input you do not want checked (such as a float mask) in a closure.
    eps : finite-difference step
    atol, rtol : an input passes when ``max |analytic - numerical| <= atol + rtol * scale``,
        with ``scale`` its largest gradient entry
    seed : seed of the random upstream gradient ``dout``
    names : optional names for the differentiable inputs in the table

    Returns
    -------
    GradcheckReport; ``.ok`` is True when every input passed, ``str(report)`` is the
    table and ``report.raise_if_failed()`` raises :class:`GradcheckError` with it.

    Raises
    ------
    TypeError : no differentiable input, or ``forward`` returned something other than a
        tuple ``(out, cache)`` (a bare array, a tuple of another length); never a false FAIL.

    Every input is copied to float64 before use, so the caller's arrays are never modified,
    and each input is perturbed on its own even when one array object was passed for
    several inputs (self-attention passes ``x`` as query, key and value). Each call of
    ``forward`` gets fresh copies of the inputs and ``backward`` gets a copy of ``dout`` and a
    deep copy of the cache; a write into any of them is a failure of its own, named in
    ``report.errors`` with the function's own argument name ("backward wrote into dy",
    "backward wrote into cache.y", "forward wrote into x").
    """
    n_diff = 0
    while n_diff < len(inputs) and _is_differentiable(inputs[n_diff]):
        n_diff += 1
    if n_diff == 0:
        raise TypeError("gradcheck needs at least one leading floating-point array (or dict of them)")
    names = list(names) if names is not None else [f"input {i}" for i in range(n_diff)]
    # float64 copies of the differentiable inputs; the rest keep their types (copied arrays).
    # base is never handed to anyone: each forward call gets its own copies of it
    base = [_private_copy(x) if i < n_diff else
            (np.array(x) if isinstance(x, np.ndarray) else x) for i, x in enumerate(inputs)]
    errors = []

    given = copy.deepcopy(base)
    out, cache = _out_and_cache(forward(*given))
    arg_names = parameter_names(forward, len(base)) or [
        names[i] if i < n_diff else f"input {i}" for i in range(len(base))]
    for i, (after, before) in enumerate(zip(given, base)):
        place = first_write(after, before, arg_names[i])
        if place:
            errors.append(_wrote("forward", place))
            break
    dout = as_generator(seed).standard_normal(np.shape(out))
    their_dout, their_cache = dout.copy(), copy.deepcopy(cache)  # dout and cache stay ours
    analytic = backward(their_dout, their_cache)
    dout_name, cache_name = parameter_names(backward, 2) or ("dout", "cache")
    place = first_write(their_dout, dout, dout_name) or first_write(their_cache, cache, cache_name)
    if place:
        errors.append(_wrote("backward", place))
    analytic = tuple(analytic) if isinstance(analytic, (tuple, list)) else (analytic,)  # one bare gradient
    if len(analytic) < n_diff:
        errors.append(f"backward returned {len(analytic)} gradients for {n_diff} differentiable inputs")
    elif any(g is not None for g in analytic[n_diff:]):
        errors.append(f"backward returned {len(analytic)} gradients for {n_diff} differentiable inputs"
                      " (extra entries that are not None)")

    def loss_with(position, key=None):
        """L as a function of one input (or one dict entry), the others fixed."""
        def f(x):
            args = copy.deepcopy(base)  # fresh copies for each call: a forward may write into them
            args[position] = x.copy() if key is None else {**args[position], key: x.copy()}
            out_x, _ = _out_and_cache(forward(*args))
            return float(np.sum(np.asarray(out_x) * dout))  # float64: dout is
        return f

    rows = []
    for i in range(n_diff):
        x, g = base[i], analytic[i] if i < len(analytic) else None
        if isinstance(x, Mapping):
            if g is not None and not isinstance(g, Mapping):
                rows.append(GradcheckRow(names[i], (), False,
                                         message=f"expected a dict gradient, got {type(g).__name__}"))
                continue
            for key, value in x.items():
                if value is None:
                    continue
                num = numerical_gradient(loss_with(i, key), value, eps)
                rows.append(_compare(f"{names[i]}[{key}]", None if g is None else g.get(key),
                                     num, atol, rtol))
        else:
            num = numerical_gradient(loss_with(i), x, eps)
            rows.append(_compare(names[i], g, num, atol, rtol))
    return GradcheckReport(tuple(rows), atol, rtol, eps, tuple(errors))
