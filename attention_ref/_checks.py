"""Input checks shared by every public function.

Every public forward validates its arguments here *before* any arithmetic, so a
user sees a message that names the argument and its shape instead of NumPy's
``matmul:`` or broadcasting message from deep inside a computation.

Dtype policy (one place, used everywhere, upstream gradients included):

* integer input is accepted and computed in float64;
* float32 stays float32, float64 stays float64 (the default everywhere);
* when arrays of different float widths meet, NumPy's ``result_type`` decides
  (float32 with float64 gives float64);
* other floats (float16, longdouble), booleans, strings, objects and complex numbers
  are rejected with ``TypeError``;
* NaN and +/-inf are rejected with ``ValueError`` (except ``-inf`` inside a
  float mask or a softmax input, where it means "weight exactly zero").

Results too large for the dtype (attention scores ``q k^T / sqrt(d_k)`` of inputs near
1e19 in float32, 1e154 in float64; projections; linear attention's sums) raise
``FloatingPointError`` naming the inputs, the dtype and its largest finite value
(:func:`overflow_error`) instead of returning NaN with a NumPy ``RuntimeWarning``.
"""
from __future__ import annotations

import math
import os
import sys
import warnings
from numbers import Real

import numpy as np

__all__ = []  # private module

#: The floating types the library computes in (integers are computed in float64).
FLOAT_TYPES = (np.float32, np.float64)
FLOAT_DTYPES = tuple(np.dtype(t) for t in FLOAT_TYPES)  # native byte order, for dtype= arguments


def _is_float_of_policy(dtype: np.dtype) -> bool:
    """float32 or float64, in either byte order."""
    return dtype.kind == "f" and dtype.type in FLOAT_TYPES


def _describe(x) -> str:
    """One-line description of an argument for error messages."""
    if isinstance(x, np.ndarray):
        return f"array of dtype {x.dtype} and shape {x.shape}"
    return f"{type(x).__name__}"


def as_real_array(x, name: str, *, allow_neg_inf: bool = False,
                  bool_hint: str = " (boolean arrays are masks: pass them as mask=)") -> np.ndarray:
    """Return ``x`` as a real floating ndarray (no copy when it already is one).

    Raises ``TypeError`` for booleans, strings, objects, complex numbers and floats other
    than float32 and float64 (integers become float64), and ``ValueError`` for NaN or
    infinity (``-inf`` allowed when ``allow_neg_inf``).
    """
    if x is None:
        raise TypeError(f"{name} must be an array of real numbers, got None")
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"{name} must be an array of real numbers: {exc}") from None
    if arr.dtype.kind == "b":
        raise TypeError(f"{name} must hold real numbers, got a boolean {_describe(arr)}{bool_hint}")
    arr = _real_dtype(arr, name)
    if not all_finite(arr):
        if np.isnan(arr).any():
            raise ValueError(f"{name} contains NaN ({_describe(arr)})")
        if not allow_neg_inf or np.isposinf(arr).any():
            raise ValueError(f"{name} contains infinity ({_describe(arr)})")
    return arr


#: Fewest entries for which :func:`all_finite` reads a sum instead of an array of booleans.
_SUM_TEST_MIN = 1 << 14


def all_finite(arr: np.ndarray) -> bool:
    """Whether every entry of a float array is finite, exactly. From ``_SUM_TEST_MIN`` entries
    on it reads one sum and allocates nothing (``np.isfinite(arr).all()`` makes an array of
    booleans as large as ``arr``, a fresh allocation at every check): the sum is NaN or infinite
    whenever an entry is, and when a finite array's sum overflows the exact test settles it."""
    if arr.size < _SUM_TEST_MIN:
        return bool(np.isfinite(arr).all())
    with np.errstate(over="ignore", invalid="ignore"):  # an overflowing sum, or inf - inf: the exact test follows
        total = np.add.reduce(arr, axis=None)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return bool(np.isfinite(total)) or bool(np.isfinite(arr).all())


