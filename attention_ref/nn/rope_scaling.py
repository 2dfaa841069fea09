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

* ``yarn`` (``factor``, ``original_max_position_embeddings``; optionally ``beta_fast``,
  ``beta_slow``, ``truncate``, ``attention_factor``, ``mscale``, ``mscale_all_dim``): the ramp of
  :mod:`attention_ref.nn.yarn` between fast pairs kept and slow pairs divided by ``factor``, and an
  attention factor (``0.1 ln(factor) + 1`` by default) that multiplies ``cos`` and ``sin``. Only
  :func:`rope_parameters` and :func:`scaled_rope_forward` compute it: :func:`rope_frequencies`
  returns frequencies alone, so it refuses ``yarn`` by name rather than drop the factor.

Other types (``dynamic``, ``longrope``, ...) are refused by name, never computed
otherwise. A ``partial_rotary_factor`` in the parameters rotates the first
``int(dim * partial_rotary_factor)`` features only, as transformers computes its frequencies
(:mod:`attention_ref.nn.partial_rotary` applies it).

The rotation ``y = a R(p) x`` (``a`` the attention factor, 1 but for ``yarn``) is ``a`` times an
orthogonal map whatever the frequencies, so its backward is ``dx = a R(p)^T dy``: RoPE's backward
with the scaled ``cos`` and ``sin`` of the cache. Symbols: ``...`` batch axes, N positions, D feature width.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from .._checks import as_real_array, check_positions_for, check_positive_int, check_positive_real, require_ndim
from ..variants.rope import ROPE_LAYOUTS, RopeCache, rotate, rope_backward
from .yarn import yarn_attention_factor, yarn_frequencies

__all__ = ["ROPE_TYPES", "SCALED_ROPE_TYPES", "rope_frequencies", "rope_parameters", "scaled_rope_forward",
           "scaled_rope_backward"]

#: the RoPE types whose frequencies alone describe them (attention factor 1): what the models read
ROPE_TYPES = ("default", "linear", "llama3")
#: every RoPE type computed here, with those that also scale cos and sin (:func:`rope_parameters`)
SCALED_ROPE_TYPES = ROPE_TYPES + ("yarn",)
_KEYS = {"default": (), "linear": ("factor",),
         "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
         "yarn": ("factor", "original_max_position_embeddings")}
_OPTIONAL = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
#: YaRN's optional real parameters (``truncate`` is a bool, checked apart)
_YARN_OPTIONAL = ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim")


