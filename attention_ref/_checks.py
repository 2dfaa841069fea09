"""Input checks shared by every public function.

Every public forward validates its arguments here *before* any arithmetic, so a
user sees a message that names the argument and its shape instead of NumPy's
``matmul:`` or broadcasting message from deep inside a computation.

Dtype policy (one place, used everywhere):

* integer input is accepted and computed in float64;
* float32 stays float32, float64 stays float64 (the default everywhere);
* when arrays of different float widths meet, NumPy's ``result_type`` decides
  (float32 with float64 gives float64);
* booleans, strings, objects and complex numbers are rejected with ``TypeError``;
* NaN and +/-inf are rejected with ``ValueError`` (except ``-inf`` inside a
  float mask or a softmax input, where it means "weight exactly zero").
"""
from __future__ import annotations

import numpy as np

__all__ = []  # private module


def _describe(x) -> str:
    """One-line description of an argument for error messages."""
    if isinstance(x, np.ndarray):
        return f"array of dtype {x.dtype} and shape {x.shape}"
    return f"{type(x).__name__}"


def as_real_array(x, name: str, *, allow_neg_inf: bool = False) -> np.ndarray:
    """Return ``x`` as a real floating ndarray (no copy when it already is one).

    Raises ``TypeError`` for booleans, strings, objects and complex numbers and
    ``ValueError`` for NaN or infinity (``-inf`` allowed when ``allow_neg_inf``).
    """
    if x is None:
        raise TypeError(f"{name} must be an array of real numbers, got None")
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise TypeError(f"{name} must be an array of real numbers: {exc}") from None
    kind = arr.dtype.kind
    if kind == "b":
        raise TypeError(
            f"{name} must hold real numbers, got a boolean {_describe(arr)}"
            " (boolean arrays are masks: pass them as mask=)"
        )
    if kind in "iu":
        arr = arr.astype(np.float64)
    elif kind != "f":
        raise TypeError(f"{name} must hold real numbers, got {_describe(arr)}")
    if not np.isfinite(arr).all():
        if np.isnan(arr).any():
            raise ValueError(f"{name} contains NaN ({_describe(arr)})")
        if not allow_neg_inf or np.isposinf(arr).any():
            raise ValueError(f"{name} contains infinity ({_describe(arr)})")
    return arr


def common_dtype(*arrays) -> np.dtype:
    """The floating dtype the computation runs in (NumPy's promotion of the inputs)."""
    return np.result_type(*[a for a in arrays if a is not None])


def cast(x: np.ndarray | None, dtype) -> np.ndarray | None:
    """``x`` in ``dtype`` without a copy when it already is."""
    return None if x is None else x.astype(dtype, copy=False)


def require_ndim(x: np.ndarray, name: str, min_ndim: int, layout: str) -> None:
    """Raise ``ValueError`` unless ``x`` has at least ``min_ndim`` axes."""
    if x.ndim < min_ndim:
        raise ValueError(
            f"{name} must have shape {layout} (at least {min_ndim} axes), got shape {x.shape}"
        )


def broadcast_batch(names_shapes, what: str = "batch dimensions") -> tuple:
    """Broadcast the leading (batch) shapes of several arrays, or raise naming them all."""
    shapes = [s for _, s in names_shapes]
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        listing = ", ".join(f"{n} {s}" for n, s in names_shapes)
        raise ValueError(f"{what} do not broadcast: {listing}") from None


def check_positive_int(value, name: str) -> int:
    """Return ``value`` as an int, or raise if it is not a positive integer."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def as_mask(mask, name: str = "mask") -> np.ndarray | None:
    """Validate an attention mask: boolean (True = may attend) or float (added to scores).

    Integer masks are rejected: 0/1 integers are read as "keep" by some libraries and
    as "block" by others, so we ask for an explicit ``astype(bool)``.
    """
    if mask is None:
        return None
    arr = np.asarray(mask)
    kind = arr.dtype.kind
    if kind == "b":
        return arr
    if kind in "iu":
        raise TypeError(
            f"{name} must be boolean (True = may attend) or floating (added to the scores),"
            f" got an integer {_describe(arr)}; use {name}.astype(bool) for a keep-mask"
        )
    return as_real_array(arr, name, allow_neg_inf=True)


def cast_mask(mask: np.ndarray | None, dtype, name: str = "mask") -> np.ndarray | None:
    """A float mask in the computation's dtype; boolean masks are returned unchanged.

    Very negative values that fall below the dtype's range become ``-inf`` (blocked, as
    meant); positive values that overflow it are an error.
    """
    if mask is None or mask.dtype == bool:
        return mask
    with np.errstate(over="ignore"):
        out = mask.astype(dtype, copy=False)
    if np.isposinf(out).any():
        raise ValueError(f"{name} holds values too large for {np.dtype(dtype)} (largest {mask.max():g})")
    return out


def check_mask_shape(mask: np.ndarray | None, target: tuple, name: str = "mask") -> None:
    """Raise unless ``mask`` broadcasts to ``target`` (the scores' shape) without growing it."""
    if mask is None:
        return
    try:
        shape = np.broadcast_shapes(mask.shape, target)
    except ValueError:
        shape = None
    if shape != tuple(target):
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
