"""RoPE's frequencies with the scalings of Llama 3.x (``llama3``) and of ``linear`` RoPE, and the
rotation by them (a forward/backward pair).

Plain RoPE (:mod:`attention_ref.variants.rope`) rotates feature pair ``i`` of a vector at position
``p`` by ``p theta_i``, ``theta_i = base^(-2i / d)``, ``i = 0 .. d/2 - 1``. A model trained on
short texts and then used on longer ones sees angles it never saw for the slow pairs; the
scalings slow those pairs down (transformers' ``ROPE_INIT_FUNCTIONS``, both with attention
factor 1, so cos and sin are not rescaled):

* ``linear`` (``factor``): ``theta_i / factor`` for every pair (position interpolation).
* ``llama3`` (``factor``, ``low_freq_factor``, ``high_freq_factor``,
  ``original_max_position_embeddings`` = L): with the wavelength ``lambda_i = 2 pi / theta_i``,

  - ``lambda_i < L / high_freq_factor`` (fast pairs): ``theta_i`` unchanged;
  - ``lambda_i > L / low_freq_factor`` (slow pairs): ``theta_i / factor``;
  - in between: ``(1 - s) theta_i / factor + s theta_i`` with
    ``s = (L / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``.

Other types (``dynamic``, ``yarn``, ``longrope``, ...) are refused by name, never computed
otherwise. A ``partial_rotary_factor`` in the parameters rotates the first
``int(dim * partial_rotary_factor)`` features only, as transformers computes its frequencies
(:mod:`attention_ref.nn.partial_rotary` applies it).

The rotation ``y = R(p) x`` is orthogonal whatever the frequencies, so its backward is
``dx = R(p)^T dy`` (RoPE's). Symbols: ``...`` batch axes, N positions, D feature width.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from .._checks import as_real_array, check_positions_for, check_positive_int, check_positive_real, require_ndim
from ..variants.rope import ROPE_LAYOUTS, RopeCache, rotate, rope_backward

__all__ = ["ROPE_TYPES", "rope_frequencies", "scaled_rope_forward", "scaled_rope_backward"]

#: the RoPE types computed here; transformers' others are refused by name
ROPE_TYPES = ("default", "linear", "llama3")
_KEYS = {"default": (), "linear": ("factor",),
         "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
_OPTIONAL = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


def _check_scaling(scaling, base):
    """The RoPE type, its parameters, the base and the rotated fraction from a config's
    ``rope_scaling`` / ``rope_parameters`` mapping (None: default RoPE)."""
    if scaling is None:
        scaling = {}
    if not isinstance(scaling, Mapping):
        raise TypeError(f"scaling must be None or a mapping such as a config's rope_scaling, got"
                        f" {type(scaling).__name__}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"RoPE type {rope_type!r} is not implemented (only {', '.join(ROPE_TYPES)});"
                         " it is refused rather than computed as another type")
    unknown = sorted(set(scaling) - set(_KEYS[rope_type]) - set(_OPTIONAL))
    if unknown:
        raise ValueError(f"scaling has {unknown}, which RoPE type {rope_type!r} does not use here; it is refused"
                         " rather than ignored")
    missing = [key for key in _KEYS[rope_type] if key not in scaling]
    if missing:
        raise ValueError(f"RoPE type {rope_type!r} needs scaling[{missing[0]!r}], which is missing")
    params = {key: check_positive_real(scaling[key], f"scaling[{key!r}]") for key in _KEYS[rope_type]}
    if rope_type == "llama3" and not params["high_freq_factor"] > params["low_freq_factor"]:
        raise ValueError(f"scaling['high_freq_factor'] = {params['high_freq_factor']} must be larger than"
                         f" scaling['low_freq_factor'] = {params['low_freq_factor']}")
    if "rope_theta" in scaling:
        theta = check_positive_real(scaling["rope_theta"], "scaling['rope_theta']")
        if base is not None and check_positive_real(base, "base") != theta:
            raise ValueError(f"base = {base} and scaling['rope_theta'] = {theta} disagree: give one of them")
        base = theta
    base = 10000.0 if base is None else check_positive_real(base, "base")
    fraction = scaling.get("partial_rotary_factor", 1.0)
    fraction = check_positive_real(fraction, "scaling['partial_rotary_factor']")
    if fraction > 1:
        raise ValueError(f"scaling['partial_rotary_factor'] must lie in (0, 1], got {fraction}")
    return rope_type, params, base, fraction


def rope_frequencies(dim, base=None, scaling=None) -> np.ndarray:
    """The angular frequencies ``theta_i`` of the rotated pairs, float64 (transformers' ``inv_freq``).

    Parameters
    ----------
    dim : positive int, the head width; the rotated width is ``r = int(dim * partial_rotary_factor)``
        (even), ``dim`` itself without that key
    base : positive float (``rope_theta``); None: ``scaling['rope_theta']`` or 10000
    scaling : None (default RoPE) or a mapping as a config's ``rope_scaling`` (transformers 4.x) or
        ``rope_parameters`` (5.x): ``rope_type`` (or ``type``) one of :data:`ROPE_TYPES` with its
        parameters, optionally ``rope_theta`` and ``partial_rotary_factor``

    Returns
    -------
    theta : float64 array (r/2,), ``base^(-2i / r)`` scaled as the module docstring says
    """
    dim = check_positive_int(dim, "dim")
    rope_type, params, base, fraction = _check_scaling(scaling, base)
    r = int(dim * fraction)
    if r < 2 or r % 2:
        raise ValueError(f"the rotated width int(dim * partial_rotary_factor) = int({dim} * {fraction}) = {r}"
                         " must be even and at least 2")
    theta = base ** (-np.arange(0, r, 2, dtype=np.float64) / r)  # (r/2,)
    if rope_type == "linear":
        theta = theta / params["factor"]
    elif rope_type == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        L = params["original_max_position_embeddings"]
        wavelength = 2 * math.pi / theta  # (r/2,)
        s = (L / wavelength - low) / (high - low)  # (r/2,): 0 at L / low, 1 at L / high
        theta = np.where(wavelength < L / high, theta,  # fast pairs: unchanged
                         np.where(wavelength > L / low, theta / factor,  # slow pairs: slowed down by factor
                                  (1 - s) * theta / factor + s * theta))  # in between: interpolated
    return theta


def scaled_rope_forward(x, positions=None, base=None, scaling=None, layout="half"):
    """RoPE with the frequencies of :func:`rope_frequencies`: each pair ``i`` of ``x`` rotated by
    ``p theta_i`` (``x``'s whole last axis is rotated: ``scaling`` must not hold a
    ``partial_rotary_factor`` below 1, see :mod:`attention_ref.nn.partial_rotary`).

    Parameters
    ----------
    x : array (..., n, d), ``d`` even (queries or keys per head)
    positions : None (``0 .. n - 1``), real positions (n,), or an array with as many axes as
        ``x.shape[:-1]`` (size-1 axes broadcast: ``positions[:, None, :]`` for (B, n) against (B, H, n, d))
    base, scaling : as :func:`rope_frequencies`
    layout : ``"half"`` (Llama's rotate-half pairs ``(x_i, x_{i+d/2})``, the default here) or
        ``"interleaved"`` (pairs ``(x_{2i}, x_{2i+1})``)

    Returns
    -------
    y : array (..., n, d), in ``x``'s dtype
    cache : RopeCache for :func:`scaled_rope_backward`
    """
    x = as_real_array(x, "x")
    require_ndim(x, "x", 2, "(..., n, d)")
    if x.shape[-1] % 2:
        raise ValueError(f"x must have an even last dimension d (feature pairs), got shape {x.shape}")
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"layout must be one of {ROPE_LAYOUTS}, got {layout!r}")
    theta = rope_frequencies(x.shape[-1], base, scaling)  # (D/2,) or fewer
    if 2 * len(theta) != x.shape[-1]:
        raise ValueError(f"scaling's partial_rotary_factor rotates {2 * len(theta)} of x's {x.shape[-1]} features;"
                         " use attention_ref.nn.partial_rotary for that")
    positions = _check_positions(positions, x)
    return _rotate_by(x, positions, theta, layout)


def _check_positions(positions, x):
    """None (``0 .. n - 1``), real positions (n,), or as many axes as ``x.shape[:-1]`` (size-1 ones broadcast)."""
    if positions is None:
        return np.arange(x.shape[-2])  # (N,)
    positions = as_real_array(positions, "positions")
    check_positions_for(positions, x.shape)
    return positions


def _rotate_by(x, positions, theta, layout):
    """Unchecked: angles in float64, cos and sin in x's dtype, then RoPE's rotation."""
    angles = np.asarray(positions, dtype=np.float64)[..., None] * theta  # (..., N, D/2)
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    return rotate(x, cos, sin, layout), RopeCache(cos, sin, x.shape, layout)


def scaled_rope_backward(dy, cache: RopeCache):
    """Gradient of :func:`scaled_rope_forward`: ``y = R x`` with ``R`` orthogonal, so ``dx = R^T dy``
    (each pair rotated back by its angle); the frequencies and positions get no gradient.

    Returns
    -------
    dx : array (..., n, d)
    """
    return rope_backward(dy, cache)