def _real_dtype(arr: np.ndarray, name: str) -> np.ndarray:
    """``arr`` in a dtype of the policy: float32 or float64 as it is, integers in float64."""
    kind = arr.dtype.kind
    if kind in "iu":
        return arr.astype(np.float64)
    if kind != "f":
        raise TypeError(f"{name} must hold real numbers, got {_describe(arr)}")
    if not _is_float_of_policy(arr.dtype):
        lossless = "np.float32" if arr.dtype.itemsize <= 4 else "np.float64"
        raise TypeError(
            f"{name} must be float32 or float64 (integers are computed in float64), got"
            f" {_describe(arr)}; convert it with {name}.astype({lossless})"
        )
    return arr


def check_float_dtype(dtype, name: str = "dtype") -> np.dtype:
    """A ``dtype=`` argument as a NumPy dtype, or ``TypeError`` unless float32 or float64."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{name} must be a floating dtype, float32 or float64, got {dtype!r}") from None
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating dtype, float32 or float64, got {dtype}")
    return dtype


def common_dtype(*arrays) -> np.dtype:
    """The floating dtype the computation runs in (NumPy's promotion of the inputs)."""
    return np.result_type(*[a for a in arrays if a is not None])


def cast(x: np.ndarray | None, dtype) -> np.ndarray | None:
    """``x`` in ``dtype`` without a copy when it already is."""
    return None if x is None else x.astype(dtype, copy=False)


def require_ndim(x: np.ndarray, name: str, min_ndim: int, layout: str) -> None:
    """Raise ``ValueError`` unless ``x`` has at least ``min_ndim`` axes."""
    if x.ndim < min_ndim:
        axes = "axis" if min_ndim == 1 else "axes"
        raise ValueError(f"{name} must have shape {layout} (at least {min_ndim} {axes}), got shape {x.shape}")


def signals_land_here() -> None:
    """The last line of an ``np.errstate`` block with no check to end it: a Ctrl-C that came
    during the block's NumPy operations is raised here, inside the block, so the block's exit
    still restores NumPy's error settings (see ``attention_ref._pair_checks``)."""


def broadcasts_into(shape: tuple, target: tuple) -> bool:
    """Whether an array of ``shape`` broadcasts to ``target`` without growing it."""
    try:
        return np.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except ValueError:
        return False


def check_positions_for(positions: np.ndarray, x_shape: tuple, name: str = "positions") -> None:
    """Positions against the vectors they rotate, ``x`` of shape (..., n, d): ``positions`` is
    (n,) (or (1,), or either behind size-1 axes), or has as many axes as ``x.shape[:-1]`` with size-1
    axes broadcasting. Any other shape is refused, naming the shape expected: (B, n) against x
    (B, H, n, d) would broadcast with B read as H when B == H, so it is refused and
    ``positions[:, None, :]`` suggested."""
    lead = tuple(x_shape[:-1])
    shape = tuple(positions.shape)
    if 1 <= len(shape) <= len(lead) and shape[-1] in (1, lead[-1]) and all(s == 1 for s in shape[:-1]):
        return  # (n,), or (n,) behind size-1 axes such as (1, n): the same positions for every vector
    if len(shape) == len(lead) and all(s in (1, t) for s, t in zip(shape, lead)):
        return
    hint = ""
    if 2 <= len(shape) < len(lead) and shape[-1] in (1, lead[-1]):
        index = ", ".join([":"] * (len(shape) - 1) + ["None"] * (len(lead) - len(shape)) + [":"])
        hint = f" (per batch row: {name}[{index}])"
    axes = f" or {len(lead)} axes matching {lead}, size-1 axes broadcasting" if len(lead) > 1 else ""
    raise ValueError(f"{name} of shape {shape} does not fit x of shape {tuple(x_shape)}: expected"
                     f" ({lead[-1]},){axes}{hint}")


def broadcast_batch(names_shapes, what: str = "batch dimensions") -> tuple:
    """Broadcast the leading (batch) shapes of several arrays, or raise naming them all."""
    shapes = [s for _, s in names_shapes]
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        listing = ", ".join(f"{n} {s}" for n, s in names_shapes)
        raise ValueError(f"{what} do not broadcast: {listing}") from None


def check_positive_real(value, name: str, what: str = "a positive real number") -> float:
    """Return ``value`` as a float, or raise naming it unless it is a finite real number > 0
    (booleans are not numbers here)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Real):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be {what}, got {value}")
    return float(value)


def check_positive_int(value, name: str, minimum: int = 1) -> int:
    """Return ``value`` as an int, or raise if it is not an integer >= ``minimum`` (1: positive)."""
    kind = "positive" if minimum == 1 else "non-negative" if minimum == 0 else f">= {minimum}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a {kind} integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be a {kind} integer, got {value}")
    return int(value)


def check_nonnegative_int(value, name: str) -> int:
    """Return ``value`` as an int, or raise if it is not an integer >= 0 (a length may be 0)."""
    return check_positive_int(value, name, minimum=0)


def as_generator(seed, name: str = "seed") -> np.random.Generator:
    """The ``numpy.random.Generator`` of ``seed``: None (fresh entropy), an integer >= 0, or a
    Generator, used as it is (its state advances), as SPEC 7 of the scientific Python ecosystem
    asks; anything else is refused naming ``name``. Every function that draws calls this."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None:
        return np.random.default_rng()
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be None, an integer >= 0 or a numpy.random.Generator, got {seed!r}")
    if seed < 0:
        raise ValueError(f"{name} must be None, an integer >= 0 or a numpy.random.Generator, got {seed}")
    return np.random.default_rng(int(seed))


def as_mask(mask, name: str = "mask", *, warn: bool = True) -> np.ndarray | None:
    """Validate an attention mask: boolean (True = may attend) or float (added to scores).

    The one place every mask is normalised (the blockwise path, which reads its mask tile
    by tile, calls the same :func:`check_mask_dtype` and :func:`warn_if_keep_mask`).
    Integer masks are rejected: 0/1 integers are read as "keep" by some libraries and
    as "block" by others, so we ask for an explicit ``astype(bool)``. A float mask of
    only 0s and 1s gets a ``UserWarning`` (see :func:`warn_if_keep_mask`) unless ``warn``
    is False (for a mask its caller has validated, and warned about, already).
    """
    if mask is None:
        return None
    try:
        arr = np.asarray(mask)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"{name} must be a boolean or floating array: {exc}") from None
    arr = check_mask_dtype(arr, name)
    if arr.dtype == bool:
        return arr
    # one pass, no copy: NaN propagates to the maximum, +inf is the maximum, -inf (blocked) is allowed
    mask_max = arr.max(initial=-np.inf)
    if np.isnan(mask_max):
        raise ValueError(f"{name} contains NaN ({_describe(arr)})")
    if mask_max == np.inf:
        raise ValueError(f"{name} contains infinity ({_describe(arr)})")
    if warn:
        warn_if_keep_mask(arr, name, mask_max)
    return arr


