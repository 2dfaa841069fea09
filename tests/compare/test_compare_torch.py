"""compare.operation on users' torch code (torch tensors in and out): torch's own functions and
hand-written torch ports match; every operation-level mistake, planted in torch, is named."""
import functools
import math

import numpy as np
import pytest

from attention_ref import compare

torch = pytest.importorskip("torch")
F = torch.nn.functional

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
P = functools.partial


def softmax(x, dim=-1, shift=True, dtype=None):
    y = x if dtype is None else x.to(dtype)
    if shift:
        return torch.softmax(y, dim=dim).to(x.dtype)
    e = torch.exp(y)
    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)


def sdpa(q, k, v, mask, **kw):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, **kw)


def attention(q, k, v, mask, expand="repeat_interleave", scale=None, mask_mode="keep", dim=-1, shift=True,
              softcap=None, dtype=None):
    """A hand-written port, as in a course: masked_fill with -inf, then softmax."""
    out_dtype = q.dtype
    if dtype is not None:
        q, k, v = (a.to(dtype) for a in (q, k, v))
    g = q.shape[1] // k.shape[1]
    if expand == "repeat_interleave":
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    else:
        k, v = k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if mask is not None and mask_mode != "ignore":
        s = s.masked_fill(mask if mask_mode == "invert" else ~mask, float("-inf"))
    if shift:
        p = torch.softmax(s, dim=dim)
    else:
        e = torch.exp(s)
        p = e / e.sum(dim=dim, keepdim=True)
    if mask is not None and mask_mode == "keep" and shift and dim == -1:
        p = torch.nan_to_num(p, nan=0.0)  # a query with no allowed key: zeros
    return (p @ v).to(out_dtype)


def causal(Tq, Tk, window, shift=0, offset=True, extra=0, invert=False):
    m = torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=(Tk - Tq if offset else 0) + shift)
    if window is not None:
        m &= ~torch.ones(Tq, Tk, dtype=torch.bool).tril(diagonal=(Tk - Tq if offset else 0) - window - extra)
    return ~m if invert else m


