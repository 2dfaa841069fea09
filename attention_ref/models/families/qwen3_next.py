"""Qwen3-Next (transformers' ``Qwen3NextForCausalLM``): two kinds of token mixer and a mixture of experts with a
gated shared expert, in Llama's pre-norm block with Gemma's ``(1 + w)`` RMSNorms.

The difference from :mod:`.llama`:

* a layer of ``layer_types`` ``"linear_attention"`` mixes tokens with Gated DeltaNet
  (:mod:`attention_ref.nn.gated_delta_net`: a short causal convolution, then the gated delta rule's
  recurrent state, a gated RMSNorm), a ``"full_attention"`` one with gated attention
  (:mod:`attention_ref.nn.gated_attention`: ``(1 + w)`` q/k norms, RoPE over ``partial_rotary_factor`` of each
  head, a sigmoid gate on the output); without ``layer_types`` every ``full_attention_interval``-th layer is full
  (transformers' default 4);
* the MLP of layer ``i`` is a mixture of experts when ``num_experts > 0``, ``(i + 1) % decoder_sparse_step == 0``
  and ``i`` is not in ``mlp_only_layers``, else a dense SwiGLU of ``intermediate_size``: ``num_experts`` SwiGLU
  experts of ``moe_intermediate_size``, ``num_experts_per_tok`` chosen from a softmax over all of them
  (renormalised when ``norm_topk_prob``), plus a shared SwiGLU expert of ``shared_expert_intermediate_size``
  scaled by its own sigmoid gate (:mod:`attention_ref.nn.shared_expert`);
* every RMSNorm but Gated DeltaNet's is ``x / rms(x) * (1 + w)`` (w stored, initialised at 0).

The family's own constants are in ``LMConfig.settings``: ``linear_layers`` and ``moe_layers`` (one flag per layer),
``linear_key_heads``, ``linear_key_dim``, ``linear_value_heads``, ``linear_value_dim``, ``conv_kernel``,
``moe_d_ff``, ``shared_d_ff``, ``norm_topk_prob``; the rotated share of each head is ``LMConfig.rotary_pct``.
A ``head_dim`` or ``partial_rotary_factor`` written as null is refused by name (transformers reads None and cannot
build the model; an absent key takes Qwen3NextConfig's 256 and 0.25).

A block's numbered steps:

1. ``z = RMSNorm_1(x)``                                  (``input_layernorm``)
   (left padding, several rows: ``z = z * keep`` before a linear layer, as transformers zeroes the padded
   positions' states; one padded row is refused by name: transformers 4.57 does not zero it, 5.x does)
2. ``a = GatedDeltaNet(z)`` (``linear_attn``) or ``a = GatedAttention(z)`` (``self_attn``)
3. ``h = x + a``
4. ``u = RMSNorm_2(h)``                                  (``post_attention_layernorm``)
5. ``m = MoE(u) + sigmoid(u w_s) SwiGLU_s(u)`` (``mlp``), or ``m = SwiGLU(u)`` on a dense layer
6. ``y = h + m``

Decoding runs the same steps: a linear layer carries :class:`LinearAttentionState` (the convolution's window and
the recurrent state, :meth:`Family.new_cache`), a full one a :class:`attention_ref.variants.kv_cache.KVCache`.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...nn.gated_attention import GatedAttentionShape, gated_attention_backward, gated_attention_formula
from ...nn.gated_delta_net import DeltaNetShape, gated_delta_net_backward, gated_delta_net_formula
from ...nn.gemma_rms_norm import gemma_rms_norm_formula
from ...nn.moe import swiglu_moe_backward, swiglu_moe_formula
from ...nn.moe_routing import Routing
from ...nn.rms_norm import rms_norm_backward_formula
from ...nn.shared_expert import gated_shared_expert_backward, gated_shared_expert_formula
from ...nn.swiglu import swiglu_backward_formula, swiglu_formula
from ...variants.kv_cache import KVCache
from ..config import LMConfig, refuse
from ..family import DROPOUT, EXPERTS_5X, Tensor, computed, neutral
from ..trace_steps import SEPARATOR, attention_steps, linear_output, norm_output
from .gemma3_text import final_norm, final_norm_backward
from .llama import FAMILY as LLAMA, LLAMA_KEYS, rope_spellings, token_id

__all__ = ["FAMILY", "LinearAttentionState", "Qwen3NextBlockCache", "qwen3_next_block", "qwen3_next_block_backward"]

MODEL_TYPE = "qwen3_next"
LINEAR, FULL = "linear_attention", "full_attention"


# ---- the reader ----

def _rope(d):
    """``(rope_theta, partial_rotary_factor)`` from 4.57's top-level fields or 5.x's ``rope_parameters``; a scaled
    RoPE is refused by name."""
    rope, theta = rope_spellings(d, MODEL_TYPE)
    if rope["rope_type"] != "default":
        refuse("the RoPE scaling rope_type", rope["rope_type"], MODEL_TYPE)
    for name, where in (("partial_rotary_factor", d), ("rope_parameters.partial_rotary_factor", rope)):
        if "partial_rotary_factor" in where and where["partial_rotary_factor"] is None:  # not the default 0.25:
            raise ValueError(f"{MODEL_TYPE}: {name} is null in config.json (transformers' RoPE cannot use it);"
                             " give the fraction or leave the key out")
    factors = [(n, v) for n, v in (("partial_rotary_factor", d.get("partial_rotary_factor")),
                                   ("rope_parameters.partial_rotary_factor", rope.get("partial_rotary_factor")))
               if v is not None]
    if len({v for _, v in factors}) > 1:
        raise ValueError(f"{MODEL_TYPE}: config.json gives {factors[0][0]} = {factors[0][1]!r} and {factors[1][0]} ="
                         f" {factors[1][1]!r}; neither is guessed: keep one of them")
    factor = factors[0][1] if factors else 0.25  # Qwen3NextConfig's default
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ValueError(f"{MODEL_TYPE}: partial_rotary_factor must be a number in (0, 1], got {factor!r}")
    return float(theta), float(factor)


def read(d):
    """An LMConfig of Qwen3-Next from its ``config.json`` (the module docstring lists the fields)."""
    if d.get("hidden_act", "silu") != "silu":
        refuse("hidden_act", d["hidden_act"], MODEL_TYPE)
    if d.get("attention_bias"):
        refuse("attention_bias", True, MODEL_TYPE)
    L = d["num_hidden_layers"]
    kinds = d.get("layer_types")
    if kinds is None:
        interval = d.get("full_attention_interval", 4)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"{MODEL_TYPE}: full_attention_interval must be a positive integer, got {interval!r}")
        kinds = [LINEAR if (i + 1) % interval else FULL for i in range(L)]
    if len(kinds) != L or any(kind not in (LINEAR, FULL) for kind in kinds):
        raise ValueError(f"{MODEL_TYPE}: layer_types must list {LINEAR!r} or {FULL!r} for each of the {L} layers,"
                         f" got {kinds!r}")
    E = d.get("num_experts", 512)
    step, only = d.get("decoder_sparse_step", 1), d.get("mlp_only_layers") or []
    for name, value in (("num_experts", E), ("decoder_sparse_step", step)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "num_experts" else 1):
            raise ValueError(f"{MODEL_TYPE}: {name} must be a {'non-negative' if name == 'num_experts' else 'positive'}"
                             f" integer, got {value!r}")
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
        raise ValueError(f"{MODEL_TYPE}: mlp_only_layers must be a list of layer indices, got {only!r}")
    moe = tuple(i not in only and E > 0 and (i + 1) % step == 0 for i in range(L))
    norm_topk = d.get("norm_topk_prob", True)
    if not isinstance(norm_topk, bool):
        raise ValueError(f"{MODEL_TYPE}: norm_topk_prob must be true or false, got {norm_topk!r}")
    theta, factor = _rope(d)
    D_, H = d["hidden_size"], d["num_attention_heads"]
    head_dim = d.get("head_dim", 256)
    if head_dim is None:  # Qwen3NextAttention reads it with getattr: None, not hidden / heads
        raise ValueError(f"{MODEL_TYPE}: head_dim is null in config.json (transformers cannot build that model); give"
                         " the width or leave the key out (Qwen3NextConfig's 256)")
    kv_heads = d.get("num_key_value_heads", 2)
    settings = {"linear_layers": tuple(kind == LINEAR for kind in kinds), "moe_layers": moe,
                "linear_key_heads": d.get("linear_num_key_heads", 16), "linear_key_dim": d.get("linear_key_head_dim", 128),
                "linear_value_heads": d.get("linear_num_value_heads", 32),
                "linear_value_dim": d.get("linear_value_head_dim", 128), "conv_kernel": d.get("linear_conv_kernel_dim", 4),
                "moe_d_ff": d.get("moe_intermediate_size", 512),
                "shared_d_ff": d.get("shared_expert_intermediate_size", 512), "norm_topk_prob": norm_topk}
    any_moe = any(moe)
    return LMConfig(family=MODEL_TYPE, vocab_size=d["vocab_size"], d_model=D_, num_layers=L, num_heads=H,
                    num_kv_heads=H if kv_heads is None else kv_heads, d_ff=d.get("intermediate_size", 5632),
                    max_positions=d.get("max_position_embeddings", 32768), eps=d.get("rms_norm_eps", 1e-6),
                    rope_theta=theta, head_dim=None if head_dim * H == D_ else head_dim, rotary_pct=factor,
                    tie_word_embeddings=d.get("tie_word_embeddings", False), pad_token_id=token_id(d),
                    num_experts=E if any_moe else None,
                    experts_per_token=d.get("num_experts_per_tok", 10) if any_moe else None, settings=settings)


_SIZES = ("linear_key_heads", "linear_key_dim", "linear_value_heads", "linear_value_dim", "conv_kernel", "moe_d_ff",
          "shared_d_ff")


def check(config):
    """A Qwen3-Next config's own rules (errors name the setting)."""
    s = dict(config.settings)
    for name in _SIZES + ("linear_layers", "moe_layers", "norm_topk_prob"):
        if name not in s:
            raise ValueError(f"{config.family}: settings needs {name!r} (read from config.json by LMConfig.from_dict)")
    for name in _SIZES:
        value = s[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{config.family}: settings {name} must be a positive integer, got {value!r}")
    for name in ("linear_layers", "moe_layers"):
        flags = s[name]
        if not isinstance(flags, tuple) or len(flags) != config.num_layers or any(not isinstance(f, bool) for f in flags):
            raise ValueError(f"{config.family}: settings {name} must be True or False for each of the"
                             f" {config.num_layers} layers, got {flags!r}")
    if not isinstance(s["norm_topk_prob"], bool):
        raise ValueError(f"{config.family}: settings norm_topk_prob must be True or False, got {s['norm_topk_prob']!r}")
    if s["linear_value_heads"] % s["linear_key_heads"]:
        raise ValueError(f"{config.family}: linear_num_value_heads = {s['linear_value_heads']} must be a multiple of"
                         f" linear_num_key_heads = {s['linear_key_heads']}")
    if any(s["moe_layers"]) and config.num_experts is None:
        raise ValueError(f"{config.family}: a layer with experts needs num_experts and experts_per_token")
    r = config.rotary_dim
    if r < 2 or r % 2:
        raise ValueError(f"{config.family}: int(head_dim * partial_rotary_factor) = {r} must be even and at least 2"
                         " (RoPE rotates pairs)")


# ---- the block ----

class LinearAttentionState:
    """A linear-attention layer's decoding state (:meth:`Family.new_cache`): the convolution's window of the last
    K - 1 inputs and the recurrent state S (..., Hv, dk, dv); both None before the prompt."""

    def __init__(self):
        self.state = None  # DeltaNetState, or None before the first call
        self.length = 0  # the tokens seen (as a KVCache's length)

    def __repr__(self):
        return "LinearAttentionState(length=0)" if self.state is None else (
            f"LinearAttentionState(length={self.length}, window={self.state.window.shape},"
            f" recurrent={self.state.recurrent.shape})")


def new_cache(config, i):
    """Layer ``i``'s empty decoding state: :class:`LinearAttentionState` or a KVCache."""
    return LinearAttentionState() if config.setting("linear_layers")[i] else KVCache()


class Qwen3NextLayer(NamedTuple):
    """A layer's constants, read once per run."""

    linear: bool
    moe: bool
    delta: DeltaNetShape | None
    attention: GatedAttentionShape | None
    routing: Routing | None


def qwen3_next_layers(config):
    s = dict(config.settings)
    delta = DeltaNetShape(s["linear_key_heads"], s["linear_key_dim"], s["linear_value_heads"], s["linear_value_dim"],
                          config.eps)
    attention = GatedAttentionShape(config.num_heads, config.num_kv_heads, config.d_head, config.rotary_dim,
                                    config.rope_theta, config.eps)
    routing = Routing(config.experts_per_token, "softmax_topk", s["norm_topk_prob"]) if any(s["moe_layers"]) else None
    return [Qwen3NextLayer(linear, moe, delta if linear else None, None if linear else attention,
                           routing if moe else None)
            for linear, moe in zip(s["linear_layers"], s["moe_layers"])]


class Qwen3NextBlockCache(NamedTuple):
    norm1: object  # step 1, RMSNormCache
    keep: np.ndarray | None  # step 1's padding multiplier (..., T, 1) on a linear layer, or None
    mixer: object  # step 2, GatedDeltaNetCache or GatedAttentionCache
    norm2: object  # step 4
    mlp: object  # step 5: (SwiGLUMoECache, SharedExpertCache, the routed sum (..., N, D)) or SwiGLUCache
    layer: Qwen3NextLayer


_MOE = ("mlp.W_router", "mlp.experts.W_gate", "mlp.experts.W_up", "mlp.experts.W_down")
_SHARED = ("mlp.shared_expert.W_gate", "mlp.shared_expert.W_up", "mlp.shared_expert.W_down", "mlp.shared_expert_gate.W")
_DENSE = ("mlp.W_gate", "mlp.W_up", "mlp.W_down")
_DELTA = ("in_proj_qkvz.W", "in_proj_ba.W", "conv1d.weight", "dt_bias", "A_log", "norm.weight", "out_proj.W")
_ATTN = ("W_q", "W_k", "W_v", "W_o", "q_norm.weight", "k_norm.weight")


def _padding(z, mask, decoding_more):
    """Step 1's multiplier on a linear layer: ``keep`` (..., T, 1) where transformers zeroes the padded positions'
    inputs (a key mask with padding, several rows, more than one new token), else None."""
    if mask is None or not decoding_more or z.shape[-2] < 2:
        return None
    keep = mask[..., 0, -z.shape[-2]:]  # (..., T): the new tokens' own entries
    if keep.all():
        return None
    if int(np.prod(z.shape[:-2])) < 2:
        raise ValueError(f"{MODEL_TYPE}: attention_mask pads a batch of one row: transformers 4.57 runs the linear"
                         " attention layers over its padding, 5.x zeroes it first; neither is guessed (pass the row"
                         " without its padding, or in a batch of several rows)")
    return keep[..., None].astype(z.dtype)


def qwen3_next_block(x, p, config, layer: Qwen3NextLayer, mask, positions, kv):
    """The six steps on ``x`` (..., N, D) at ``positions``; with ``kv`` (the layer's
    :class:`LinearAttentionState` or KVCache) a decoding step that updates it (no cache is kept for a backward)."""
    # 1. z = RMSNorm_1(x), the (1 + w) norm; a linear layer's padded positions zeroed
    z, norm1 = gemma_rms_norm_formula(x, p["input_norm.weight"], config.eps)  # (..., N, D)
    keep = None
    if layer.linear:
        keep = _padding(z, mask, kv is None or kv.state is None)
        z = z if keep is None else z * keep
        # 2. a = GatedDeltaNet(z), from the state a previous call left when decoding
        delta = {name: p[f"linear_attn.{name}"] for name in _DELTA}
        delta["conv1d.weight"] = delta["conv1d.weight"][:, 0, :]  # (C, K): each channel's own kernel
        a, mixer = gated_delta_net_formula(z, delta, layer.delta,
                                           None if kv is None else kv.state)  # (..., N, D)
        if kv is not None:
            kv.state, kv.length = mixer.state, kv.length + x.shape[-2]
    else:
        # 2. a = GatedAttention(z): partial RoPE at the positions, causal, padding keys masked
        at = positions if kv is None else positions[..., None, :]  # (N,), or (B, 1, t) when decoding
        past = None if kv is None or kv.length == 0 else (kv.keys, kv.values)
        if kv is not None:
            kv.claim(p["self_attn.W_k"])
        a, mixer = gated_attention_formula(z, {name: p[f"self_attn.{name}"] for name in _ATTN}, layer.attention, at,
                                           past, mask)  # (..., N, D)
        if kv is not None:
            kv.append(mixer.kv[0][..., mixer.past:, :], mixer.kv[1][..., mixer.past:, :])
    # 3. h = x + a
    hidden = x + a
    # 4. u = RMSNorm_2(h)
    u, norm2 = gemma_rms_norm_formula(hidden, p["post_attention_norm.weight"], config.eps)  # (..., N, D)
    # 5. m = MoE(u) + sigmoid(u w_s) SwiGLU_s(u), or a dense SwiGLU
    if layer.moe:
        routed, moe = swiglu_moe_formula(u, *(p[name] for name in _MOE), layer.routing)  # (..., N, D)
        shared, shared_cache = gated_shared_expert_formula(u, *(p[name] for name in _SHARED))
        m, mlp = routed + shared, (moe, shared_cache, routed)
    else:
        m, mlp = swiglu_formula(u, *(p[name] for name in _DENSE))
    # 6. y = h + m
    y = hidden + m
    return y, (None if kv is not None else Qwen3NextBlockCache(norm1, keep, mixer, norm2, mlp, layer))


def qwen3_next_block_backward(dy, cache: Qwen3NextBlockCache):
    """The six steps in reverse: ``(dx, grads)`` keyed like the block's params (the chosen experts held fixed)."""
    g = {}
    # 6. y = h + m; 5. the MLP
    if cache.layer.moe:
        moe, shared, _ = cache.mlp
        du, *grads = swiglu_moe_backward(dy, moe)
        g.update(zip(_MOE, grads))
        du_s, *grads = gated_shared_expert_backward(dy, shared)
        g.update(zip(_SHARED, grads))
        du = du + du_s
    else:
        du, *grads = swiglu_backward_formula(dy, cache.mlp)
        g.update(zip(_DENSE, grads))
    # 4. u = RMSNorm_2(h): the gain 1 + w, so dw is the gain's gradient
    dh_norm, g["post_attention_norm.weight"] = rms_norm_backward_formula(du, cache.norm2)
    dh = dy + dh_norm
    # 3. h = x + a; 2. the token mixer
    if cache.layer.linear:
        dz, grads = gated_delta_net_backward(dh, cache.mixer)
        grads["conv1d.weight"] = grads["conv1d.weight"][:, None, :]  # (C, 1, K), as the param
        g.update({f"linear_attn.{name}": grad for name, grad in grads.items()})
        dz = dz if cache.keep is None else dz * cache.keep  # step 1's zeroing
    else:
        dz, grads = gated_attention_backward(dh, cache.mixer)
        g.update({f"self_attn.{name}": grad for name, grad in grads.items()})
    # 1. z = RMSNorm_1(x)
    dx_norm, g["input_norm.weight"] = rms_norm_backward_formula(dz, cache.norm1)
    return dh + dx_norm, g


# ---- the trace ----

def qwen3_next_trace_block(cache, p, config):
    """The trace of one ``Qwen3NextDecoderLayer`` (after ``model.layers.<i>.``), from its caches, in transformers
    5.x's hook order; a full layer's attention steps as ``self_attn:q_rope``, ``:k_rope``, ``:scores``, ``:probs`` (a
    linear layer has no scores: its state replaces them). The MoE block runs on the tokens flattened (B T, ...): the shared expert's modules, then the
    router ``mlp.gate`` (its logits), ``mlp.experts`` (the routed experts' weighted sum) and ``mlp.shared_expert_gate``
    (its logit). Not traced: the experts' inner modules, which run on each expert's own tokens (5.x's
    ``mlp.experts.act_fn`` once per expert; 4.57's ``mlp.experts.<e>.*``), and 4.57's ``linear_attn.conv1d``, the
    padded convolution's raw (B, C, T + K - 1) output (its first T columns are the convolution step before its
    SiLU); 4.57 also calls the router first and has no ``mlp.experts`` module of its own."""
    mixer = cache.mixer
    out = [("input_layernorm", norm_output(cache.norm1))]
    if cache.layer.linear:
        a = linear_output(mixer.out)  # (..., T, D)
        out += [("linear_attn.in_proj_qkvz", linear_output(mixer.qkvz)), ("linear_attn.in_proj_ba", linear_output(mixer.ba)),
                ("linear_attn.norm", mixer.out.x.reshape(-1, config.setting("linear_value_dim"))),  # (B T Hv, dv)
                ("linear_attn.out_proj", a), ("linear_attn", a)]
    else:
        a, att = linear_output(mixer.o_proj), mixer.attention
        steps = dict(attention_steps(att.q, att.k, att.weights, att.scale, False))  # keys repeated to the H heads
        steps["k_rope"] = mixer.kv[0]  # (..., Hkv, T, Dh): each key/value head once
        out += [("self_attn.q_proj", linear_output(mixer.q_proj)), ("self_attn.q_norm", norm_output(mixer.q_norm)),
                ("self_attn.k_proj", linear_output(mixer.k_proj)), ("self_attn.k_norm", norm_output(mixer.k_norm)),
                ("self_attn.v_proj", linear_output(mixer.v_proj))]
        out += [(f"self_attn{SEPARATOR}{step}", value) for step, value in steps.items()]
        out += [("self_attn.o_proj", a), ("self_attn", a)]
    out.append(("post_attention_layernorm", norm_output(cache.norm2)))
    if not cache.layer.moe:
        s = cache.mlp
        m = linear_output(s.down)
        return out + [("mlp.gate_proj", s.a), ("mlp.act_fn", s.a * s.sig), ("mlp.up_proj", s.u),
                      ("mlp.down_proj", m), ("mlp", m)]
    moe, shared, routed = cache.mlp
    s = shared.mlp
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731  (B T, ...)
    return out + [("mlp.shared_expert.gate_proj", flat(s.a)), ("mlp.shared_expert.act_fn", flat(s.a * s.sig)),
                  ("mlp.shared_expert.up_proj", flat(s.u)), ("mlp.shared_expert.down_proj", flat(shared.m)),
                  ("mlp.shared_expert", flat(shared.m)), ("mlp.gate", linear_output(moe.router.linear)),
                  ("mlp.experts", flat(routed)), ("mlp.shared_expert_gate", flat(linear_output(shared.gate))),
                  ("mlp", routed + shared.s * shared.m)]


# ---- the parameter table ----

def D(c):
    return (c.d_model,)


def _s(name):
    return lambda c: c.setting(name)


def _linear(c, i):
    return c.setting("linear_layers")[i]


def _full(c, i):
    return not c.setting("linear_layers")[i]


def _moe(c, i):
    return c.setting("moe_layers")[i]


def _dense(c, i):
    return not c.setting("moe_layers")[i]


def _qkvz(c):
    s = dict(c.settings)
    return (c.d_model, 2 * s["linear_key_heads"] * s["linear_key_dim"] + 2 * s["linear_value_heads"] * s["linear_value_dim"])


def _conv(c):
    s = dict(c.settings)
    return (2 * s["linear_key_heads"] * s["linear_key_dim"] + s["linear_value_heads"] * s["linear_value_dim"], 1,
            s["conv_kernel"])  # nn.Conv1d's (C, 1, K), as stored


_NORM = dict(how="as is", shape=D, init="zeros")  # the (1 + w) norms store w, initialised at 0
_E = "stack experts, transpose"  # transformers 4.57's (and every file's) experts.{e}.<proj>.weight, stacked: (E, in, out)

#: a block's tensors (ours after ``layers.<i>.``, theirs after ``model.layers.<i>.``); ``in_layer``: the linear
#: layers' or the full ones', the experts' or the dense MLP's
BLOCK = (
    Tensor(("input_norm.weight",), "input_layernorm.weight", **_NORM),
    Tensor(("linear_attn.in_proj_qkvz.W",), "linear_attn.in_proj_qkvz.weight", "transpose", _qkvz, in_layer=_linear),
    Tensor(("linear_attn.in_proj_ba.W",), "linear_attn.in_proj_ba.weight", "transpose",
           lambda c: (c.d_model, 2 * c.setting("linear_value_heads")), in_layer=_linear),
    Tensor(("linear_attn.conv1d.weight",), "linear_attn.conv1d.weight", "as is", _conv, in_layer=_linear),
    Tensor(("linear_attn.dt_bias",), "linear_attn.dt_bias", "as is", lambda c: (c.setting("linear_value_heads"),),
           "ones", in_layer=_linear),
    Tensor(("linear_attn.A_log",), "linear_attn.A_log", "as is", lambda c: (c.setting("linear_value_heads"),),
           in_layer=_linear),
    Tensor(("linear_attn.norm.weight",), "linear_attn.norm.weight", "as is",
           lambda c: (c.setting("linear_value_dim"),), "ones", in_layer=_linear),
    Tensor(("linear_attn.out_proj.W",), "linear_attn.out_proj.weight", "transpose",
           lambda c: (c.setting("linear_value_heads") * c.setting("linear_value_dim"), c.d_model), in_layer=_linear),
    Tensor(("self_attn.W_q",), "self_attn.q_proj.weight", "transpose",
           lambda c: (c.d_model, 2 * c.num_heads * c.d_head), in_layer=_full),
    Tensor(("self_attn.W_k",), "self_attn.k_proj.weight", "transpose",
           lambda c: (c.d_model, c.num_kv_heads * c.d_head), in_layer=_full),
    Tensor(("self_attn.W_v",), "self_attn.v_proj.weight", "transpose",
           lambda c: (c.d_model, c.num_kv_heads * c.d_head), in_layer=_full),
    Tensor(("self_attn.W_o",), "self_attn.o_proj.weight", "transpose",
           lambda c: (c.num_heads * c.d_head, c.d_model), in_layer=_full),
    Tensor(("self_attn.q_norm.weight",), "self_attn.q_norm.weight", "as is", lambda c: (c.d_head,), "zeros",
           in_layer=_full),
    Tensor(("self_attn.k_norm.weight",), "self_attn.k_norm.weight", "as is", lambda c: (c.d_head,), "zeros",
           in_layer=_full),
    Tensor(("post_attention_norm.weight",), "post_attention_layernorm.weight", **_NORM),
    Tensor(("mlp.W_router",), "mlp.gate.weight", "transpose", lambda c: (c.d_model, c.num_experts), in_layer=_moe),
    Tensor(("mlp.experts.W_gate",), "mlp.experts.{e}.gate_proj.weight", _E,
           lambda c: (c.num_experts, c.d_model, c.setting("moe_d_ff")), in_layer=_moe),
    Tensor(("mlp.experts.W_up",), "mlp.experts.{e}.up_proj.weight", _E,
           lambda c: (c.num_experts, c.d_model, c.setting("moe_d_ff")), in_layer=_moe),
    Tensor(("mlp.experts.W_down",), "mlp.experts.{e}.down_proj.weight", _E,
           lambda c: (c.num_experts, c.setting("moe_d_ff"), c.d_model), in_layer=_moe),
    Tensor(("mlp.shared_expert.W_gate",), "mlp.shared_expert.gate_proj.weight", "transpose",
           lambda c: (c.d_model, c.setting("shared_d_ff")), in_layer=_moe),
    Tensor(("mlp.shared_expert.W_up",), "mlp.shared_expert.up_proj.weight", "transpose",
           lambda c: (c.d_model, c.setting("shared_d_ff")), in_layer=_moe),
    Tensor(("mlp.shared_expert.W_down",), "mlp.shared_expert.down_proj.weight", "transpose",
           lambda c: (c.setting("shared_d_ff"), c.d_model), in_layer=_moe),
    Tensor(("mlp.shared_expert_gate.W",), "mlp.shared_expert_gate.weight", "transpose", lambda c: (c.d_model, 1),
           in_layer=_moe),
    Tensor(("mlp.W_gate",), "mlp.gate_proj.weight", "transpose", lambda c: (c.d_model, c.d_ff), in_layer=_dense),
    Tensor(("mlp.W_up",), "mlp.up_proj.weight", "transpose", lambda c: (c.d_model, c.d_ff), in_layer=_dense),
    Tensor(("mlp.W_down",), "mlp.down_proj.weight", "transpose", lambda c: (c.d_ff, c.d_model), in_layer=_dense),
)

#: Qwen3NextConfig's keys (``to_dict()`` on 4.57.1 and 5.24) and what each is here; a key of no row is refused
KEYS = {
    **{k: v for k, v in LLAMA_KEYS.items() if k not in ("mlp_bias", "pretraining_tp", "sliding_window")},
    **computed("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
               "linear_conv_kernel_dim", "partial_rotary_factor", "decoder_sparse_step", "mlp_only_layers",
               "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts", "num_experts_per_tok",
               "norm_topk_prob", "full_attention_interval", "layer_types", "attention_bias"),
    "attention_dropout": DROPOUT,
    # the auxiliary load-balancing loss only (transformers adds it to the loss when output_router_logits is set)
    **neutral("router_aux_loss_coef", "output_router_logits"),
}

_LLAMA_FINAL_NORM = LLAMA.final[0]

FAMILY = LLAMA._replace(
    model_type=MODEL_TYPE, read=read,
    fields=LLAMA.fields._replace(
        positive=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"),
        optional_positive=LLAMA.fields.optional_positive + (
            "intermediate_size", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim", "moe_intermediate_size",
            "shared_expert_intermediate_size", "num_experts_per_tok", "decoder_sparse_step",
            "full_attention_interval"),
        flags=LLAMA.fields.flags + ("norm_topk_prob",)),
    allowed=("head_dim", "rotary_pct", "num_experts", "experts_per_token", "settings"), check=check,
    model_title="transformers Qwen3NextForCausalLM (whole model; blocks: model.layers.<i>. as Qwen3NextDecoderLayer)",
    block_title="transformers Qwen3NextDecoderLayer (layers.<i>.)", block=BLOCK,
    final=(_LLAMA_FINAL_NORM._replace(init="zeros"),) + LLAMA.final[1:],
    final_norm=final_norm, final_norm_backward=final_norm_backward,
    layers=qwen3_next_layers, block_forward=qwen3_next_block, block_backward=qwen3_next_block_backward,
    init_block=None, float32_steps=(), keys=KEYS, new_cache=new_cache, trace_block=qwen3_next_trace_block,
    experts_5x=EXPERTS_5X)

#: a small Qwen3-Next (attention_ref.interop.write_random_model): one linear and one full layer, experts with a gated
#: shared expert on both; every config.json field that changes the maths written out (experts 8 wide: transformers
#: 5.x's default grouped_mm kernel needs rows of a multiple of 16 bytes, which 6 float32s are not)
EXAMPLE = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 20, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "partial_rotary_factor": 0.5,
           "rope_theta": 1000.0, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
           "layer_types": [LINEAR, FULL], "linear_num_key_heads": 2, "linear_num_value_heads": 4,
           "linear_key_head_dim": 4, "linear_value_head_dim": 3, "linear_conv_kernel_dim": 3,
           "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8, "shared_expert_intermediate_size": 5,
           "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "attention_bias": False,
           "tie_word_embeddings": False}
FAMILY = FAMILY._replace(example=EXAMPLE)
