"""The operations ``compare.operation`` knows: for each, its settings, steps, cases, reference and
mistaken variants.

* **cases** are drawn from the operation's whole input contract (float64 and float32, batch axes,
  grouped heads, fully masked rows, Tq < Tk, windows, positions far from 0, partial rotation,
  scores beyond exp's range), each with the features that describe it;
* the **reference** is this package's own function (``softmax_forward``,
  ``scaled_dot_product_attention_forward``, ``scaled_rope_forward``, ...), in float64, and in the
  case's dtype for the reference's own error (the R-ratio's denominator);
* each **variant** is the reference with one real porting mistake of the catalogue, tried with the
  values people use (RoPE bases 1e4, 5e5, 1e6; eps 1e-5, 1e-6, 0; scales 1/sqrt(D),
  1/sqrt(d_model), 1/D, 1; a window off by one either way). A variant with ``precision=True``
  computes a step in a lower precision: it reproduces an error in size, not digit for digit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._checks import signals_land_here
from ..core.attention import scaled_dot_product_attention_forward
from ..core.masks import causal_mask
from ..core.softmax import softmax_forward
from ..nn.feed_forward import gelu_forward
from ..nn.layer_norm import layer_norm_forward
from ..nn.partial_rotary import partial_rotary_formula
from ..nn.rms_norm import rms_norm_forward
from ..nn.rope_scaling import rope_frequencies
from ..nn.soft_cap import soft_cap_forward
from ..nn.swiglu import swiglu_forward
from ..variants.local import local_window_mask

__all__ = ["Case", "Variant", "OperationSpec", "OPERATIONS"]

_F64, _F32, _F16 = np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16)


@dataclass
class Case:
    """One call of the user's function: its arguments (NumPy), the features that describe it, the
    dtype of its float inputs (None: no float input) and the output entries judged only for NaN
    and infinity (``finite_only``, broadcastable to the output; padding rows)."""

    args: tuple
    features: dict
    dtype: np.dtype | None = None
    finite_only: np.ndarray | None = None


@dataclass(frozen=True)
class Variant:
    """A mistaken variant of the reference: ``compute(case, settings) -> (value, dont_care)``, the
    value in float64 and the output entries it leaves undefined (or None)."""

    key: str  # what exactly was tried, e.g. "rope_theta: theta = 1e6"
    mistake: str
    step: str
    compute: object
    precision: bool = False


@dataclass(frozen=True)
class OperationSpec:
    name: str
    signature: str
    settings: dict  # name -> default
    steps: tuple  # the steps, in order
    optional: tuple  # features a function may not support (judged on the other cases)
    feature_steps: dict  # feature name -> the step its cases exercise first
    cases: object  # (settings, rng) -> [Case]
    reference: object  # (case, settings, dtype) -> array in dtype
    variants: object  # (settings, case) -> [Variant] (the same keys for every case)
    exact: bool = False  # compared for equality (masks)
    probe: object = None  # (call, settings, rng) -> the first step that differs, or None; see _probe_*


def _quiet(f, *args):
    """``f(*args)`` with NumPy's floating-point flags ignored (a mistaken variant may overflow)."""
    with np.errstate(all="ignore"):
        out = f(*args)
        signals_land_here()
    return out


def _f64(a):
    return np.asarray(a, dtype=np.float64)


def _low(case, low):
    """The precision a low_precision variant computes in: ``low``, or the case's own when that is lower."""
    return low if case.dtype is None or np.dtype(low).itemsize < case.dtype.itemsize else case.dtype


_LOWS = (np.dtype(np.float32), np.dtype(np.float16))


def _lowered(step, formula):
    """The low_precision variants: ``formula(case, settings, dtype)`` computed in float32, and in float16
    (each never above the case's own precision); it returns the value, or (value, dont_care)."""
    def variant(low):
        def compute(c, s):
            out = _quiet(formula, c, s, _low(c, low))
            return (_f64(out[0]), out[1]) if isinstance(out, tuple) else (_f64(out), None)
        return Variant(f"low_precision: computed in {low.name}", "low_precision", step, compute, precision=True)
    return [variant(low) for low in _LOWS]


# ---------------------------------------------------------------- softmax
def _softmax_cases(s, rng):
    cases = []
    for dtype in (_F64, _F32):
        x = rng.standard_normal((6, 9)) * 3
        cases.append(Case((x.astype(dtype),), {"dtype": dtype.name}, dtype))
        x = rng.standard_normal((2, 3, 5, 7)) * 3
        cases.append(Case((x.astype(dtype),), {"dtype": dtype.name, "batch axes": True}, dtype))
        x = rng.standard_normal((4, 8)) * 3
        x[rng.random((4, 8)) < 0.3] = -np.inf
        x[:, 0] = x[0, :] = 0.5  # every row and every column keeps a finite entry
        cases.append(Case((x.astype(dtype),), {"dtype": dtype.name, "-inf entries": True}, dtype))
        x = rng.standard_normal((3, 6)) * 40 + 800 if dtype == _F64 else rng.standard_normal((3, 6)) * 10 + 100
        cases.append(Case((x.astype(dtype),), {"dtype": dtype.name, "scores beyond exp's range": True}, dtype))
    x = rng.standard_normal(7) * 3
    cases.append(Case((x,), {"dtype": "float64", "one axis": True}, _F64))
    return cases