def rope(x, positions, theta=10000.0, layout="half", rotary_dim=None, shift=0, arange=False, float32_angles=False,
         frequencies_over_head=False):
    """transformers' Llama rotary embedding, with the angles in float64 unless float32_angles."""
    D = x.shape[-1]
    r = rotary_dim or D
    angle_dtype = torch.float32 if float32_angles else torch.float64
    inv = 1.0 / theta ** (torch.arange(0, r, 2, dtype=angle_dtype) / (D if frequencies_over_head else r))
    pos = torch.arange(positions.shape[1]).expand_as(positions) if arange else positions + shift
    freqs = pos[:, :, None].to(angle_dtype) * inv  # (B, T, r/2)
    if layout == "half":
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        xr = x[..., :r]
        rotated = torch.cat([-xr[..., r // 2:], xr[..., :r // 2]], dim=-1)
        y = xr * cos + rotated * sin
    else:  # interleaved, as GPT-J: pairs (2i, 2i + 1)
        cos, sin = freqs.cos().to(x.dtype)[:, None], freqs.sin().to(x.dtype)[:, None]
        a, b = x[..., 0:r:2], x[..., 1:r:2]
        y = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return torch.cat([y, x[..., r:]], dim=-1)


def rms_norm(x, w, eps, fixed_eps=None, offset=0.0, dtype=None):
    y = x if dtype is None else x.to(dtype)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + (eps if fixed_eps is None else fixed_eps))
    return (y * (w + offset)).to(x.dtype)


def rms_norm_functional(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def layer_norm(x, w, b, eps, outside=False):
    if not outside:
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / (x.var(-1, keepdim=True, unbiased=False).sqrt() + eps) * w + b


def swiglu(x, w_gate, w_up, w_down, swap=False):
    if swap:
        w_gate, w_up = w_up, w_gate
    return (F.silu(x @ w_gate) * (x @ w_up)) @ w_down


CORRECT = [
    ("softmax", softmax, {}),
    ("scaled_dot_product_attention", sdpa, {}),
    ("scaled_dot_product_attention", attention, {}),
    ("scaled_dot_product_attention", P(sdpa, scale=0.3), {"scale": 0.3}),
    ("causal_mask", causal, {}),
    ("rope", rope, {}),
    ("rope", P(rope, layout="interleaved"), {"layout": "interleaved"}),
    ("rope", P(rope, rotary_dim=8), {"rotary_dim": 8}),
    ("rms_norm", rms_norm, {}),
    ("rms_norm", rms_norm_functional, {}),
    ("rms_norm", P(rms_norm, offset=1.0), {"offset": 1.0}),
    ("layer_norm", layer_norm, {}),
    ("gelu", F.gelu, {}),
    ("gelu", P(F.gelu, approximate="tanh"), {"approximate": "tanh"}),
    ("swiglu", swiglu, {}),
]

PLANTED = [
    ("softmax_axis", "softmax", P(softmax, dim=0), {}),
    ("softmax_overflow", "softmax", P(softmax, shift=False), {}),
    ("low_precision", "softmax", P(softmax, dtype=torch.float32), {}),
    ("gqa_head_order", "scaled_dot_product_attention", P(attention, expand="repeat"), {}),
    ("attention_scale", "scaled_dot_product_attention", P(attention, scale=1.0), {}),
    ("attention_scale", "scaled_dot_product_attention", sdpa, {"scale": 224 ** -0.5}),
    ("softcap_missing", "scaled_dot_product_attention", sdpa, {"softcap": 50.0}),
    ("mask_inverted", "scaled_dot_product_attention", P(attention, mask_mode="invert"), {}),
    ("padding_ignored", "scaled_dot_product_attention", P(attention, mask_mode="ignore"), {}),
    ("softmax_axis", "scaled_dot_product_attention", P(attention, dim=-2), {}),
    ("softmax_overflow", "scaled_dot_product_attention", P(attention, shift=False), {}),
    ("masked_row_nan", "scaled_dot_product_attention", P(attention, mask_mode="nan rows"), {}),
    ("low_precision", "scaled_dot_product_attention", P(attention, dtype=torch.float32), {}),
    ("causal_off_by_one", "causal_mask", P(causal, shift=-1), {}),
    ("causal_off_by_one", "causal_mask", P(causal, offset=False), {}),
    ("window_off_by_one", "causal_mask", P(causal, extra=1), {}),
    ("window_off_by_one", "causal_mask", P(causal, extra=-1), {}),
    ("mask_inverted", "causal_mask", P(causal, invert=True), {}),
    ("rope_layout", "rope", P(rope, layout="interleaved"), {}),
    ("rope_theta", "rope", rope, {"theta": 1e6}),
    ("rope_scaling_ignored", "rope", P(rope, theta=500000.0), {"theta": 500000.0, "scaling": LLAMA3}),
    ("rope_position_offset", "rope", P(rope, arange=True), {}),
    ("rope_position_offset", "rope", P(rope, shift=-1), {}),
    ("partial_rotary", "rope", rope, {"rotary_dim": 8}),
    ("partial_rotary", "rope", P(rope, rotary_dim=8, frequencies_over_head=True), {"rotary_dim": 8}),
    ("low_precision", "rope", P(rope, float32_angles=True), {}),
    ("rms_norm_eps", "rms_norm", P(rms_norm, fixed_eps=1e-5), {}),
    ("norm_offset", "rms_norm", rms_norm, {"offset": 1.0}),
    ("low_precision", "rms_norm", P(rms_norm, dtype=torch.float32), {}),
    ("rms_norm_eps", "layer_norm", P(layer_norm, outside=True), {}),
    ("gelu_variant", "gelu", P(F.gelu, approximate="tanh"), {}),
    ("gelu_variant", "gelu", F.gelu, {"approximate": "tanh"}),
    ("gate_up_swapped", "swiglu", P(swiglu, swap=True), {}),
]


@pytest.mark.parametrize("name, fn, settings", CORRECT, ids=[f"{c[0]}-{i}" for i, c in enumerate(CORRECT)])
def test_torch_implementations_match(name, fn, settings):
    compare.operation(name, fn, **settings).check()


@pytest.mark.parametrize("mistake, name, fn, settings", PLANTED,
                         ids=[f"{p[0]}-{p[1]}-{i}" for i, p in enumerate(PLANTED)])
def test_every_mistake_planted_in_torch_is_named(mistake, name, fn, settings):
    verdict = compare.operation(name, fn, **settings)
    assert not verdict.ok
    assert verdict.mistake == mistake, str(verdict)


def test_every_operation_level_id_is_planted_in_torch():
    assert {p[0] for p in PLANTED} == set(compare.OPERATION_MISTAKES)


def test_sdpa_without_enable_gqa_is_judged_on_the_other_cases():
    """torch's SDPA without enable_gqa=True broadcasts one key/value head and raises on several
    shared ones: a feature it does not support, not a mistake."""
    verdict = compare.operation("scaled_dot_product_attention",
                                lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
    assert verdict.ok and verdict.unsupported == ("several key/value heads, each shared",), str(verdict)
    assert ("Not supported (it raised on every such case; judged on the others): several key/value heads, each"
            " shared.") in str(verdict)


def test_transformers_float32_angles_in_a_float64_port_are_low_precision():
    """docs/compare.md: a port that computes RoPE's angles in float32, as transformers does, is named
    low_precision, with a relative error between 1e-4 and 1e-3 (positions up to 1e5)."""
    verdict = compare.operation("rope", P(rope, float32_angles=True))
    assert verdict.mistake == "low_precision" and verdict.where == "angles"
    assert 1e-4 < verdict.error < 1e-3, verdict.error


def test_a_torch_function_that_raises_everywhere_shows_its_own_error():
    """Not NumPy's TypeError ('must be Tensor'): the error torch raised on tensors."""
    verdict = compare.operation("softmax", lambda x: torch.softmax(x, dim=5))
    assert not verdict.ok and verdict.where == "the call raised"
    assert "IndexError" in verdict.detail and "must be Tensor" not in verdict.detail, verdict.detail


def test_a_function_that_writes_into_its_tensors_changes_no_case():
    def in_place(x, w, eps):
        return x.mul_(torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).mul_(w)
    compare.operation("rms_norm", in_place).check()


def test_transformers_rope_in_float32_has_the_references_own_error():
    """The float32 reference computes RoPE's angles as transformers does: a float32-only port of it
    matches (float64 left out, named), and the same port run in float16 is named low_precision."""
    def float32_port(x, positions):
        if x.dtype != torch.float32:
            raise TypeError("this port runs in float32")
        return rope(x, positions, float32_angles=True)
    verdict = compare.operation("rope", float32_port)
    assert verdict.ok and verdict.unsupported == ("dtype = float64",) and verdict.r_ratio <= 2, str(verdict)
    assert verdict.error is None and "(R-ratio" in str(verdict)
    half = compare.operation("rope", lambda x, p: rope(x.half(), p, float32_angles=True).to(x.dtype))
    assert half.mistake == "low_precision" and half.r_ratio > compare.R_LIMIT, str(half)