def check_mask_dtype(arr: np.ndarray, name: str = "mask") -> np.ndarray:
    """A mask's dtype: boolean, float32 or float64, else ``TypeError`` (integers: say ``astype(bool)``)."""
    kind = arr.dtype.kind
    if kind == "b":
        return arr
    if kind in "iu":
        raise TypeError(
            f"{name} must be boolean (True = may attend) or floating (added to the scores),"
            f" got an integer {_describe(arr)}; use {name}.astype(bool) for a keep-mask"
        )
    if not _is_float_of_policy(arr.dtype):
        raise TypeError(
            f"{name} must be boolean (True = may attend) or float32/float64 (added to the scores),"
            f" got {_describe(arr)}"
        )
    return arr


def warn_if_keep_mask(mask: np.ndarray, name: str, mask_max) -> None:
    """``UserWarning`` when a float mask holds only 0s and 1s, with at least one 1.

    That is almost always a boolean keep-mask cast to float (``causal_mask(n).astype(float)``):
    added to the scores it raises the allowed keys by 1 and blocks nothing, so future
    tokens get through. ``mask_max`` is the mask's maximum (the callers have it already),
    so the usual additive masks (0 and -inf, or 0 and a large negative number) cost nothing.
    """
    if mask_max != 1 or mask.min() < 0 or not ((mask == 0) | (mask == 1)).all():
        return
    warnings.warn(
        f"{name} is a float mask of 0s and 1s: float masks are ADDED to the scaled scores, so"
        " it adds 1 where it holds 1 and blocks nothing. For a keep-mask (1 = may attend) pass"
        f" {name}.astype(bool); for an additive mask use 0 and -inf (mask_to_additive)",
        UserWarning, stacklevel=_caller_stacklevel())


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside this package."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep  # attention_ref/ and its subfolders
    frame, level = sys._getframe(1), 1  # the frame that calls warnings.warn is level 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def cast_mask(mask: np.ndarray | None, dtype, name: str = "mask") -> np.ndarray | None:
    """A float mask in the computation's dtype; boolean masks are returned unchanged.

    Very negative values that fall below the dtype's range become ``-inf`` (blocked, as
    meant); positive values that overflow it are an error.
    """
    if mask is None or mask.dtype == bool:
        return mask
    with np.errstate(over="ignore"):
        out = mask.astype(dtype, copy=False)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    if np.isposinf(out).any():
        raise ValueError(f"{name} holds values too large for {np.dtype(dtype)} (largest {mask.max():g})")
    return out