def _softmax_reference(case, s, dtype):
    return softmax_forward(case.args[0].astype(dtype))[0]


def _naive_softmax(x, axis=-1):
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def _stable_softmax(x, axis=-1, empty=0.0):
    """Softmax along ``axis``; ``empty`` (0, this package's convention, or NaN, torch's softmax) where
    every entry is -inf."""
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(x - m)
    z = e.sum(axis=axis, keepdims=True)
    return np.where(z > 0, e / np.where(z > 0, z, 1), empty)


def _softmax_variants(s, case):
    x = case.args[0]
    return [
        Variant("softmax_axis: along the second-to-last axis", "softmax_axis", "normalisation",
                lambda c, s: (softmax_forward(_f64(c.args[0]), axis=-2 if c.args[0].ndim > 1 else -1)[0], None)),
        Variant("softmax_axis: along the first axis", "softmax_axis", "normalisation",
                lambda c, s: (softmax_forward(_f64(c.args[0]), axis=0)[0], None)),
        Variant("softmax_axis: along axis 1", "softmax_axis", "normalisation",
                lambda c, s: (softmax_forward(_f64(c.args[0]), axis=1 if c.args[0].ndim > 1 else 0)[0], None)),
        Variant("softmax_axis: over every entry at once", "softmax_axis", "normalisation",
                lambda c, s: (_quiet(_stable_softmax, _f64(c.args[0]).reshape(-1)).reshape(c.args[0].shape), None)),
        Variant("softmax_overflow: exp(x) / sum(exp(x))", "softmax_overflow", "max subtraction",
                lambda c, s: (_f64(_quiet(_naive_softmax, c.args[0])), None)),
        *_lowered("exponentials", lambda c, s, t: _stable_softmax(c.args[0].astype(t))),
    ] if x is not None else []


