"""DeepSeek-V3 (transformers' ``DeepseekV3ForCausalLM``; Kimi K2 has its architecture): Llama's
embedding, final norm and head around a block of multi-head latent attention (MLA) and a dense
SwiGLU on the first ``first_k_dense_replace`` layers, a mixture of experts with grouped sigmoid
routing and shared experts on the others.

Reader: Llama's sizes (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
``intermediate_size`` (the dense layers' MLP), ``rms_norm_eps``, ``max_position_embeddings``,
``tie_word_embeddings``, ``pad_token_id``), RoPE from ``rope_theta`` / ``rope_scaling`` (4.x) or
``rope_parameters`` (5.x): the plain one or YaRN (its attention factor, from ``factor``, ``mscale``
and ``mscale_all_dim``, multiplies cos and sin; ``mscale_all_dim`` also multiplies the scores'
scale by ``m^2``, ``m = 0.1 mscale_all_dim ln(factor) + 1``, as transformers' ``DeepseekV3Attention``
does); and DeepSeek-V3's own constants, kept in ``LMConfig.settings`` under transformers' names:
``q_lora_rank`` (null: one query projection), ``kv_lora_rank``, ``qk_nope_head_dim``,
``qk_rope_head_dim``, ``v_head_dim``, ``rope_interleave``, ``first_k_dense_replace``,
``moe_intermediate_size``, ``n_shared_experts``, ``n_group``, ``topk_group``, ``norm_topk_prob``,
``routed_scaling_factor`` (``n_routed_experts`` and ``num_experts_per_tok`` are LMConfig's
``num_experts`` and ``experts_per_token``). Absent keys take DeepseekV3Config's defaults. Refused
by name: ``attention_bias`` (biases on ``q_a_proj``, ``kv_a_proj_with_mqa``, ``o_proj``),
``hidden_act`` other than ``silu``, ``num_key_value_heads`` other than the heads (MLA's keys are
per head), a ``head_dim`` or ``qk_head_dim`` that disagrees with the RoPE and key widths (4.57 would
rotate ``head_dim`` features), a RoPE type other than the plain one and YaRN, a grouping transformers
cannot route (experts not a multiple of ``n_group``, groups of fewer than 2, ``topk_group`` above
``n_group``, more experts per token than the kept groups hold).

Routing computes as transformers 5.x: the experts of the groups not kept have a choice score of minus
infinity. transformers 4.57.1 gives them 0 instead, so on a token where a chosen expert's choice score
(sigmoid plus correction bias) is negative, 4.57.1 may choose an expert of a dropped group and its
numbers differ from 5.x's and these (measured on random models: 8.5e-3 and 0.44 relative in the logits
on two seeds; equal on every seed with positive scores). The score is data, not a config field, so it
is said here rather than refused (:mod:`attention_ref.nn.moe_routing`).

The whole model's steps are Llama's (:mod:`attention_ref.models.families.llama`); the block is
:func:`attention_ref.nn.deepseek_block.deepseek_block_forward` (transformers' module in brackets):

1. ``z = RMSNorm_1(x)``                                  (``input_layernorm``)
2. ``a = MLA(z)``: the query (``q_proj``, or ``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``), the
   latent (``kv_a_proj_with_mqa``, ``kv_a_layernorm``), per-head keys and values from it
   (``kv_b_proj``), RoPE on the decoupled ``q_pe`` and shared ``k_pe``, causal attention, ``o_proj``
3. ``h = x + a``
4. ``u = RMSNorm_2(h)``                                  (``post_attention_layernorm``)
5. ``m = SwiGLU(u)`` on layers ``i < first_k_dense_replace`` (``mlp``), else the routed experts
   (``mlp.gate``, ``mlp.experts``) plus the shared ones (``mlp.shared_experts``)
6. ``y = h + m``

Decoding caches each layer's latent (``kv_lora_rank + qk_rope_head_dim`` numbers per token,
:class:`attention_ref.nn.MLADecodeCache`, this family's ``new_cache``) and runs step 2 in the
absorbed form (:func:`attention_ref.nn.mla_decode_absorbed`), where transformers caches per-head
keys and values: the outputs agree, the caches differ by design.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...nn.deepseek_block import DeepSeekLayer, deepseek_block_backward, deepseek_block_formula
from ...nn.mla import MLADecodeCache, MLAShape, mla_scale
from ...nn.moe_routing import Routing
from ..config import LMConfig, refuse
from ..family import BASE_KEYS, DROPOUT, EXPERTS_5X, NEUTRAL, ConfigFields, Features, Tensor, computed, neutral
from ..trace_steps import SEPARATOR, attention_steps, linear_output, norm_output
from .llama import FAMILY as LLAMA, rope_spellings, token_id

__all__ = ["FAMILY", "DEEPSEEK_V3_DEFAULTS", "DeepSeekV3Layer", "deepseek_v3_layers", "deepseek_v3_block",
           "deepseek_v3_new_cache", "deepseek_v3_trace_block"]

MODEL_TYPE = "deepseek_v3"

#: DeepseekV3Config's defaults (4.57.1 and 5.24) of the fields this reader reads
DEEPSEEK_V3_DEFAULTS = {
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_shared_experts": 1, "n_routed_experts": 256,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "norm_topk_prob": True, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "rope_interleave": True}
#: the settings (LMConfig.settings) a DeepSeek-V3 config holds, each a positive integer unless said below
SETTINGS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_interleave",
            "first_k_dense_replace", "moe_intermediate_size", "n_shared_experts", "n_group", "topk_group",
            "norm_topk_prob", "routed_scaling_factor")
_FLAGS = ("rope_interleave", "norm_topk_prob")


def _get(d, name):
    """``d[name]``, or DeepseekV3Config's default when absent."""
    return d.get(name, DEEPSEEK_V3_DEFAULTS.get(name))


