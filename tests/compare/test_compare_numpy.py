"""compare.operation on users' NumPy code: correct implementations in other styles match, and every
operation-level mistake of the catalogue, planted, is named with its id."""
import functools
import math

import numpy as np
import pytest

from attention_ref import compare

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


# ------------------------------------------------------------ users' code, written as users write it
def softmax(x, axis=-1, shift=True, dtype=None):
    x = x if dtype is None else x.astype(dtype)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True)) if shift else np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


def softmax_loops(x):
    """Row by row in Python floats, from the formula."""
    out = np.empty(x.shape, dtype=np.float64)
    for idx in np.ndindex(x.shape[:-1]):
        row = [float(v) for v in x[idx]]
        m = max(row)
        e = [math.exp(v - m) for v in row]
        out[idx] = [v / sum(e) for v in e]
    return out.astype(x.dtype)


def attention(q, k, v, mask, order="repeat_interleave", scale=None, mask_mode="keep", axis=-1, shift=True,
              softcap=None, zero_empty=True, dtype=None):
    if dtype is not None:
        q, k, v = (a.astype(dtype) for a in (q, k, v))
    g = q.shape[1] // k.shape[1]
    if order == "by count":  # the group size and the group count confused: head h reads h // Hkv
        heads = np.minimum(np.arange(q.shape[1]) // k.shape[1], k.shape[1] - 1)
        k, v = k[:, heads], v[:, heads]
    else:
        k, v = ((np.repeat(a, g, axis=1) if order == "repeat_interleave" else np.tile(a, (1, g, 1, 1)))
                for a in (k, v))
    s = q @ k.swapaxes(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if mask is not None and mask_mode != "ignore":
        s = np.where(~mask if mask_mode == "invert" else mask, s, -np.inf)
    m = np.max(s, axis=axis, keepdims=True) if shift else 0.0
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    z = np.sum(e, axis=axis, keepdims=True)
    p = e / np.where(z > 0, z, 1.0) if zero_empty else e / z
    return p @ v


def attention_einsum(q, k, v, mask):
    """Grouped heads as an axis of their own: (B, Hkv, g, T, D), einsum, no repeat."""
    B, H, Tq, D = q.shape
    Hkv = k.shape[1]
    qg = q.reshape(B, Hkv, H // Hkv, Tq, D)
    s = np.einsum("bhgqd,bhkd->bhgqk", qg, k) / math.sqrt(D)
    if mask is not None:
        m = np.broadcast_to(mask, (B, H, Tq, k.shape[2])).reshape(B, Hkv, H // Hkv, Tq, -1)
        s = np.where(m, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    p = e / np.maximum(e.sum(-1, keepdims=True), np.finfo(q.dtype).tiny)
    return np.einsum("bhgqk,bhkd->bhgqd", p, v).reshape(B, H, Tq, D)


def attention_loops(q, k, v, mask):
    """Query by query, in float64, then cast back (float32-careful)."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    m = np.ones((B, H, Tq, Tk), bool) if mask is None else np.broadcast_to(mask, (B, H, Tq, Tk))
    out = np.zeros(q.shape, np.float64)
    for b, h, i in np.ndindex(B, H, Tq):
        kv = h // (H // Hkv)
        keys = [j for j in range(Tk) if m[b, h, i, j]]
        if not keys:
            continue
        s = np.array([np.dot(q[b, h, i].astype(np.float64), k[b, kv, j].astype(np.float64)) / math.sqrt(D)
                      for j in keys])
        w = np.exp(s - s.max())
        out[b, h, i] = (w / w.sum()) @ v[b, kv, keys].astype(np.float64)
    return out.astype(q.dtype)


def causal(Tq, Tk, window, shift=0, aligned=True, extra=0, invert=False):
    p = np.arange(Tq)[:, None] + (Tk - Tq if aligned else 0)
    j = np.arange(Tk)[None, :]
    m = j <= p + shift
    if window is not None:
        m &= j > p - window - extra
    return ~m if invert else m


def causal_tril(Tq, Tk, window):
    """np.tril with the diagonal offset, minus a second tril for the window."""
    m = np.tril(np.ones((Tq, Tk), bool), k=Tk - Tq)
    if window is not None:
        m &= ~np.tril(np.ones((Tq, Tk), bool), k=Tk - Tq - window)
    return m


def rope(x, positions, theta=10000.0, layout="half", rotary_dim=None, shift=0, positions_of=None,
         frequencies_over_head=False, angles_dtype=None, scaling=None):
    D = x.shape[-1]
    r = rotary_dim or D
    inv = 1.0 / theta ** (np.arange(0, r, 2) / (D if frequencies_over_head else r))
    if scaling is not None:  # llama3, written out
        wavelength = 2 * math.pi / inv
        low, high = 8192 / scaling["low_freq_factor"], 8192 / scaling["high_freq_factor"]
        smooth = (8192 / wavelength - scaling["low_freq_factor"]) / (scaling["high_freq_factor"]
                                                                    - scaling["low_freq_factor"])
        inv = np.where(wavelength < high, inv, np.where(wavelength > low, inv / scaling["factor"],
                                                        (1 - smooth) * inv / scaling["factor"] + smooth * inv))
    pos = positions + shift if positions_of is None else positions_of(positions)
    if angles_dtype is not None:
        angles = pos.astype(angles_dtype)[:, None, :, None] * inv.astype(angles_dtype)
    else:
        angles = pos[:, None, :, None] * inv  # (B, 1, T, r/2)
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    xr = x[..., :r]
    if layout == "half":
        a, b = xr[..., :r // 2], xr[..., r // 2:]
        y = np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    else:
        a, b = xr[..., 0::2], xr[..., 1::2]
        y = np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(xr.shape)
    return np.concatenate([y, x[..., r:]], axis=-1)


def rope_complex(x, positions):
    """Meta's original form: interleaved pairs as complex numbers times e^{i p theta}."""
    D = x.shape[-1]
    inv = 10000.0 ** (-np.arange(0, D, 2) / D)
    z = x[..., 0::2].astype(np.float64) + 1j * x[..., 1::2].astype(np.float64)
    z = z * np.exp(1j * positions[:, None, :, None] * inv)
    return np.stack([z.real, z.imag], axis=-1).reshape(x.shape).astype(x.dtype)


def rms_norm(x, w, eps, fixed_eps=None, offset=0.0, outside=False, dtype=None):
    xx = x if dtype is None else x.astype(dtype)
    e = eps if fixed_eps is None else fixed_eps
    ms = np.mean(xx * xx, axis=-1, keepdims=True)
    out = xx / (np.sqrt(ms) + e) if outside else xx / np.sqrt(ms + e)
    return (out * (w + offset)).astype(x.dtype)


def layer_norm(x, w, b, eps, outside=False, ddof=0):
    mu = x.mean(-1, keepdims=True)
    sd = np.sqrt(x.var(-1, keepdims=True, ddof=ddof) + (0 if outside else eps)) + (eps if outside else 0)
    return (x - mu) / sd * w + b


_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu_exact(x):
    return (0.5 * x * (1 + _erf(x / math.sqrt(2)))).astype(x.dtype)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def swiglu(x, w_gate, w_up, w_down, swap=False):
    if swap:
        w_gate, w_up = w_up, w_gate
    a = x @ w_gate
    return (a / (1 + np.exp(-a)) * (x @ w_up)) @ w_down


def swiglu_einsum(x, w_gate, w_up, w_down):
    a = np.einsum("...d,df->...f", x, w_gate)
    return np.einsum("...f,fd->...d", a * (0.5 + 0.5 * np.tanh(a / 2)) * np.einsum("...d,df->...f", x, w_up), w_down)


P = functools.partial

CORRECT = [
    ("softmax", softmax, {}),
    ("softmax", softmax_loops, {}),
    ("scaled_dot_product_attention", attention, {}),
    ("scaled_dot_product_attention", attention_einsum, {}),
    ("scaled_dot_product_attention", attention_loops, {}),
    ("scaled_dot_product_attention", P(attention, scale=0.25), {"scale": 0.25}),
    ("scaled_dot_product_attention", P(attention, softcap=50.0), {"softcap": 50.0}),
    ("causal_mask", causal, {}),
    ("causal_mask", causal_tril, {}),
    ("rope", rope, {}),
    ("rope", P(rope, theta=500000.0), {"theta": 500000.0}),
    ("rope", P(rope, layout="interleaved"), {"layout": "interleaved"}),
    ("rope", rope_complex, {"layout": "interleaved"}),
    ("rope", P(rope, rotary_dim=8), {"rotary_dim": 8}),
    ("rope", P(rope, theta=500000.0, scaling=LLAMA3), {"theta": 500000.0, "scaling": LLAMA3}),
    ("rms_norm", rms_norm, {}),
    ("rms_norm", P(rms_norm, offset=1.0), {"offset": 1.0}),
    ("rms_norm", P(rms_norm, dtype=np.float64), {}),  # float32-careful: computed in float64, cast back
    ("layer_norm", layer_norm, {}),
    ("gelu", gelu_exact, {}),
    ("gelu", gelu_tanh, {"approximate": "tanh"}),
    ("swiglu", swiglu, {}),
    ("swiglu", swiglu_einsum, {}),
]

#: (the id it must be named, operation, the user's function, the settings the user meant)
PLANTED = [
    ("softmax_axis", "softmax", P(softmax, axis=0), {}),
    ("softmax_axis", "softmax", P(softmax, axis=1), {}),
    ("softmax_overflow", "softmax", P(softmax, shift=False), {}),
    ("low_precision", "softmax", P(softmax, dtype=np.float32), {}),
    ("gqa_head_order", "scaled_dot_product_attention", P(attention, order="tile"), {}),
    ("gqa_head_order", "scaled_dot_product_attention", P(attention, order="by count"), {}),
    ("attention_scale", "scaled_dot_product_attention", lambda q, k, v, m: attention(q, k, v, m, scale=1 / q.shape[-1]),
     {}),
    ("attention_scale", "scaled_dot_product_attention",
     lambda q, k, v, m: attention(q, k, v, m, scale=1 / math.sqrt(q.shape[1] * q.shape[-1])), {}),
    ("attention_scale", "scaled_dot_product_attention", attention, {"scale": 256 ** -0.5}),
    ("softcap_missing", "scaled_dot_product_attention", attention, {"softcap": 50.0}),
    ("mask_inverted", "scaled_dot_product_attention", P(attention, mask_mode="invert"), {}),
    ("padding_ignored", "scaled_dot_product_attention", P(attention, mask_mode="ignore"), {}),
    ("softmax_axis", "scaled_dot_product_attention", P(attention, axis=-2), {}),
    ("softmax_overflow", "scaled_dot_product_attention", P(attention, shift=False, zero_empty=False), {}),
    ("masked_row_nan", "scaled_dot_product_attention", P(attention, zero_empty=False), {}),
    ("low_precision", "scaled_dot_product_attention",
     lambda q, k, v, m: attention(q, k, v, m, dtype=np.float32).astype(q.dtype), {}),
    ("causal_off_by_one", "causal_mask", P(causal, shift=-1), {}),
    ("causal_off_by_one", "causal_mask", P(causal, aligned=False), {}),
    ("window_off_by_one", "causal_mask", P(causal, extra=1), {}),
    ("window_off_by_one", "causal_mask", P(causal, extra=-1), {}),
    ("mask_inverted", "causal_mask", P(causal, invert=True), {}),
    ("rope_layout", "rope", P(rope, layout="interleaved"), {}),
    ("rope_layout", "rope", rope, {"layout": "interleaved"}),
    ("rope_theta", "rope", rope, {"theta": 500000.0}),
    ("rope_theta", "rope", P(rope, theta=1e6), {"theta": 500000.0}),
    ("rope_scaling_ignored", "rope", P(rope, theta=500000.0), {"theta": 500000.0, "scaling": LLAMA3}),
    ("rope_position_offset", "rope", P(rope, positions_of=lambda p: np.broadcast_to(np.arange(p.shape[1]), p.shape)),
     {}),
    ("rope_position_offset", "rope", P(rope, shift=1), {}),
    ("partial_rotary", "rope", rope, {"rotary_dim": 8}),
    ("partial_rotary", "rope", P(rope, rotary_dim=8, frequencies_over_head=True), {"rotary_dim": 8}),
    ("low_precision", "rope", P(rope, angles_dtype=np.float32), {}),
    ("rms_norm_eps", "rms_norm", P(rms_norm, fixed_eps=1e-6), {}),
    ("rms_norm_eps", "rms_norm", P(rms_norm, outside=True), {}),
    ("norm_offset", "rms_norm", rms_norm, {"offset": 1.0}),
    ("norm_offset", "rms_norm", P(rms_norm, offset=2.0), {"offset": 1.0}),
    ("low_precision", "rms_norm", P(rms_norm, dtype=np.float32), {}),
    ("rms_norm_eps", "layer_norm", P(layer_norm, outside=True), {}),
    ("gelu_variant", "gelu", gelu_tanh, {}),
    ("gelu_variant", "gelu", gelu_exact, {"approximate": "tanh"}),
    ("gate_up_swapped", "swiglu", P(swiglu, swap=True), {}),
]


@pytest.mark.parametrize("name, fn, settings", CORRECT, ids=[f"{c[0]}-{i}" for i, c in enumerate(CORRECT)])
def test_correct_implementations_in_other_styles_match(name, fn, settings):
    verdict = compare.operation(name, fn, **settings)
    verdict.check()
    assert verdict.ok and bool(verdict) and verdict.mistake is None and verdict.where is None


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("mistake, name, fn, settings", PLANTED,
                         ids=[f"{p[0]}-{p[1]}-{i}" for i, p in enumerate(PLANTED)])
def test_every_planted_mistake_is_named(mistake, name, fn, settings, seed):
    """On the default draw and another one: the naming does not hang on one draw of the cases."""
    verdict = compare.operation(name, fn, seed=seed, **settings)
    assert not verdict.ok and not verdict
    assert verdict.mistake == mistake, str(verdict)
    assert verdict.where in compare.OPERATIONS[name].steps, verdict.where
    with pytest.raises(AssertionError, match=f"Mistake: {mistake} "):
        verdict.check()


def test_every_operation_level_id_is_planted():
    planted = {p[0] for p in PLANTED}
    assert planted == set(compare.OPERATION_MISTAKES)
    for mistake in compare.OPERATION_MISTAKES:  # and in each operation that tries it
        for name in compare.MISTAKES[mistake].operations:
            if mistake != "low_precision" or name in ("softmax", "rope", "rms_norm", "scaled_dot_product_attention"):
                assert (mistake, name) in {(p[0], p[1]) for p in PLANTED}, (mistake, name)