# ---------------------------------------------------------------- attention
def _attention_case(rng, dtype, B, H, Hkv, Tq, Tk, D, mask_kind, big=False):
    q = rng.standard_normal((B, H, Tq, D))
    k = rng.standard_normal((B, Hkv, Tk, D))
    v = rng.standard_normal((B, Hkv, Tk, D))
    features = {"dtype": dtype.name, "batch axes": B > 1, "grouped heads": Hkv < H,
                "several key/value heads, each shared": 1 < Hkv < H, "Tq < Tk": Tq < Tk,
                "with a mask": mask_kind != "none", "mask": None if mask_kind == "none" else mask_kind,
                "scores beyond exp's range": big}
    mask = None
    if mask_kind == "causal":
        mask = causal_mask(Tq, Tk)  # (Tq, Tk)
    elif mask_kind == "window":
        mask = local_window_mask(Tq, 2, Tk, causal=True)  # 3 keys each
    elif mask_kind == "padding":  # left padding of the second row, causal; its first queries see nothing
        pad = np.zeros((B, Tk), bool)
        pad[-1, :2] = True
        mask = causal_mask(Tq, Tk)[None, None] & ~pad[:, None, None, :]  # (B, 1, Tq, Tk)
    elif mask_kind == "arbitrary":
        mask = rng.random((B, H, Tq, Tk)) < 0.6
        mask[..., 0] = True
        mask[..., 1] = False  # no row all True or all False
    if big:  # the largest allowed scaled score 3000: exp overflows past 709 (float64), 88 (float32)
        scores = (q @ np.repeat(k, H // Hkv, axis=1).swapaxes(-1, -2)) / math.sqrt(D)
        allowed = np.ones(scores.shape, bool) if mask is None else np.broadcast_to(mask, scores.shape)
        q *= 3000.0 / scores[allowed].max()
    if mask is not None:
        features["mask axes"] = mask.ndim
    finite_only = None
    if mask is not None:
        empty = ~np.broadcast_to(mask, (B, H, Tq, Tk)).any(axis=-1)  # (B, H, Tq)
        if empty.any():
            features["fully masked rows"] = True
            finite_only = empty[..., None]  # (B, H, Tq, 1)
    cast = [a.astype(dtype) for a in (q, k, v)]
    return Case((*cast, mask), features, dtype, finite_only)


def _attention_cases(s, rng):
    cases = []
    for dtype in (_F64, _F32):
        cases += [_attention_case(rng, dtype, 2, 4, 4, 5, 5, 8, "none"),
                  _attention_case(rng, dtype, 2, 4, 2, 6, 6, 8, "causal"),
                  _attention_case(rng, dtype, 1, 4, 1, 3, 7, 8, "causal")]
    cases += [_attention_case(rng, _F64, 2, 4, 2, 5, 5, 8, "padding"),
              _attention_case(rng, _F64, 2, 6, 3, 8, 8, 4, "window"),
              _attention_case(rng, _F64, 2, 4, 4, 4, 6, 8, "arbitrary"),
              _attention_case(rng, _F64, 2, 4, 2, 4, 6, 8, "arbitrary"),
              _attention_case(rng, _F64, 1, 2, 2, 4, 4, 8, "causal", big=True),
              _attention_case(rng, _F32, 1, 2, 2, 4, 4, 8, "causal", big=True),
              _attention_case(rng, _F64, 2, 2, 2, 4, 4, 16, "none")]
    return cases


def _repeat_kv(q, k, v, order="repeat"):
    """Key/value head of each query head h: h // (H / Hkv) (repeat); h % Hkv (tile); h // Hkv, clipped
    (the group size and the group count confused)."""
    H, Hkv = q.shape[-3], k.shape[-3]
    heads = {"repeat": np.arange(H) // (H // Hkv), "tile": np.arange(H) % Hkv,
             "by count": np.minimum(np.arange(H) // Hkv, Hkv - 1)}[order]
    return k[..., heads, :, :], v[..., heads, :, :]


def _scale(s, D):
    return 1 / math.sqrt(D) if s["scale"] is None else float(s["scale"])


def _attention_reference(case, s, dtype):
    q, k, v, mask = case.args
    q, k, v = (a.astype(dtype) for a in (q, k, v))
    k, v = _repeat_kv(q, k, v)
    scale = _scale(s, q.shape[-1])
    if s["softcap"] is None:
        return scaled_dot_product_attention_forward(q, k, v, mask, scale=scale)[0]
    scores = soft_cap_forward((q @ k.swapaxes(-1, -2)) * q.dtype.type(scale), s["softcap"])[0]
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    p = softmax_forward(scores)[0]
    return p @ v


def _attention_formula(q, k, v, mask, scale, softcap=None, order="repeat", mask_mode="given", axis=-1,
                       naive=False, empty=0.0):
    """The attention of the variants, unchecked: returns (out, rows with no allowed key)."""
    k, v = _repeat_kv(q, k, v, order)
    scores = (q @ k.swapaxes(-1, -2)) * q.dtype.type(scale)
    if softcap is not None:
        scores = softcap * np.tanh(scores / softcap)
    allowed = np.ones(scores.shape, bool) if mask is None or mask_mode == "ignored" else \
        np.broadcast_to(~mask if mask_mode == "inverted" else mask, scores.shape)
    scores = np.where(allowed, scores, -np.inf)
    p = _naive_softmax(scores, axis) if naive else _stable_softmax(scores, axis, empty)
    out = p @ v
    return out, ~allowed.any(axis=-1)[..., None]


def _attention_variants(s, case):
    cap = s["softcap"]

    def variant(key, mistake, step, scale_of=None, native=False, **changes):
        """The attention with ``changes`` (and the scale ``scale_of(D, H)``), in float64 or, ``native``,
        in the case's own dtype (where exp overflows as the user's would)."""
        def compute(c, _s):
            q, k, v, mask = c.args
            scale = _scale(s, q.shape[-1]) if scale_of is None else scale_of(q.shape[-1], q.shape[1])
            arrays = (q, k, v) if native else tuple(map(_f64, (q, k, v)))
            out, dont_care = _quiet(lambda: _attention_formula(*arrays, mask, scale, **{"softcap": cap, **changes}))
            return _f64(out), dont_care
        return Variant(key, mistake, step, compute)

    out = [variant("gqa_head_order: key/value heads tiled (h % Hkv)", "gqa_head_order", "grouped heads",
                   order="tile"),
           variant("gqa_head_order: query head h reads h // Hkv", "gqa_head_order", "grouped heads",
                   order="by count")]
    scales = {"1/sqrt(D)": lambda D, H: 1 / math.sqrt(D), "1/sqrt(d_model)": lambda D, H: 1 / math.sqrt(D * H),
              "1/D": lambda D, H: 1 / D, "1 (no scale)": lambda D, H: 1.0}
    for label, scale_of in scales.items():
        if not (s["scale"] is None and label == "1/sqrt(D)"):
            out.append(variant(f"attention_scale: scale {label}", "attention_scale", "scale", scale_of))
    if cap is not None:
        out.append(variant("softcap_missing: no soft-capping", "softcap_missing", "soft-capping", softcap=None))
    out += [variant("mask_inverted: mask inverted", "mask_inverted", "mask", mask_mode="inverted"),
            variant("padding_ignored: mask ignored", "padding_ignored", "mask", mask_mode="ignored")]
    for empty in (0.0, np.nan):  # a key no query may see: a column of zeros, or of NaN (torch's softmax)
        out.append(variant(f"softmax_axis: softmax over the queries ({empty} for a key no query sees)",
                           "softmax_axis", "softmax", axis=-2, empty=empty))
    if cap is None or cap > 700:  # soft-capped scores stay below cap: exp cannot overflow
        for native, where in ((True, "the input's dtype"), (False, "float64")):
            out.append(variant(f"softmax_overflow: exp without subtracting the row maximum, in {where}",
                               "softmax_overflow", "max subtraction", native=native, naive=True))
    out += _lowered("softmax", lambda c, s, t: _attention_formula(*(a.astype(t) for a in c.args[:3]), c.args[3],
                                                                  _scale(s, c.args[0].shape[-1]), cap))
    return out


# ---------------------------------------------------------------- causal mask
def _mask_cases(s, rng):
    cases = []
    for Tq, Tk, window in ((6, 6, None), (1, 1, None), (3, 7, None), (7, 7, 3), (4, 9, 3), (5, 5, 1), (8, 8, 8),
                           (2, 6, 2)):
        cases.append(Case((Tq, Tk, window), {"Tq < Tk": Tq < Tk, "window": window is not None}))
    return cases


def _mask_reference(case, s, dtype=None):
    Tq, Tk, window = case.args
    return causal_mask(Tq, Tk) if window is None else local_window_mask(Tq, window - 1, Tk, causal=True)


def _mask_formula(Tq, Tk, window, shift=0, aligned=True, extra=0, inverted=False):
    p = np.arange(Tq)[:, None] + (Tk - Tq if aligned else 0)
    j = np.arange(Tk)[None, :]
    m = j <= p + shift
    if window is not None:
        m &= j > p - (window + extra)
    return ~m if inverted else m


def _mask_variants(s, case):
    return [
        Variant("causal_off_by_one: j < p (no self)", "causal_off_by_one", "causal",
                lambda c, s: (_mask_formula(*c.args, shift=-1), None)),
        Variant("causal_off_by_one: j <= p + 1", "causal_off_by_one", "causal",
                lambda c, s: (_mask_formula(*c.args, shift=1), None)),
        Variant("causal_off_by_one: query i at position i, not i + Tk - Tq", "causal_off_by_one", "causal",
                lambda c, s: (_mask_formula(*c.args, aligned=False), None)),
        Variant("window_off_by_one: W + 1 keys (p - W <= j)", "window_off_by_one", "window",
                lambda c, s: (_mask_formula(*c.args, extra=1), None)),
        Variant("window_off_by_one: W - 1 keys (p - W + 1 < j)", "window_off_by_one", "window",
                lambda c, s: (_mask_formula(*c.args, extra=-1), None)),
        Variant("mask_inverted: True = masked", "mask_inverted", "causal",
                lambda c, s: (_mask_formula(*c.args, inverted=True), None)),
    ]


# ---------------------------------------------------------------- RoPE
def _rope_widths(s):
    r = s["rotary_dim"]
    return (8, 16) if r is None else (r, 2 * r)


def _rope_cases(s, rng):
    cases = []
    D_small, D_big = _rope_widths(s)
    specs = [  # (dtype, B, H, T, D, kind)
        (_F64, 2, 3, 5, D_small, "from 0"), (_F64, 2, 2, 6, D_big, "offset"), (_F64, 2, 2, 5, D_big, "per row"),
        (_F64, 2, 2, 4, D_big, "large"), (_F64, 1, 3, 4, D_small, "large"), (_F32, 2, 3, 5, D_big, "from 0"),
        (_F32, 2, 2, 4, D_big, "large"), (_F32, 2, 2, 4, D_big, "per row")]
    for dtype, B, H, T, D, kind in specs:
        x = rng.standard_normal((B, H, T, D))
        if kind == "from 0":
            pos = np.broadcast_to(np.arange(T), (B, T)).copy()
        elif kind == "offset":
            pos = np.broadcast_to(np.arange(T) + 7, (B, T)).copy()
        elif kind == "per row":
            pos = np.stack([np.arange(T) + 3 * b + (b > 0) * 100 for b in range(B)])
        else:
            pos = np.sort(rng.integers(1000, 100000, (B, T)), axis=-1)
            pos[0, -1] = 100000
        features = {"dtype": dtype.name, "batch axes": B > 1, "positions per batch row": bool((pos != pos[:1]).any()),
                    "positions not starting at 0": bool(pos.min() > 0), "positions beyond 1000": kind == "large",
                    "head width > rotary_dim": s["rotary_dim"] is not None and D > s["rotary_dim"]}
        cases.append(Case((x.astype(dtype), pos.astype(np.int64)), features, dtype))
    return cases


def _rope_theta(s, d, base=None, scaling="meant"):
    scaling = s["scaling"] if scaling == "meant" else scaling
    if scaling is not None:
        scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
    return rope_frequencies(d, s["theta"] if base is None else base, scaling)


def _rope_formula(x, positions, theta, layout, pair_width=None):
    """RoPE of the first 2 len(theta) features with the frequencies ``theta``; ``pair_width``: the
    width over which the half layout pairs features (the mistake: the head width)."""
    if pair_width is not None and pair_width > 2 * len(theta):
        theta = np.concatenate([theta, np.zeros(pair_width // 2 - len(theta))])  # pairs past r: angle 0
    return partial_rotary_formula(x, theta, positions[:, None, :], layout)[0]


def _rope_reference(case, s, dtype):
    """float64: this package's RoPE. float32: as transformers computes it in float32 (inv_freq and the
    angles p * inv_freq in float32), so a port of transformers' rotary embedding is judged by the error
    transformers itself makes there, and only work in a still lower precision exceeds the R-ratio."""
    x, pos = case.args
    r = s["rotary_dim"] or x.shape[-1]
    if np.dtype(dtype) == _F64:
        return _rope_formula(x.astype(dtype), pos, _rope_theta(s, r), s["layout"])
    angles = pos.astype(np.float32)[:, None, :, None] * _rope_theta(s, r).astype(np.float32)  # (B, 1, T, r/2)
    return _rope_with_angles(x.astype(dtype), angles, s["layout"], r)


def _rope_variants(s, case):
    other = "interleaved" if s["layout"] == "half" else "half"
    r = s["rotary_dim"]

    def variant(key, mistake, step, layout=None, frequencies=None, positions=None, pair_width=False):
        """RoPE with another layout, ``frequencies(D)`` or ``positions(p)``; ``pair_width``: the half
        layout pairs features across the head width instead of the rotated width."""
        def compute(c, _s):
            x, pos = c.args
            D = x.shape[-1]
            theta = _rope_theta(s, r or D) if frequencies is None else frequencies(D)
            return _rope_formula(_f64(x), pos if positions is None else positions(pos), theta,
                                 layout or s["layout"], pair_width=D if pair_width else None), None
        return Variant(key, mistake, step, compute)

    out = [variant(f"rope_layout: layout={other!r}", "rope_layout", "pairs", layout=other)]
    for base in (1e4, 5e5, 1e6):
        if base != float(s["theta"]):
            out.append(variant(f"rope_theta: theta = {base:g}", "rope_theta", "frequencies",
                               frequencies=lambda D, base=base: _rope_theta(s, r or D, base)))
    if s["scaling"] is not None:
        out.append(variant("rope_scaling_ignored: unscaled frequencies", "rope_scaling_ignored", "frequencies",
                           frequencies=lambda D: _rope_theta(s, r or D, None, None)))
    moves = {"positions 0..T-1": lambda p: np.broadcast_to(np.arange(p.shape[-1]), p.shape),
             "positions + 1": lambda p: p + 1, "positions - 1": lambda p: p - 1,
             "the first row's positions for every row": lambda p: np.broadcast_to(p[:1], p.shape)}
    for label, move in moves.items():
        out.append(variant(f"rope_position_offset: {label}", "rope_position_offset", "positions", positions=move))
    if r is not None:
        out += [variant("partial_rotary: every feature rotated", "partial_rotary", "frequencies",
                        frequencies=lambda D: _rope_theta(s, D)),
                variant("partial_rotary: frequencies over head_dim", "partial_rotary", "frequencies",
                        frequencies=lambda D: _rope_theta(s, D)[:r // 2]),
                variant("partial_rotary: pair partner over head_dim", "partial_rotary", "pairs", pair_width=True)]

    def angles_in_float32(c, _s):  # transformers in a float64 model: inv_freq and p * inv_freq in float32
        x, pos = c.args
        angles = pos.astype(np.float32)[:, None, :, None] * _rope_theta(s, r or x.shape[-1]).astype(np.float32)
        return _rope_with_angles(_f64(x), angles.astype(np.float64), s["layout"], r or x.shape[-1]), None

    def rotation_in_float16(c, _s):  # transformers in a float16 model: float32 angles; cos, sin and x in float16
        x, pos = c.args
        angles = pos.astype(np.float32)[:, None, :, None] * _rope_theta(s, r or x.shape[-1]).astype(np.float32)
        return _f64(_quiet(_rope_with_angles, x.astype(np.float16), angles, s["layout"], r or x.shape[-1])), None
    out += [Variant("low_precision: inv_freq and angles in float32", "low_precision", "angles", angles_in_float32,
                    precision=True),
            Variant("low_precision: angles in float32, the rotation in float16", "low_precision", "pairs",
                    rotation_in_float16, precision=True),
            *_lowered("angles", lambda c, _s, t: _rope_with_angles(
                c.args[0].astype(t), (c.args[1][:, None, :, None] * _rope_theta(s, r or c.args[0].shape[-1])).astype(t),
                s["layout"], r or c.args[0].shape[-1]))]
    return out


def _rope_with_angles(x, angles, layout, r):
    """Rotate the first r features of x by ``angles`` (..., T, r/2), in x's dtype."""
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    xr = x[..., :r]
    if layout == "half":
        a, b = xr[..., :r // 2], xr[..., r // 2:]
        yr = np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    else:
        a, b = xr[..., 0::2], xr[..., 1::2]
        yr = np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(xr.shape)
    return np.concatenate([yr, x[..., r:]], axis=-1)


# ---------------------------------------------------------------- norms
def _norm_cases(s, rng, bias):
    cases = []
    for dtype, shape, eps, small in ((_F64, (2, 5, 16), 1e-5, False), (_F64, (3, 16), 1e-6, True),
                                     (_F64, (2, 4, 16), 1e-5, True), (_F64, (2, 3, 4, 8), 1e-6, True),
                                     (_F32, (2, 5, 16), 1e-5, False), (_F32, (3, 16), 1e-6, True)):
        x = rng.standard_normal(shape) * (1e-3 if small else 1.0) + (0.3 if bias else 0.0)
        w = 1 + 0.5 * rng.standard_normal(shape[-1])
        args = [x.astype(dtype), w.astype(dtype)]
        if bias:
            args.append((0.3 * rng.standard_normal(shape[-1])).astype(dtype))
        features = {"dtype": dtype.name, "batch axes": len(shape) > 2, f"eps": f"{eps:g}",
                    "rows of size about 1e-3": small}
        cases.append(Case((*args, eps), features, dtype))
    return cases


def _rms_reference(case, s, dtype):
    x, w, eps = case.args
    return rms_norm_forward(x.astype(dtype), (w.astype(np.float64) + s["offset"]).astype(dtype), eps)[0]


def _rms_formula(x, w, eps, offset, outside=False):
    ms = np.mean(x * x, axis=-1, keepdims=True)
    r = 1 / (np.sqrt(ms) + eps) if outside else 1 / np.sqrt(ms + eps)
    return x * r * (w + offset)


def _rms_variants(s, case):
    off = s["offset"]
    out = []
    for eps in (1e-5, 1e-6, 0.0):
        out.append(Variant(f"rms_norm_eps: eps = {eps:g} whatever eps is passed", "rms_norm_eps", "eps",
                           lambda c, s, eps=eps: (_quiet(_rms_formula, _f64(c.args[0]), _f64(c.args[1]), eps, off),
                                                  None)))
    out.append(Variant("rms_norm_eps: eps outside the square root", "rms_norm_eps", "eps",
                       lambda c, s: (_rms_formula(_f64(c.args[0]), _f64(c.args[1]), c.args[2], off, True), None)))
    for wrong in sorted({1.0 - off, off + 1.0} - {off}):
        out.append(Variant(f"norm_offset: x_hat * ({wrong:g} + w)", "norm_offset", "weight",
                           lambda c, s, wrong=wrong: (_rms_formula(_f64(c.args[0]), _f64(c.args[1]), c.args[2],
                                                                   wrong), None)))
    out += _lowered("mean square", lambda c, s, t: _rms_formula(c.args[0].astype(t), c.args[1].astype(t),
                                                                t.type(c.args[2]), t.type(off)))
    return out


def _layer_norm_reference(case, s, dtype):
    x, w, b, eps = case.args
    return layer_norm_forward(x.astype(dtype), w.astype(dtype), b.astype(dtype), eps)[0]


def _layer_norm_formula(x, w, b, eps, outside=False):
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
    r = 1 / (np.sqrt(var) + eps) if outside else 1 / np.sqrt(var + eps)
    return (x - mu) * r * w + b


def _layer_norm_variants(s, case):
    out = []
    for eps in (1e-5, 1e-6, 0.0):
        out.append(Variant(f"rms_norm_eps: eps = {eps:g} whatever eps is passed", "rms_norm_eps", "eps",
                           lambda c, s, eps=eps: (_quiet(_layer_norm_formula, *map(_f64, c.args[:3]), eps), None)))
    out.append(Variant("rms_norm_eps: eps outside the square root", "rms_norm_eps", "eps",
                       lambda c, s: (_layer_norm_formula(*map(_f64, c.args[:3]), c.args[3], True), None)))
    out += _lowered("variance", lambda c, s, t: _layer_norm_formula(*(a.astype(t) for a in c.args[:3]),
                                                                    t.type(c.args[3])))
    return out


# ---------------------------------------------------------------- activations
def _gelu_cases(s, rng):
    cases = []
    for dtype in (_F64, _F32):
        cases.append(Case((rng.standard_normal((4, 16)).astype(dtype) * 2,), {"dtype": dtype.name}, dtype))
        cases.append(Case((rng.uniform(-12, 12, (2, 3, 8)).astype(dtype),),
                          {"dtype": dtype.name, "batch axes": True, "|x| up to 12": True}, dtype))
    return cases


def _gelu_reference(case, s, dtype):
    return gelu_forward(case.args[0].astype(dtype), approximate=s["approximate"])[0]


def _gelu_variants(s, case):
    other = "tanh" if s["approximate"] == "none" else "none"
    return [
        Variant(f"gelu_variant: approximate={other!r}", "gelu_variant", "activation",
                lambda c, s: (gelu_forward(_f64(c.args[0]), approximate=other)[0], None)),
        Variant("gelu_variant: x * sigmoid(1.702 x) (quick GELU)", "gelu_variant", "activation",
                lambda c, s: (_quiet(lambda x: x / (1 + np.exp(-1.702 * x)), _f64(c.args[0])), None)),
        *_lowered("activation", lambda c, s, t: _gelu_in(c.args[0], s["approximate"], t)),
    ]


def _gelu_in(x, approximate, dtype):
    """GELU computed in ``dtype``: float32 through this package's function; float16 as the tanh form, or
    the exact one through float32's erf rounded to float16."""
    x = x.astype(dtype)
    if dtype == _F32 or approximate == "none":
        return gelu_forward(x.astype(np.float32), approximate=approximate)[0].astype(dtype)
    c = dtype.type(math.sqrt(2 / math.pi))
    return dtype.type(0.5) * x * (1 + np.tanh(c * (x + dtype.type(0.044715) * x * x * x)))


def _swiglu_cases(s, rng):
    cases = []
    for dtype, shape, F in ((_F64, (2, 5, 8), 12), (_F64, (3, 8), 6), (_F32, (2, 4, 8), 12), (_F64, (2, 2, 3, 8), 4)):
        D = shape[-1]
        args = (rng.standard_normal(shape), rng.standard_normal((D, F)) / math.sqrt(D),
                rng.standard_normal((D, F)) / math.sqrt(D), rng.standard_normal((F, D)) / math.sqrt(F))
        cases.append(Case(tuple(a.astype(dtype) for a in args),
                          {"dtype": dtype.name, "batch axes": len(shape) > 2, "extra batch axis": len(shape) > 3},
                          dtype))
    return cases


def _swiglu_reference(case, s, dtype):
    return swiglu_forward(*(a.astype(dtype) for a in case.args))[0]


def _swiglu_formula(x, g, u, d):
    a = x @ g
    return (a / (1 + np.exp(-a)) * (x @ u)) @ d


def _swiglu_variants(s, case):
    return [
        Variant("gate_up_swapped: silu(x W_up) * (x W_gate)", "gate_up_swapped", "gate",
                lambda c, s: (_quiet(_swiglu_formula, _f64(c.args[0]), _f64(c.args[2]), _f64(c.args[1]),
                                     _f64(c.args[3])), None)),
        *_lowered("gate", lambda c, s, t: _swiglu_formula(*(a.astype(t) for a in c.args))),
    ]


# ---------------------------------------------------------------- probes: inputs that isolate a step
def _close(u, t):
    """Whether a probe's output ``u`` is the reference's ``t`` to 1e-8 relative."""
    u, t = np.asarray(u, np.float64), np.asarray(t, np.float64)
    if u.shape != t.shape or not np.all(np.isfinite(u)):
        return False
    gap = _quiet(lambda: float(np.max(np.abs(u - t), initial=0.0)))
    return gap <= 1e-8 * max(float(np.max(np.abs(t), initial=0.0)), 1.0)


def _probe_attention(call, s, rng):
    """Values v = the identity (Tk = D) make the output the attention weights themselves: weights
    that are probabilities (rows of non-negative numbers summing to 1) but not the reference's point
    to the scores, mask or softmax; anything else to the weighted sum of the values."""
    B, H, T, D = 1, 2, 8, 8
    q, k = rng.standard_normal((2, B, H, T, D))
    v = np.broadcast_to(np.eye(T), (B, H, T, D)).copy()
    mask = causal_mask(T, T)
    weights = np.asarray(call((q, k, v, mask)), np.float64)
    if weights.shape == (B, H, T, T) and np.all(np.isfinite(weights)) and np.all(weights >= -1e-12) and \
            np.allclose(weights.sum(-1), 1.0, rtol=0, atol=1e-8):
        return "softmax"
    return "weighted sum"


def _probe_rope(call, s, rng):
    """At position 0 every rotation is the identity: wrong there means the pairs, not the angles."""
    x = rng.standard_normal((1, 2, 4, 2 * (s["rotary_dim"] or 4)))
    return "angles" if _close(call((x, np.zeros((1, 4), np.int64))), x) else "pairs"


def _probe_norm(call, s, rng, bias):
    """With weight 1 (and bias 0) the output is the normalised x: right there means the weight step."""
    x = rng.standard_normal((3, 8))
    w = np.full(8, 1.0 - s.get("offset", 0.0))
    args = (x, w, np.zeros(8), 1e-5) if bias else (x, w, 1e-5)
    ref = layer_norm_forward(x, np.ones(8), np.zeros(8), 1e-5)[0] if bias else rms_norm_forward(x, np.ones(8), 1e-5)[0]
    return ("weight and bias" if bias else "weight") if _close(call(args), ref) else ("variance" if bias else
                                                                                      "mean square")


def _probe_swiglu(call, s, rng):
    """w_down = the identity (F = D) leaves silu(x w_gate) * (x w_up): right there means the down projection."""
    x, (g, u) = rng.standard_normal((4, 8)), rng.standard_normal((2, 8, 8)) / 3
    ref = swiglu_forward(x, g, u, np.eye(8))[0]
    return "down" if _close(call((x, g, u, np.eye(8))), ref) else "gate"


OPERATIONS = {spec.name: spec for spec in (
    OperationSpec("softmax", "fn(x), along the last axis", {}, ("max subtraction", "exponentials", "normalisation"),
                  ("batch axes", "one axis"),
                  {"scores beyond exp's range": "max subtraction", "-inf entries": "exponentials"},
                  _softmax_cases, _softmax_reference, _softmax_variants),
    OperationSpec("scaled_dot_product_attention", "fn(q, k, v, mask)", {"scale": None, "softcap": None},
                  ("grouped heads", "scores", "scale", "soft-capping", "mask", "max subtraction", "softmax",
                   "weighted sum"),
                  ("grouped heads", "several key/value heads, each shared", "mask axes", "batch axes", "Tq < Tk"),
                  {"grouped heads": "grouped heads", "mask": "mask", "fully masked rows": "softmax",
                   "scores beyond exp's range": "max subtraction", "Tq < Tk": "mask"},
                  _attention_cases, _attention_reference, _attention_variants, probe=_probe_attention),
    OperationSpec("causal_mask", "fn(Tq, Tk, window) -> bool (Tq, Tk)", {}, ("causal", "window"),
                  ("window", "Tq < Tk"), {"window": "window", "Tq < Tk": "causal"},
                  _mask_cases, _mask_reference, _mask_variants, exact=True),
    OperationSpec("rope", "fn(x, positions), x (B, H, T, D), positions (B, T)",
                  {"layout": "half", "theta": 10000.0, "rotary_dim": None, "scaling": None},
                  ("frequencies", "positions", "angles", "pairs"),
                  ("batch axes", "positions per batch row"),
                  {"positions not starting at 0": "positions", "positions per batch row": "positions",
                   "positions beyond 1000": "angles", "head width > rotary_dim": "frequencies"},
                  _rope_cases, _rope_reference, _rope_variants, probe=_probe_rope),
    OperationSpec("rms_norm", "fn(x, weight, eps)", {"offset": 0.0}, ("mean square", "eps", "weight"),
                  ("batch axes",), {"rows of size about 1e-3": "eps", "eps": "eps"},
                  lambda s, rng: _norm_cases(s, rng, False), _rms_reference, _rms_variants,
                  probe=lambda call, s, rng: _probe_norm(call, s, rng, False)),
    OperationSpec("layer_norm", "fn(x, weight, bias, eps)", {}, ("mean", "variance", "eps", "weight and bias"),
                  ("batch axes",), {"rows of size about 1e-3": "eps", "eps": "eps"},
                  lambda s, rng: _norm_cases(s, rng, True), _layer_norm_reference, _layer_norm_variants,
                  probe=lambda call, s, rng: _probe_norm(call, s, rng, True)),
    OperationSpec("gelu", "fn(x)", {"approximate": "none"}, ("activation",), ("batch axes",), {},
                  _gelu_cases, _gelu_reference, _gelu_variants),
    OperationSpec("swiglu", "fn(x, w_gate, w_up, w_down), w_gate and w_up (D, F), w_down (F, D)", {},
                  ("gate", "up", "down"), ("extra batch axis",), {}, _swiglu_cases, _swiglu_reference,
                  _swiglu_variants, probe=_probe_swiglu),
)}
