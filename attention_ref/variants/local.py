"""Local (sliding-window) attention masks, the band of document 000's local window.

Symbols: Nq queries, Nk keys, W the window radius.

Definition used everywhere in the library (this function and the ``window=`` option of
:func:`attention_ref.flash_attention_forward`): query ``i`` sits at position
``p_i = i + (Nk - Nq)``, so that when ``Nk > Nq`` the queries are the *last* ``Nq``
positions, as in :func:`attention_ref.causal_mask`. Query ``i`` may attend key ``j`` when

* ``|p_i - j| <= window``             (symmetric window, ``causal=False``), or
* ``p_i - window <= j <= p_i``         (``causal=True``: the window and no peeking ahead).

So every query sees at most ``2 * window + 1`` keys (``window + 1`` when causal), and
``window = 0`` lets a query see only the key at its own position. This is Longformer's
sliding window (document 001) with a one-sided width of ``window``.
"""
from __future__ import annotations

import numpy as np

from .._checks import check_nonnegative_int

__all__ = ["local_window_mask", "check_window"]


def check_window(window, name: str = "window") -> int:
    """Return ``window`` as an int, or raise unless it is a non-negative integer."""
    if isinstance(window, (bool, np.bool_)) or not isinstance(window, (int, np.integer)):
        raise TypeError(f"{name} must be a non-negative integer, got {window!r}")
    if window < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {window}")
    return int(window)


def local_window_mask(n: int, window: int, n_k: int | None = None, *, causal: bool = False) -> np.ndarray:
    """Boolean band mask: query ``i`` may attend key ``j`` when ``|p_i - j| <= window``.

    Parameters
    ----------
    n : number of queries (and keys, unless ``n_k`` is given); 0 gives an empty mask
    window : non-negative int, the largest allowed distance ``|p_i - j|``
    n_k : number of keys; the queries are the last ``n`` positions, ``p_i = i + n_k - n``
    causal : also forbid keys in the future (``j > p_i``)

    Returns
    -------
    mask : bool array (n, n_k), True = may attend; for ``n_k = n`` row ``i`` is True on
        ``max(0, i - window) <= j <= min(n - 1, i + window)`` (``<= i`` when causal)
    """
    n = check_nonnegative_int(n, "n")
    n_k = n if n_k is None else check_nonnegative_int(n_k, "n_k")
    window = check_window(window)
    position = np.arange(n)[:, None] + (n_k - n)  # (Nq, 1), p_i
    key = np.arange(n_k)[None, :]  # (1, Nk), j
    mask = np.abs(position - key) <= window  # (Nq, Nk)
    if causal:
        mask &= key <= position
    return mask