def _check_scaling(scaling, base, types=ROPE_TYPES):
    """The RoPE type, its parameters, the base and the rotated fraction from a config's
    ``rope_scaling`` / ``rope_parameters`` mapping (None: default RoPE)."""
    if scaling is None:
        scaling = {}
    if not isinstance(scaling, Mapping):
        raise TypeError(f"scaling must be None or a mapping such as a config's rope_scaling, got"
                        f" {type(scaling).__name__}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in types:
        why = (f" ({rope_type} also scales cos and sin by an attention factor, which frequencies alone cannot"
               " carry: attention_ref.nn.rope_scaling.rope_parameters and scaled_rope_forward compute it)"
               if rope_type in SCALED_ROPE_TYPES else "")
        raise ValueError(f"RoPE type {rope_type!r} is not implemented (only {', '.join(types)});"
                         f" it is refused rather than computed as another type{why}")
    optional = _OPTIONAL + (_YARN_OPTIONAL + ("truncate",) if rope_type == "yarn" else ())
    unknown = sorted(set(scaling) - set(_KEYS[rope_type]) - set(optional))
    if unknown:
        raise ValueError(f"scaling has {unknown}, which RoPE type {rope_type!r} does not use here; it is refused"
                         " rather than ignored")
    missing = [key for key in _KEYS[rope_type] if key not in scaling]
    if missing:
        raise ValueError(f"RoPE type {rope_type!r} needs scaling[{missing[0]!r}], which is missing")
    params = {key: check_positive_real(scaling[key], f"scaling[{key!r}]") for key in _KEYS[rope_type]}
    if rope_type == "yarn":
        params.update({key: check_positive_real(scaling[key], f"scaling[{key!r}]")
                       for key in _YARN_OPTIONAL if scaling.get(key) is not None})
        truncate = scaling.get("truncate", True)
        if not isinstance(truncate, (bool, np.bool_)):
            raise TypeError(f"scaling['truncate'] must be True or False, got {truncate!r}")
        params["truncate"] = bool(truncate)
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
    return _frequencies(dim, *_check_scaling(scaling, base))[0]


def rope_parameters(dim, base=None, scaling=None):
    """The frequencies and the attention factor of any of :data:`SCALED_ROPE_TYPES` (transformers'
    ``ROPE_INIT_FUNCTIONS[rope_type](config)``: ``inv_freq`` and ``attention_scaling``).

    Parameters
    ----------
    dim, base, scaling : as :func:`rope_frequencies`; ``scaling`` may also be ``rope_type="yarn"``
        with ``factor`` and ``original_max_position_embeddings`` (and optionally ``beta_fast``,
        ``beta_slow``, ``truncate``, ``attention_factor``, ``mscale``, ``mscale_all_dim``)

    Returns
    -------
    theta : float64 array (r/2,)
    attention_factor : float, what ``cos`` and ``sin`` are multiplied by (1 but for ``yarn``)
    """
    return _frequencies(dim, *_check_scaling(scaling, base, SCALED_ROPE_TYPES))


def _frequencies(dim, rope_type, params, base, fraction):
    """Checked scaling: the frequencies of the rotated pairs and the attention factor."""
    dim = check_positive_int(dim, "dim")
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
    elif rope_type == "yarn":
        theta = yarn_frequencies(r, base, params["factor"], params["original_max_position_embeddings"],
                                 params.get("beta_fast", 32.0), params.get("beta_slow", 1.0), params["truncate"])
        return theta, yarn_attention_factor(params["factor"], params.get("attention_factor"),
                                            params.get("mscale"), params.get("mscale_all_dim"))
    return theta, 1.0


def scaled_rope_forward(x, positions=None, base=None, scaling=None, layout="half"):
    """RoPE with the frequencies and attention factor ``a`` of :func:`rope_parameters`: each pair
    ``i`` of ``x`` rotated by ``p theta_i`` and multiplied by ``a`` (``x``'s whole last axis is rotated: ``scaling`` must not hold a
    ``partial_rotary_factor`` below 1, see :mod:`attention_ref.nn.partial_rotary`).

    Parameters
    ----------
    x : array (..., n, d), ``d`` even (queries or keys per head)
    positions : None (``0 .. n - 1``), real positions (n,), or an array with as many axes as
        ``x.shape[:-1]`` (size-1 axes broadcast: ``positions[:, None, :]`` for (B, n) against (B, H, n, d))
    base, scaling : as :func:`rope_parameters` (any of :data:`SCALED_ROPE_TYPES`)
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
    theta, attention_factor = rope_parameters(x.shape[-1], base, scaling)  # (D/2,) or fewer
    if 2 * len(theta) != x.shape[-1]:
        raise ValueError(f"scaling's partial_rotary_factor rotates {2 * len(theta)} of x's {x.shape[-1]} features;"
                         " use attention_ref.nn.partial_rotary for that")
    positions = _check_positions(positions, x)
    return _rotate_by(x, positions, theta, layout, attention_factor)


def _check_positions(positions, x):
    """None (``0 .. n - 1``), real positions (n,), or as many axes as ``x.shape[:-1]`` (size-1 ones broadcast)."""
    if positions is None:
        return np.arange(x.shape[-2])  # (N,)
    positions = as_real_array(positions, "positions")
    check_positions_for(positions, x.shape)
    return positions


def _rotate_by(x, positions, theta, layout, attention_factor=1.0):
    """Unchecked: angles in float64, cos and sin (times the attention factor, as transformers
    scales them) in x's dtype, then RoPE's rotation."""
    angles = np.asarray(positions, dtype=np.float64)[..., None] * theta  # (..., N, D/2)
    cos = (np.cos(angles) * attention_factor).astype(x.dtype)  # (..., N, D/2)
    sin = (np.sin(angles) * attention_factor).astype(x.dtype)  # (..., N, D/2)
    return rotate(x, cos, sin, layout), RopeCache(cos, sin, x.shape, layout)


def scaled_rope_backward(dy, cache: RopeCache):
    """Gradient of :func:`scaled_rope_forward`: ``y = a R x`` with ``R`` orthogonal, so
    ``dx = a R^T dy`` (each pair rotated back by its angle and scaled by ``a``: RoPE's backward with
    the cache's ``a cos`` and ``a sin``); the frequencies and positions get no gradient.

    Returns
    -------
    dx : array (..., n, d)
    """
    return rope_backward(dy, cache)