def _rope(d):
    """``(rope_theta, rope_scaling)``: the plain RoPE, or YaRN (its parameters as given)."""
    rope, theta = rope_spellings(d, MODEL_TYPE)
    if rope["rope_type"] not in ("default", "yarn"):
        refuse("the RoPE scaling rope_type", rope["rope_type"], MODEL_TYPE)  # 4.57 and 5.x scale the scores differently
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        refuse("the RoPE partial_rotary_factor", rope["partial_rotary_factor"], MODEL_TYPE)
    if rope["rope_type"] == "default":
        extra = sorted(set(rope) - {"rope_type", "rope_theta", "partial_rotary_factor"})
        if extra:  # 4.57 reads rope_scaling's factor and mscale_all_dim for the scores whatever its type; 5.x does not
            refuse("the plain RoPE's parameters", extra, MODEL_TYPE)
        return float(theta), None
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    if scaling.get("factor") is None:
        refuse("the YaRN factor", scaling.get("factor"), MODEL_TYPE)  # 4.57 needs it (5.x would derive it)
    if scaling.get("original_max_position_embeddings") is None:  # transformers falls back to the model's
        scaling["original_max_position_embeddings"] = _get(d, "max_position_embeddings")
    return float(theta), scaling


def _check_setting(name, value):
    """One setting's value: a JSON boolean (the flags), a positive number (``routed_scaling_factor``),
    an integer >= 0 (``first_k_dense_replace``), null or a positive integer (``q_lora_rank``), else a
    positive integer; else an error naming it."""
    if name in _FLAGS:
        ok, what = isinstance(value, bool), "true or false"
    elif name == "routed_scaling_factor":
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < float("inf")
        what = "a positive number"
    elif name == "q_lora_rank" and value is None:
        return
    else:
        low = 0 if name == "first_k_dense_replace" else 1
        ok, what = not isinstance(value, bool) and isinstance(value, int) and value >= low, f"an integer >= {low}"
    if not ok:
        raise ValueError(f"{MODEL_TYPE}: {name} must be {what}, got {value!r}")