def check_mask_shape(mask: np.ndarray | None, target: tuple, name: str = "mask") -> None:
    """Raise unless ``mask`` broadcasts to ``target`` (the scores' shape) without growing it."""
    if mask is None:
        return
    if not broadcasts_into(mask.shape, target):
        raise ValueError(
            f"{name} of shape {mask.shape} does not broadcast to the attention scores'"
            f" shape {tuple(target)} (..., n_q, n_k)"
        )


def unbroadcast(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum ``grad`` over the axes that broadcasting added or stretched, giving ``shape``."""
    if grad.shape == tuple(shape):
        return grad
    extra = grad.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(
        extra + i for i, n in enumerate(shape) if n == 1 and grad.shape[extra + i] != 1
    )
    return grad.sum(axis=axes).reshape(shape)


def as_gradient(grad, name: str = "dout") -> np.ndarray:
    """An upstream gradient under the inputs' rules: real (float32, float64 or integer) and finite."""
    return as_real_array(grad, name, bool_hint="")  # a boolean gradient is no mask in disguise


def as_upstream(grad, shape: tuple, dtype, name: str = "dout") -> np.ndarray:
    """An upstream gradient checked against the forward output's shape, in its dtype.

    Every public backward starts here: ``ValueError`` for a shape other than the
    forward output's (both shapes in the message) or for NaN / infinity, ``TypeError``
    for a dtype outside the policy (booleans, strings, objects, complex, float16).
    """
    grad = as_gradient(grad, name)
    if grad.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (the forward output's), got {grad.shape}")
    return grad.astype(dtype, copy=False)


#: Headroom for rounding when a bound decides that a product cannot overflow: sums of
#: d terms are rounded d times, so stay a factor 2 below the dtype's largest finite value.
OVERFLOW_HEADROOM = 2.0


def _abs_max(x: np.ndarray) -> float:
    """``max |x|`` as a Python float (0 for an empty array), without an ``abs`` copy."""
    if not x.size:
        return 0.0
    return max(float(x.max()), -float(x.min()))


def scores_may_overflow(q: np.ndarray, k: np.ndarray, scale: float) -> bool:
    """Whether ``q k^T * scale`` could overflow q's dtype: False for all but huge inputs.

    ``|q_i . k_j| <= d_k max|q| max|k|`` (each of the d_k terms is at most
    ``max|q| max|k|``), so two reductions over q and k decide it without a pass over the
    (n_q, n_k) scores; the bound is computed in Python floats, which cannot overflow
    silently into a wrong answer (they become ``inf``, which compares as too large).
    """
    bound = q.shape[-1] * scale * _abs_max(q) * _abs_max(k)
    return not OVERFLOW_HEADROOM * bound <= float(np.finfo(q.dtype).max)  # NaN: check the scores


def overflow_error(what: str, dtype, inputs) -> FloatingPointError:
    """The error for a result that overflows ``dtype``; ``inputs`` is ``[(name, array), ...]``."""
    dtype = np.dtype(dtype)
    sizes = ", ".join(f"largest |{name}| = {_abs_max(np.asarray(a)):.3g}" for name, a in inputs)
    fix = " or compute in float64" if dtype == np.float32 else ""
    return FloatingPointError(
        f"overflow in {what}: the result exceeds the largest finite {dtype}, {np.finfo(dtype).max:.4g}"
        f" ({sizes}); scale the inputs down{fix}"
    )
