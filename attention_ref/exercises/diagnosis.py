"""What a wrong gradient looks like, in one sentence: used when no classic mistake of the
catalogue reproduces an attempt.

Each observation compares the attempt ``got`` with the true gradient ``truth`` of one output
on one set of inputs: shape and dtype first, then non-finite values, a constant ratio (and
which simple factor it is: sqrt(d_k), h, 2, -1, ...), a transpose, errors confined to masked
entries or to some indices of one axis (batch items, heads), and otherwise the size and place
of the largest error.
"""
from __future__ import annotations

import numpy as np

__all__ = ["as_gradient_array", "close", "close_or_same_nonfinite", "observe", "ratio", "RTOL", "ATOL"]

#: An output is right when ``max |got - truth| <= RTOL * max |truth| + ATOL`` (float64 inputs:
#: a correct attempt differs from the library by rounding, about 1e-15 of the largest entry).
RTOL, ATOL = 1e-8, 1e-12
_FLOAT32_RTOL = 1e-5  # what an attempt computed in float32 can reach
_SIMPLE = {"2": 2.0, "1/2": 0.5}


def as_gradient_array(g):
    """``g`` as a NumPy array, or None when it is None or cannot be one (ragged, objects)."""
    if g is None:
        return None
    try:
        arr = np.asarray(g)
    except (ValueError, TypeError):
        return None
    return arr if arr.dtype.kind in ("f", "i", "u") else None


def _tolerance(truth, rtol=RTOL) -> float:
    return rtol * (float(np.abs(truth).max()) if truth.size else 0.0) + ATOL


def close(got, truth, rtol=RTOL) -> bool:
    """Same shape, finite, and equal to ``truth`` within the tolerance."""
    got = as_gradient_array(got)
    if got is None or got.shape != truth.shape or not np.isfinite(got).all():
        return False
    return truth.size == 0 or float(np.abs(got - truth).max()) <= _tolerance(truth, rtol)


def close_or_same_nonfinite(got, truth, rtol=RTOL) -> bool:
    """Like :func:`close`, except that NaN and infinity count as equal where both have them (a
    mistake that overflows matches an attempt that overflows the same way, or further: where
    ``truth`` has NaN or infinity, ``got`` may have more, and the entries finite in ``got``
    must match)."""
    got, truth = as_gradient_array(got), as_gradient_array(truth)
    if got is None or truth is None or got.shape != truth.shape:
        return False
    bad_g, bad_t = ~np.isfinite(got), ~np.isfinite(truth)
    if not bad_t.any():
        return not bad_g.any() and close(got, truth, rtol)
    if (bad_t & ~bad_g).any():  # NaN where the mistake has it: an overflow spreads as far, or further
        return False  # (inf * 0 in a mask gives NaN where np.where gives 0: the same mistake)
    finite = ~bad_g
    return close(got[finite], truth[finite], rtol)


def _shape_sentence(name, got, truth, parameter, product=True):
    g, t = got.shape, truth.shape
    if len(g) >= 2 and g == t[:-2] + t[-2:][::-1]:
        if not product:  # a split or a merge only moves numbers: there is no product to swap
            return f"{name} has shape {g}, the transpose of the expected {t}: its last two axes are exchanged"
        return (f"{name} has shape {g}, the transpose of the expected {t}: swap the factors of the product"
                + (" (for a weight, x^T dy and not dy^T x)" if parameter else ""))
    if tuple(d for d in g if d != 1) == tuple(d for d in t if d != 1):
        return f"{name} has shape {g}, expected {t}: axes of size 1 too many or too few (keepdims, a [None])"
    if parameter and len(g) > len(t) and g[len(g) - len(t):] == t:
        return (f"{name} has shape {g}, expected {t}: sum over the leading axes {g[:len(g) - len(t)]}"
                " (every batch item contributes to the same parameter)")
    if got.size == truth.size:
        return f"{name} has shape {g}, expected {t}: the right number of entries in the wrong arrangement"
    return f"{name} has shape {g}, expected {t} (a gradient has the shape of what it differentiates)"


def ratio(got, truth):
    """The constant c with got = c * truth, or None."""
    denom = float(np.sum(truth * truth))
    if denom == 0.0:
        return None
    c = float(np.sum(got * truth)) / denom
    if float(np.abs(got - c * truth).max()) <= 1e-6 * float(np.abs(truth).max()) + ATOL:
        return c
    return None


def _confined(err, axis):
    """Indices along ``axis`` holding every error, when they are some but not all of them."""
    others = tuple(i for i in range(err.ndim) if i != axis)
    bad = np.flatnonzero(err.any(axis=others))
    return [int(i) for i in bad] if 0 < len(bad) < err.shape[axis] else None