def read(d):
    """An LMConfig of DeepSeek-V3 from its ``config.json`` (the module docstring lists the fields)."""
    if d.get("hidden_act", "silu") != "silu":
        refuse("hidden_act", d["hidden_act"], MODEL_TYPE)
    if d.get("attention_bias", False) is not False:
        refuse("attention_bias", d["attention_bias"], MODEL_TYPE)
    H = d["num_attention_heads"]
    if d.get("num_key_value_heads") not in (None, H):
        refuse("num_key_value_heads (MLA reads a key and a value per head)", d["num_key_value_heads"], MODEL_TYPE)
    settings = {name: _get(d, name) for name in SETTINGS}
    for name, value in settings.items():
        _check_setting(name, value)
    settings["routed_scaling_factor"] = float(settings["routed_scaling_factor"])
    dn, dr = settings["qk_nope_head_dim"], settings["qk_rope_head_dim"]
    for name, want in (("head_dim", dr), ("qk_head_dim", dn + dr)):
        if d.get(name) not in (None, want):
            refuse(f"{name} (transformers computes it as {want} from qk_nope_head_dim and qk_rope_head_dim)", d[name],
                   MODEL_TYPE)
    theta, scaling = _rope(d)
    E, k = _get(d, "n_routed_experts"), _get(d, "num_experts_per_tok")
    for name, value in (("n_routed_experts", E), ("num_experts_per_tok", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{MODEL_TYPE}: {name} must be a positive integer, got {value!r}")
    D = d["hidden_size"]
    return LMConfig(family=MODEL_TYPE, vocab_size=d["vocab_size"], d_model=D, num_layers=d["num_hidden_layers"],
                    num_heads=H, num_kv_heads=H, d_ff=_get(d, "intermediate_size"),
                    max_positions=_get(d, "max_position_embeddings"), eps=_get(d, "rms_norm_eps"), rope_theta=theta,
                    rope_scaling=scaling, head_dim=None if dr * H == D else dr,
                    tie_word_embeddings=d.get("tie_word_embeddings", False), pad_token_id=token_id(d),
                    num_experts=E, experts_per_token=k, settings=settings)


def check(config):
    """A DeepSeek-V3 config holds every one of its settings, RoPE over ``qk_rope_head_dim``
    features, and a grouping of experts transformers can route; errors by name."""
    s = dict(config.settings)
    missing = [name for name in SETTINGS if name not in s]
    if missing or set(s) - set(SETTINGS):
        raise ValueError(f"{config.family}: settings must hold exactly {sorted(SETTINGS)}; missing {missing},"
                         f" unknown {sorted(set(s) - set(SETTINGS))}")
    for name in SETTINGS:
        _check_setting(name, s[name])
    if s["qk_rope_head_dim"] % 2:
        raise ValueError(f"{config.family}: qk_rope_head_dim = {s['qk_rope_head_dim']} must be even (RoPE rotates pairs)")
    if config.d_head != s["qk_rope_head_dim"]:
        raise ValueError(f"{config.family}: head_dim must be qk_rope_head_dim = {s['qk_rope_head_dim']} (RoPE's width),"
                         f" got {config.d_head}")
    if config.num_kv_heads != config.num_heads:
        raise ValueError(f"{config.family}: num_kv_heads must be num_heads (MLA reads a key per head)")
    E, k, G, kept = config.num_experts, config.experts_per_token, s["n_group"], s["topk_group"]
    if E is None or k is None:
        raise ValueError(f"{config.family}: a model needs num_experts and experts_per_token (its mixture of experts)")
    if E % G or E // G < 2:
        raise ValueError(f"{config.family}: n_routed_experts = {E} must split into n_group = {G} groups of at least 2"
                         " experts (a group's score is its two best)")
    if kept > G:
        raise ValueError(f"{config.family}: topk_group = {kept} is more than n_group = {G}")
    if k > kept * (E // G):
        raise ValueError(f"{config.family}: num_experts_per_tok = {k} is more than the {kept * (E // G)} experts of"
                         f" the topk_group = {kept} kept groups")


class DeepSeekV3Layer(NamedTuple):
    """A layer's constants, read once per run: its block's (MLA's shape, the norms' epsilon, the
    routing or None on a dense layer) and RoPE's frequencies (dr/2,)."""

    block: DeepSeekLayer
    theta: np.ndarray


def deepseek_v3_layers(config):
    """Each layer's :class:`DeepSeekV3Layer`: the first ``first_k_dense_replace`` dense, the rest routed."""
    s = dict(config.settings)
    scaling = None if config.rope_scaling is None else dict(config.rope_scaling)
    dn, dr = s["qk_nope_head_dim"], s["qk_rope_head_dim"]
    scale = mla_scale(dn + dr, *(() if scaling is None else (scaling["factor"], scaling.get("mscale_all_dim") or 0.0)))
    attn = MLAShape(config.num_heads, s["q_lora_rank"], s["kv_lora_rank"], dn, dr, s["v_head_dim"], eps=config.eps,
                    interleaved=s["rope_interleave"], scale=scale, rope_factor=config.rope_attention_factor())
    routing = Routing(config.experts_per_token, "sigmoid_topk", s["norm_topk_prob"], s["n_group"], s["topk_group"],
                      s["routed_scaling_factor"])
    theta = config.rope_frequencies()
    return [DeepSeekV3Layer(DeepSeekLayer(attn, config.eps, None if i < s["first_k_dense_replace"] else routing), theta)
            for i in range(config.num_layers)]


def deepseek_v3_block(x, p, config, layer: DeepSeekV3Layer, mask, positions, kv):
    """Step 2, one block: :func:`attention_ref.nn.deepseek_block.deepseek_block_formula` over the
    sequence, or with ``kv`` (the layer's :class:`attention_ref.nn.MLADecodeCache`) its decoding
    step at ``positions`` (B, t); the model's key mask (..., 1, T) gains the heads' axis."""
    mask = None if mask is None else mask[..., None, :, :]  # (..., 1, 1, T)
    return deepseek_block_formula(x, p, layer.block, layer.theta, positions, mask, kv)


def deepseek_v3_new_cache(config, i):
    """Layer ``i``'s decoding state: its latents (:class:`attention_ref.nn.MLADecodeCache`)."""
    return MLADecodeCache()


def _swiglu_steps(prefix, mlp):
    """A SwiGLU's modules (``gate_proj``, ``act_fn``, ``up_proj``, ``down_proj``, then the MLP itself) from its cache."""
    m = linear_output(mlp.down)  # (..., T, D)
    return [(f"{prefix}.gate_proj", mlp.a), (f"{prefix}.act_fn", mlp.a * mlp.sig), (f"{prefix}.up_proj", mlp.u),
            (f"{prefix}.down_proj", m), (prefix, m)]


def _routed_sum(moe):
    """The routed experts' weighted sum (B T, D), as the forward added it, from the mixture's cache."""
    out = np.zeros((int(np.prod(moe.x_shape[:-1])), moe.x_shape[-1]), moe.w.dtype)
    for _, tokens, slots, _, y_e in moe.experts:
        np.add.at(out, tokens, moe.w[tokens, slots][:, None] * y_e)
    return out


def deepseek_v3_trace_block(cache, p, config):
    """The trace of one ``DeepseekV3DecoderLayer`` (after ``model.layers.<i>.``), from its caches, in
    transformers' hook order: the query's projections (``q_proj``, or ``q_a_proj``, ``q_a_layernorm``,
    ``q_b_proj``), the latent's (``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``), the
    attention's steps (``q_rope`` and ``k_rope`` the per-head [nope | pe] queries and keys, (..., H, T,
    dn + dr)), ``o_proj``; then the dense SwiGLU's modules, or 5.x's MoE modules: ``mlp.gate`` (the
    router's logits, (B T, E)), ``mlp.experts`` (the routed experts' weighted sum, (B T, D)) and the
    shared experts' (4.57's router returns the chosen indices, and its experts are one module per
    expert, each run on the tokens routed to it: not traced). ``self_attn.kv_b_proj`` is (..., T,
    H (dn + dv)) as 4.57 records it; 5.x reads the latent viewed as one head, (B, 1, T, H (dn + dv))."""
    attn = cache.attn
    out = [("input_layernorm", attn.kv_a.x)]
    if attn.q_a is None:
        out.append(("self_attn.q_proj", linear_output(attn.q_b)))
    else:
        out += [("self_attn.q_a_proj", linear_output(attn.q_a)), ("self_attn.q_a_layernorm", attn.q_b.x),
                ("self_attn.q_b_proj", linear_output(attn.q_b))]
    a = attn.attn
    out += [("self_attn.kv_a_proj_with_mqa", linear_output(attn.kv_a)), ("self_attn.kv_a_layernorm", attn.kv_b.x),
            ("self_attn.kv_b_proj", linear_output(attn.kv_b))]
    out += [(f"self_attn{SEPARATOR}{step}", value) for step, value in attention_steps(a.q, a.k, a.weights, a.scale,
                                                                                       grouped=False)]
    o = linear_output(attn.o)  # (..., T, D)
    out += [("self_attn.o_proj", o), ("self_attn", o), ("post_attention_layernorm", norm_output(cache.norm_2))]
    if cache.layer.routing is None:
        return out + _swiglu_steps("mlp", cache.mlp)
    moe, shared = cache.mlp
    routed = _routed_sum(moe)  # (B T, D)
    shared_steps = _swiglu_steps("mlp.shared_experts", shared)
    m = routed.reshape(moe.x_shape) + shared_steps[-1][1]  # (..., T, D)
    return out + [("mlp.gate", linear_output(moe.router.linear)), ("mlp.experts", routed)] + shared_steps + [("mlp", m)]


def _lora(c):
    return c.setting("q_lora_rank") is not None


def _qk(c):
    return c.num_heads * (c.setting("qk_nope_head_dim") + c.setting("qk_rope_head_dim"))


def _dense(c, i):
    return i < c.setting("first_k_dense_replace")


def _moe(c, i):
    return i >= c.setting("first_k_dense_replace")


def _shared(c):
    return c.setting("n_shared_experts") * c.setting("moe_intermediate_size")


def D(c):
    return (c.d_model,)


def _expert(ours, theirs, shape):
    """A row of the routed experts: transformers 4.57's one module per expert ``{e}``, stacked on axis 0."""
    return Tensor((f"mlp.experts.{ours}",), f"mlp.experts.{{e}}.{theirs}.weight", "stack experts, transpose", shape,
                  in_layer=_moe)


#: a block's tensors, in the order of the forward (ours after ``layers.<i>.``, theirs after ``model.layers.<i>.``)
BLOCK = (
    Tensor(("input_norm.weight",), "input_layernorm.weight", "as is", D, "ones"),
    Tensor(("self_attn.W_q",), "self_attn.q_proj.weight", "transpose", lambda c: (c.d_model, _qk(c)),
           when=lambda c: not _lora(c)),
    Tensor(("self_attn.W_q_a",), "self_attn.q_a_proj.weight", "transpose",
           lambda c: (c.d_model, c.setting("q_lora_rank")), when=_lora),
    Tensor(("self_attn.q_a_norm.weight",), "self_attn.q_a_layernorm.weight", "as is",
           lambda c: (c.setting("q_lora_rank"),), "ones", when=_lora),
    Tensor(("self_attn.W_q_b",), "self_attn.q_b_proj.weight", "transpose", lambda c: (c.setting("q_lora_rank"), _qk(c)),
           when=_lora),
    Tensor(("self_attn.W_kv_a",), "self_attn.kv_a_proj_with_mqa.weight", "transpose",
           lambda c: (c.d_model, c.setting("kv_lora_rank") + c.setting("qk_rope_head_dim"))),
    Tensor(("self_attn.kv_a_norm.weight",), "self_attn.kv_a_layernorm.weight", "as is",
           lambda c: (c.setting("kv_lora_rank"),), "ones"),
    Tensor(("self_attn.W_kv_b",), "self_attn.kv_b_proj.weight", "transpose",
           lambda c: (c.setting("kv_lora_rank"), c.num_heads * (c.setting("qk_nope_head_dim") + c.setting("v_head_dim")))),
    Tensor(("self_attn.W_o",), "self_attn.o_proj.weight", "transpose",
           lambda c: (c.num_heads * c.setting("v_head_dim"), c.d_model)),
    Tensor(("post_attention_norm.weight",), "post_attention_layernorm.weight", "as is", D, "ones"),
    # a dense layer's SwiGLU (i < first_k_dense_replace)
    Tensor(("mlp.W_gate",), "mlp.gate_proj.weight", "transpose", lambda c: (c.d_model, c.d_ff), in_layer=_dense),
    Tensor(("mlp.W_up",), "mlp.up_proj.weight", "transpose", lambda c: (c.d_model, c.d_ff), in_layer=_dense),
    Tensor(("mlp.W_down",), "mlp.down_proj.weight", "transpose", lambda c: (c.d_ff, c.d_model), in_layer=_dense),
    # a routed layer's router, its choice bias (a buffer the training adjusts; no gradient), experts and shared experts
    Tensor(("mlp.W_router",), "mlp.gate.weight", "transpose", lambda c: (c.d_model, c.num_experts), in_layer=_moe),
    Tensor(("mlp.e_score_correction_bias",), "mlp.gate.e_score_correction_bias", "as is", lambda c: (c.num_experts,),
           "zeros", in_layer=_moe),
    _expert("W_gate", "gate_proj", lambda c: (c.num_experts, c.d_model, c.setting("moe_intermediate_size"))),
    _expert("W_up", "up_proj", lambda c: (c.num_experts, c.d_model, c.setting("moe_intermediate_size"))),
    _expert("W_down", "down_proj", lambda c: (c.num_experts, c.setting("moe_intermediate_size"), c.d_model)),
    Tensor(("mlp.shared.W_gate",), "mlp.shared_experts.gate_proj.weight", "transpose", lambda c: (c.d_model, _shared(c)),
           in_layer=_moe),
    Tensor(("mlp.shared.W_up",), "mlp.shared_experts.up_proj.weight", "transpose", lambda c: (c.d_model, _shared(c)),
           in_layer=_moe),
    Tensor(("mlp.shared.W_down",), "mlp.shared_experts.down_proj.weight", "transpose",
           lambda c: (_shared(c), c.d_model), in_layer=_moe),
)

#: DeepseekV3Config's keys (``to_dict()`` on 4.57.1 and 5.24) and what each is here; a key of no row is refused
KEYS = {
    **BASE_KEYS,
    **computed("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
               "hidden_act", "rms_norm_eps", "max_position_embeddings", "rope_theta", "rope_scaling",
               "rope_parameters", "head_dim", "qk_head_dim", "attention_bias", "n_routed_experts",
               "num_experts_per_tok", *SETTINGS),
    "attention_dropout": DROPOUT,
    "pretraining_tp": NEUTRAL,  # no step of 4.57's or 5.24's modeling_deepseek_v3 reads it
    # 5.24: the auxiliary loss's switch, and the multi-token-prediction layers DeepseekV3ForCausalLM does not build
    **neutral("output_router_logits", "num_nextn_predict_layers", "num_mtp_layers"),
}

FAMILY = LLAMA._replace(
    model_type=MODEL_TYPE, read=read, features=Features(rope_attention_factor=True),
    fields=ConfigFields(
        positive=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"),
        optional_positive=("num_key_value_heads", "head_dim", "qk_head_dim", "max_position_embeddings",
                           "intermediate_size", "moe_intermediate_size", "q_lora_rank", "kv_lora_rank",
                           "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
                           "num_experts_per_tok", "n_shared_experts", "n_group", "topk_group"),
        flags=("tie_word_embeddings", "attention_bias", "rope_interleave", "norm_topk_prob"),
        numbers=("rms_norm_eps", "rope_theta", "routed_scaling_factor"), strings=("hidden_act",)),
    allowed=("head_dim", "rope_scaling", "num_experts", "experts_per_token", "settings"),
    check=check, model_title="transformers DeepseekV3ForCausalLM (whole model; blocks: model.layers.<i>. as"
                             " DeepseekV3DecoderLayer)",
    block_title="transformers DeepseekV3DecoderLayer (layers.<i>.)", block=BLOCK, layers=deepseek_v3_layers,
    block_forward=deepseek_v3_block, block_backward=deepseek_block_backward, init_block=None, float32_steps=(),
    new_cache=deepseek_v3_new_cache, keys=KEYS, experts_5x=EXPERTS_5X, trace_block=deepseek_v3_trace_block)

#: a small DeepSeek-V3 (attention_ref.interop.write_random_model): every config.json field that changes the maths;
#: a dense first layer and two routed ones (4 experts in 2 groups, 1 group kept, 2 experts per token, a shared
#: expert), a query compression, YaRN shrunk to the tiny model (RoPE 4 wide, base 500) with mscale_all_dim
EXAMPLE = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 24, "moe_intermediate_size": 8,
           "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 12,
           "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 6, "n_routed_experts": 4,
           "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 2, "topk_group": 1, "norm_topk_prob": True,
           "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "rope_interleave": True,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 500.0,
           "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                            "mscale_all_dim": 0.8, "original_max_position_embeddings": 64},
           "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False}
FAMILY = FAMILY._replace(example=EXAMPLE)