def observe(name, got, truth, factors=None, masked=None, axis_names=None, parameter=False, product=True,
            float32_error=None) -> str:
    """One plain sentence describing how ``got`` differs from ``truth`` (``product``: whether the
    backward has a matrix product whose factors a transposed shape may come from;
    ``float32_error``: the relative error of the reference itself recomputed in float32, or
    None when it was not: an error is called float32's precision only when that reproduces it)."""
    arr = as_gradient_array(got)
    if truth is None:
        return f"{name} must be None (that parameter is absent), got {type(got).__name__}"
    if got is None:
        return f"{name} is None: every input gets a gradient"
    if arr is None:
        return f"{name} is not an array of numbers (got {type(got).__name__})"
    if arr.shape != truth.shape:
        return _shape_sentence(name, arr, truth, parameter, product)
    if not np.isfinite(arr).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
        return (f"{name} has NaN or infinity (first at index {where}): a 0/0 or an overflow"
                + ("; a blocked score must give exactly 0, never exp(-inf - (-inf))" if masked is not None else ""))
    err = np.abs(arr.astype(np.float64) - truth) > _tolerance(truth)
    if masked is not None and masked.shape == err.shape and masked.any() and err.any() and not (err & ~masked).any():
        return (f"{name} is right except at masked entries, where it must be 0: no gradient flows into a"
                " blocked score (its probability is exactly 0)")  # however small the error: never precision
    if arr.dtype != truth.dtype:
        if close(arr, truth, _FLOAT32_RTOL):
            return (f"{name} is right to {arr.dtype} precision but has dtype {arr.dtype}: compute in the"
                    f" inputs' dtype ({truth.dtype}); the check needs its digits")
        arr = arr.astype(truth.dtype)  # wrong beyond the precision: look at how
    elif close(arr, truth, _FLOAT32_RTOL):  # right to about 1e-5 but not to 1e-8: a small error
        rel = float(np.abs(arr - truth).max()) / max(float(np.abs(truth).max()), ATOL)
        if float32_error is not None and float32_error > 0 and float32_error / 10 <= rel <= 10 * float32_error:
            return (f"{name} agrees with the true gradient only to about {rel:.0e} relative, float32's"
                    f" precision (the reference computed in float32 is off by {float32_error:.0e}): part of the"
                    f" work is done in float32 (or cast through it); keep it in {truth.dtype}")
        known = "" if float32_error is None else \
            f", more than float32 rounding gives ({float32_error:.0e}, the reference computed in float32)"
        return (f"{name} is wrong by about {rel:.0e} relative{known}: a small term added or left out (an eps,"
                " a clip such as 1e-8, a constant)?")
    c = ratio(arr, truth)
    if c is not None:
        if abs(c + 1) <= 1e-6:
            return f"{name} has the wrong sign everywhere ({name} = -1 x the true gradient)"
        if abs(c) <= 1e-6:
            if not arr.any():
                return f"{name} is zero everywhere: this gradient is missing"
            return (f"{name} is zero up to rounding everywhere (largest entry {float(np.abs(arr).max()):.1g}): it"
                    " is computed, but its terms cancel (a sum along an axis where the summands add up to 0?)")
        labels = [label for label, value in {**(factors or {}), **_SIMPLE}.items()
                  if abs(c - value) <= 1e-6 * max(1.0, abs(value))]
        if labels:  # several names may fit one number (h = d_k = 2): all are listed
            return (f"{name} is {labels[0]} times the true gradient (ratio {c:.6g} = {' = '.join(labels)}"
                    f" here): a factor {labels[0]} is missing or extra")
        return f"{name} is a constant multiple of the true gradient (ratio {c:.6g}): a scale factor is wrong"
    if arr.ndim >= 2 and arr.shape[-1] == arr.shape[-2] and np.allclose(arr, truth.swapaxes(-1, -2),
                                                                        rtol=RTOL, atol=_tolerance(truth)):
        return f"{name} is the transpose of the true gradient: swap the last two axes (or the product's factors)"
    err = np.abs(arr - truth) > _tolerance(truth)
    if masked is not None and masked.shape == err.shape and masked.any() and not (err & ~masked).any():
        return (f"{name} is right except at masked entries, where it must be 0: no gradient flows into a"
                " blocked score (its probability is exactly 0)")
    labels = axis_names or {}
    zeros = (arr == 0) & (truth != 0) & err  # wrong because it is exactly 0 there
    if zeros.any() and not (err & ~zeros).any():
        for axis in range(arr.ndim):
            bad = _confined(err, axis)
            if bad is not None:
                what = labels.get(axis - arr.ndim, f"index along axis {axis}")
                return (f"{name} is exactly 0 at {what} {bad} of {arr.shape[axis]} and right elsewhere: that"
                        " part was never computed (a head, a tile or a batch item skipped by a loop or slice)")
        return (f"{name} is exactly 0 at {int(zeros.sum())} entries where the true gradient is not, and right"
                " elsewhere: a block of it was never computed (a tile skipped, or a range that stops short)")
    for axis in range(arr.ndim - 1):
        bad = _confined(err, axis)
        if bad is not None:
            what = labels.get(axis - arr.ndim, f"index along axis {axis}")
            good = [i for i in range(arr.shape[axis]) if i not in bad]
            where = f"wrong only at {what} {bad}" if len(bad) <= len(good) else f"right only at {what} {good}"
            return (f"{name} is {where} of {arr.shape[axis]}: look for a loop, slice or broadcast that treats"
                    " those indices differently")
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(np.abs(arr - truth))), arr.shape))
    err, big = float(np.abs(arr - truth).max()), float(np.abs(truth).max())
    return (f"{name} differs from the true gradient (largest error {err:.2g} at index {worst}, against a largest"
            f" entry of {big:.2g}) in a way none of the classic mistakes explains: compare your formula with the"
            " hints")
