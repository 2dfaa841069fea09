"""The reference of a layer or a whole model, and the catalogue's layer- and model-level mistakes as
mistaken variants of it (:func:`attention_ref.compare.module`, :func:`attention_ref.compare.model`).

A model is held as transformers holds it: ``state`` (transformers' tensor names -> float64 arrays)
and ``cfg`` (``config.json`` as a dict). A mistaken variant is an edit of ``(state, cfg)`` (or of a
case's positions and mask) whose reference computes what the mistaken code computes: RoPE pairs
(2i, 2i + 1) are the half layout on queries and keys whose features are reordered (the scores are
the same dot products); heads tiled with ``.repeat`` are the right grouping of reordered query
heads; a forgotten ``1 + w`` is the right norm of ``w - 1``; a wrong scale is the right one on
scaled queries; a wrong base, eps, window, activation or residual is the config saying so. The
reference then runs as it always does (the family's block, :func:`attention_ref.models.lm_trace`):
no formula is written a second time. A variant names a mistake only when it reproduces the user's
outputs on every case (STYLE item 28).
"""
from __future__ import annotations

import copy
import json
import math
from typing import Callable, NamedTuple

import numpy as np

from ..interop.pretrained import from_transformers_state, to_transformers
from ..models.config import LMConfig, family_of
from ..nn.feed_forward import gelu_forward
from ..nn.geglu import geglu_formula
from ..nn.gemma_rms_norm import gemma_rms_norm_formula
from ..models.params import block_params, init_lm_params
from ..models.trace import lm_trace
from ..models.trace_steps import SEPARATOR

__all__ = ["Variant", "layer_variants", "model_variants", "drawn_state", "block_reference", "model_reference",
           "module_names", "KINDS", "transformers_state", "read_params"]

#: the kinds of module :func:`attention_ref.compare.module` compares
KINDS = ("attention", "mlp", "decoder_layer")

#: the values people use, tried for a mistake with a wrong value (issue 39)
THETAS = (10000.0, 500000.0, 1000000.0)
EPSILONS = (1e-5, 1e-6, 1e-300)  # 1e-300: eps left out (the config refuses 0; no row is that small)


_CONFIGS = {}


def config_of(cfg: dict) -> LMConfig:
    """``LMConfig.from_dict(cfg)``, read once per distinct config (an LMConfig is immutable)."""
    try:
        key = json.dumps(cfg, sort_keys=True)
    except (TypeError, ValueError):  # a value JSON cannot hold: read it every time
        return LMConfig.from_dict(cfg)
    if key not in _CONFIGS:
        if len(_CONFIGS) > 256:
            _CONFIGS.clear()
        _CONFIGS[key] = LMConfig.from_dict(cfg)
    return _CONFIGS[key]


def drawn_state(cfg: dict, seed: int) -> dict:
    """Weights for ``cfg``'s model under transformers' names, float64, drawn so that every step
    matters: matrices with unit-size outputs, norm weights and biases away from 1 and 0."""
    config = config_of(cfg)
    family = family_of(config)
    params = init_lm_params(config, seed=seed, dtype=np.float64)
    rng = np.random.default_rng(seed + 1)
    drawn = {}
    for key, value in params.items():
        value = np.asarray(value, np.float64)
        if value.ndim >= 2:
            inside = key.startswith(family.layer_prefix + ".") or key.startswith("lm_head")
            drawn[key] = rng.standard_normal(value.shape) / (math.sqrt(value.shape[-2]) if inside else 1.0)
        else:  # a norm's weight (ones) or a bias (zeros): away from both
            drawn[key] = value + 0.3 * rng.standard_normal(value.shape)
    return transformers_state(drawn, config)


def transformers_state(params, config) -> dict:
    """``params`` under transformers' names, float64; a tied head once, as the token table (as
    ``save_pretrained`` writes it), so that an edit of the table edits the head too."""
    state = to_transformers(params, config)
    if config.tie_word_embeddings:
        state = {k: v for k, v in state.items() if k.rsplit(".", 1)[0] not in ("lm_head", "embed_out")}
    return {k: np.asarray(v, np.float64) for k, v in state.items()}


def read_params(state, cfg, dtype=np.float64):
    """Our params of ``(state, cfg)``, in ``dtype`` (float64; float32 for a port's lower precision)."""
    return _params(state, cfg, dtype)[0]


def _params(state, cfg, dtype=np.float64):
    config = config_of(cfg)
    return from_transformers_state(state, config, dtype), config


def module_names(cfg: dict, state=None) -> dict:
    """``{"attention": "self_attn", "mlp": "mlp", "layer": "model.layers.0."}``: the family's names of
    layer 0's attention and MLP, after the layer's prefix (read from the block's trace)."""
    config = config_of(cfg)
    family = family_of(config)
    _, p, cache = _one_block(cfg, state)
    entries = [name for name, _ in family.trace_block(cache, p, config)]
    attention = next(n.split(SEPARATOR)[0] for n in entries if SEPARATOR in n)
    return {"attention": attention, "mlp": "mlp", "layer": family.their_layer.format(i=0), "entries": entries}


def _one_block(cfg, state=None):
    """(family, layer 0's params, a cache) of a small run: only for the trace's names."""
    config = config_of(cfg)
    family = family_of(config)
    state = drawn_state(cfg, 0) if state is None else state
    params = from_transformers_state(state, config, np.float64)
    p = family.prepare(block_params(params, config, 0), config)
    x = np.zeros((1, 2, config.d_model))
    _, cache = family.block_forward(x, p, config, family.layers(config)[0], None, np.arange(2), None)
    return family, p, cache


def block_reference(state, cfg, x, positions, keep, params=None) -> dict:
    """Layer 0's trace (names after the layer's prefix; ``""`` is the layer's output) for the block
    input ``x`` (B, T, D), ``positions`` (B, T) and ``keep`` (B, T) booleans or None, one batch row
    at a time (each row with its own positions); ``params`` the state read already (in ``x``'s
    dtype), or None (read in ``x``'s dtype)."""
    params, config = _params(state, cfg, x.dtype) if params is None else (params, config_of(cfg))
    family = family_of(config)
    p = family.prepare(block_params(params, config, 0), config)
    layer = family.layers(config)[0]
    rows = []
    for b in range(x.shape[0]):
        mask = None if keep is None or keep[b].all() else keep[b:b + 1, None, :]  # (1, 1, T)
        y, cache = family.block_forward(x[b:b + 1], p, config, layer, mask, np.asarray(positions[b]), None)
        rows.append({**dict(family.trace_block(cache, p, config)), "": y})
    return {k: np.concatenate([r[k] for r in rows], axis=0) for k in rows[0]}


def model_reference(state, cfg, ids, attention_mask, dtype=np.float64) -> dict:
    """:func:`lm_trace` of the model ``(state, cfg)`` in ``dtype`` (float64; float32 for a port's
    lower precision)."""
    params, config = _params(state, cfg, dtype)
    return lm_trace(ids, params, config, attention_mask)


# ---------------------------------------------------------------- the variants
class Variant(NamedTuple):
    """A mistaken variant of the reference: ``edit(state, cfg) -> (state, cfg)`` (new dicts) and,
    for a mistake in the inputs' use, ``case(positions, keep) -> (positions, keep)``."""

    mistake: str
    label: str
    edit: Callable | None = None
    case: Callable | None = None
    compute: Callable | None = None  # (state, cfg, trace, x, prefix) -> {name: output} over layer 0's trace


def _gelu_compute(approximate):
    """GELU ``approximate`` in place of the MLP's activation, on layer 0's trace: the activation's
    output, then the down projection's (linear in it) and the MLP's."""
    def compute(state, cfg, trace, x, prefix):
        keys = list(trace)
        mlp = prefix + "mlp"
        inside = [k for k in keys if k.startswith(mlp + ".")]
        acts = [k for k in inside if k.rsplit(".", 1)[1] in ("act", "act_fn", "activation_fn")]
        if not acts:
            return None
        act, down = acts[0], inside[-1]
        pre = trace[keys[keys.index(act) - 1]]
        F = trace[act].shape[-1]
        gate, up = (pre[..., :F], pre[..., F:]) if pre.shape[-1] == 2 * F else (pre, trace.get(mlp + ".up_proj"))
        new_act, _ = gelu_forward(gate, approximate)
        term = new_act - trace[act] if up is None else (new_act - trace[act]) * up
        config = config_of(cfg)
        theirs = down[len(prefix):] + ".weight"
        W = state[family_of(config).their_layer.format(i=0) + theirs]
        delta = term @ (W if theirs in stored_in_out(config) else W.T)  # a Conv1D's (in, out); a Linear's (out, in)
        return {act: new_act, down: trace[down] + delta, mlp: trace[mlp] + delta}
    return compute


def _without_post_norms(state, cfg, trace, x, prefix):
    """Gemma's layer 0 without its two post-norms: ``h = x + a``, ``y = h + GeGLU(GRMS_pre_ff(h))``."""
    params, config = _params(state, cfg)
    family = family_of(config)
    p = family.prepare(block_params(params, config, 0), config)
    attention = next(k.split(SEPARATOR)[0] for k in trace if k.startswith(prefix) and SEPARATOR in k)
    h = x + trace[attention]
    u, _ = gemma_rms_norm_formula(h, p["pre_feedforward_norm.weight"], config.eps)
    m, _ = geglu_formula(u, p["mlp.W_gate"], p["mlp.W_up"], p["mlp.W_down"])
    return {prefix + "pre_feedforward_layernorm": u, prefix + "mlp": m, prefix.rstrip("."): h + m}


def _with(cfg, **fields):
    out = copy.deepcopy(cfg)
    out.update(fields)
    return out


#: our names of the q, k, v projections' weights and biases (fused or apart), and of the output projection's
_QKV_LEAVES = {"W_q": "q", "W_k": "k", "W_v": "v", "b_q": "q", "b_k": "k", "b_v": "v", "W_qkv": "qkv", "b_qkv": "qkv"}
_OUT_LEAVES = ("W_o", "W_dense")
#: the table's ``how`` of a weight that transformers stores (out, in) (a Linear's); the others keep (in, out)
_OUT_IN = ("transpose", "split rows, transpose")


def _leaf(name):
    return name.rsplit(".", 1)[-1]


def stored_in_out(config) -> set:
    """transformers' names (after the layer prefix) of the block's matrices stored (in, out), as a
    Conv1D stores them (GPT-2's), read from the family's table (its rows' ``how``)."""
    rows = family_of(config).block
    return {t.theirs for t in rows if t.how not in _OUT_IN and len(t.shape(config)) == 2 and _leaf(t.ours[0])[0] == "W"}


def qkv_layouts(config) -> dict:
    """The fused layout's q, k, v feature indices, ``{"per_head": ..., "blocks": ...}``: each a dict
    ``{"q": (H, Dh), "k": (Hkv, Dh), "v": (Hkv, Dh)}`` of indices into the fused axis
    (:mod:`attention_ref.nn.fused_qkv`; ``"per_head"`` only when ``Hkv = H``)."""
    H, Hkv, Dh = config.num_heads, config.num_kv_heads, config.d_head
    out = {"blocks": {"q": np.arange(H * Dh).reshape(H, Dh), "k": H * Dh + np.arange(Hkv * Dh).reshape(Hkv, Dh),
                      "v": (H + Hkv) * Dh + np.arange(Hkv * Dh).reshape(Hkv, Dh)}}
    if H == Hkv:
        out["per_head"] = {n: np.arange(H)[:, None] * 3 * Dh + i * Dh + np.arange(Dh) for i, n in enumerate("qkv")}
    return out


def _layout(state, config):
    """Where the query, key and value features sit in the attention's weights, read from the
    family's table (our names and ``how`` of each row) and ``Features.fused_qkv``: a list of
    ``(name suffix, axis, {"q": (H, Dh), "k": (Hkv, Dh), "v": (Hkv, Dh)} indices)`` for the weights
    and biases, and ``(name suffix, axis, (H, Dh) indices)`` of the output projection's inputs
    (None when the table has none)."""
    H, Hkv, Dh = config.num_heads, config.num_kv_heads, config.d_head
    apart = {"q": np.arange(H * Dh).reshape(H, Dh), "k": np.arange(Hkv * Dh).reshape(Hkv, Dh),
             "v": np.arange(Hkv * Dh).reshape(Hkv, Dh)}
    fused = config.features.fused_qkv
    parts, out = [], None
    for row in family_of(config).block:
        leaves = [_leaf(n) for n in row.ours]
        if all(leaf in _QKV_LEAVES for leaf in leaves):
            axis = 0 if leaves[0][0] == "b" or row.how in _OUT_IN else 1  # the features' axis in theirs
            if len(leaves) == 1 and leaves[0] in _QKV_LEAVES and _QKV_LEAVES[leaves[0]] != "qkv":
                n = _QKV_LEAVES[leaves[0]]
                parts.append((row.theirs, axis, {n: apart[n]}))
            elif fused is not None:  # one tensor holding the three, in the family's layout
                parts.append((row.theirs, axis, qkv_layouts(config)[fused]))
        elif len(leaves) == 1 and leaves[0] in _OUT_LEAVES and out is None:
            out = (row.theirs, 1 if row.how in _OUT_IN else 0, np.arange(H * Dh).reshape(H, Dh))
    return parts, out


def _reindexed(state, suffix, axis, moves):
    """``state`` with each tensor named ``*suffix`` reindexed: ``new[..., to] = old[..., frm]`` along ``axis``."""
    out = dict(state)
    for name, value in state.items():
        if name.endswith(suffix):
            source = np.arange(value.shape[axis])
            for to, frm in moves:
                source[np.ravel(to)] = np.ravel(frm)
            out[name] = np.take(value, source, axis=axis)
    return out


def _qkv_edit(config, fn):
    """An edit reindexing the q/k/v features: ``fn(part, idx) -> new idx`` (or None: unchanged)."""
    def edit(state, cfg):
        parts, _ = _layout(state, config)
        for suffix, axis, idx in parts:
            moves = [(idx[n], fn(n, idx[n])) for n in idx if fn(n, idx[n]) is not None]
            state = _reindexed(state, suffix, axis, moves)
        return state, cfg
    return edit


def _scaled_queries(config, factor):
    def edit(state, cfg):
        parts, _ = _layout(state, config)
        out = dict(state)
        for suffix, axis, idx in parts:
            if "q" not in idx:
                continue
            for name, value in state.items():
                if name.endswith(suffix):
                    value = value.copy()
                    index = [slice(None)] * value.ndim
                    index[axis] = np.ravel(idx["q"])
                    value[tuple(index)] *= factor
                    out[name] = value
        return out, cfg
    return edit


def _theta_key(cfg, family):
    for key in ("rope_theta", "rotary_emb_base"):
        if key in cfg:
            return key
    numbers = [n for n in family.fields.numbers if "theta" in n or "base" in n]
    return numbers[0] if numbers else None


def _set_theta(cfg, key, theta):
    out = _with(cfg, **{key: theta})
    for name in ("rope_parameters", "rope_scaling"):
        part = out.get(name)
        if isinstance(part, dict) and "rope_theta" in part:
            out[name] = {**part, "rope_theta": theta}
    return out


def _field(family, kind, cfg):
    """The config.json field of the norms' eps (``kind="eps"``) or the activation (``"act"``)."""
    pool = family.fields.numbers if kind == "eps" else family.fields.strings
    names = [n for n in pool if ("eps" in n if kind == "eps" else ("act" in n))]
    given = [n for n in names if n in cfg]
    return (given or names or [None])[0]


def _rotary_dims(config):
    if not config.features.rotary:
        return 0
    r = int(config.d_head * config.rotary_pct)
    return r - r % 2


def _norm_names(state):
    return [n for n in state if n.endswith("norm.weight") or n.endswith("layernorm.weight")]


def offset_norms(config) -> bool:
    """The norms are ``(1 + w)`` ones storing ``w``: the family's table initialises their weights at 0."""
    return any(t.init == "zeros" and _leaf(t.ours[0]) == "weight" and "norm" in t.theirs
               for t in family_of(config).block)


def embedding_scale(config) -> float:
    """The factor by which step 1 multiplies the token table's rows (1.0: none, or not a pure
    factor: GPT-2 adds the positions' rows, BLOOM a layer norm), found by running the family's
    ``embed`` on one token of a one-row table."""
    key = config  # the whole config: a family's factor may read any field
    try:
        hash(key)
    except TypeError:  # a config holding an unhashable value: probed every time
        key = object()
    if key not in _SCALES:
        if len(_SCALES) > 256:
            _SCALES.clear()
        family = family_of(config)
        rng = np.random.default_rng(0)
        params = {}
        for t in family.top:
            shape = t.shape(config)
            shape = (1,) + tuple(shape[1:]) if t.ours[0] == family.token_table else tuple(shape)
            params[t.ours[0]] = rng.uniform(0.5, 1.5, shape) * rng.choice((-1.0, 1.0), shape)
        row = params[family.token_table][0]
        try:
            x, _ = family.embed(np.zeros((1, 1), np.int64), np.zeros(1, np.int64), params, config)
            ratio = np.asarray(x, np.float64).reshape(-1) / row
            _SCALES[key] = float(ratio[0]) if np.allclose(ratio, ratio[0], rtol=1e-12, atol=0) else 1.0
        except Exception:  # a step 1 that reads more than the top rows: no pure factor claimed
            _SCALES[key] = 1.0
    return _SCALES[key]


_SCALES = {}




def layer_variants(cfg: dict, kind: str, state: dict) -> list:
    """The mistaken variants that apply to ``cfg``'s family at the layer level, for ``kind``
    (``"attention"``, ``"mlp"``, ``"decoder_layer"`` or ``"model"``: all of them); ``state`` the
    weights they will edit (for which tensors the model has)."""
    config = config_of(cfg)
    family = family_of(config)
    H, Hkv, Dh = config.num_heads, config.num_kv_heads, config.d_head
    attention = kind in ("attention", "decoder_layer", "model")
    mlp = kind in ("mlp", "decoder_layer", "model")
    out = []
    if attention:
        rotary = _rotary_dims(config)
        if rotary:
            def interleaved(part, idx, r=rotary):
                if part == "v":
                    return None
                new = idx.copy()
                new[:, :r] = np.concatenate([idx[:, 0:r:2], idx[:, 1:r:2]], axis=1)
                return new
            out.append(Variant("rope_layout", "RoPE pairs (2i, 2i + 1)", _qkv_edit(config, interleaved)))
            key = _theta_key(cfg, family)
            if key is not None:
                for theta in THETAS:
                    if theta != config.rope_theta:
                        out.append(Variant("rope_theta", f"RoPE base {theta:g}",
                                           lambda s, c, t=theta, k=key: (s, _set_theta(c, k, t))))
            if config.rope_scaling is not None:
                def unscaled(s, c):
                    c = _with(c, rope_scaling=None) if c.get("rope_scaling") else copy.deepcopy(c)
                    part = c.get("rope_parameters")
                    if isinstance(part, dict):
                        c["rope_parameters"] = {k: v for k, v in part.items() if k in ("rope_theta",)} | {
                            "rope_type": "default"}
                    return s, c
                out.append(Variant("rope_scaling_ignored", "rope_scaling left out", unscaled))
            if config.rotary_pct < 1:
                def whole(s, c):
                    c = _with(c, rotary_pct=1.0) if "rotary_pct" in c else copy.deepcopy(c)
                    part = c.get("rope_parameters")
                    if isinstance(part, dict) and "partial_rotary_factor" in part:
                        c["rope_parameters"] = {**part, "partial_rotary_factor": 1.0}
                    return s, c
                out.append(Variant("partial_rotary", "every feature rotated", whole))
            if kind != "model":  # a whole model's positions are 0 .. T-1 (transformers' default)
                out.append(Variant("rope_position_offset", "positions 0 .. T-1",
                                   case=lambda pos, keep: (np.broadcast_to(np.arange(pos.shape[-1]), pos.shape), keep)))
                out.append(Variant("rope_position_offset", "the first row's positions",
                                   case=lambda pos, keep: (np.broadcast_to(pos[:1], pos.shape), keep)))
        if kind != "model":  # the model level's own (model_variants)
            out.append(Variant("padding_ignored", "the attention mask left out", case=lambda pos, keep: (pos, None)))
        if Hkv < H:
            G = H // Hkv
            sigma = np.array([(h % G) * Hkv + h // G for h in range(H)])

            def tiled(state, cfg):
                parts, (o_suffix, o_axis, heads) = _layout(state, config)
                for suffix, axis, idx in parts:
                    if "q" in idx:
                        state = _reindexed(state, suffix, axis, [(idx["q"], idx["q"][sigma])])
                state = _reindexed(state, o_suffix, o_axis, [(heads, heads[sigma])])
                return state, cfg
            out.append(Variant("gqa_head_order", "key/value heads tiled (.repeat)", tiled))
        right = config.head_scale[0] or Dh ** -0.5
        wrongs = [config.d_model ** -0.5, 1.0 / Dh, 1.0, Dh ** -0.5]
        if config.query_pre_attn_scalar is not None:
            wrongs.append(float(config.query_pre_attn_scalar) ** -0.5)
        if not config.features.qk_norm:  # scaled queries are the scaled scores (not through a q-norm)
            for wrong in dict.fromkeys(wrongs):
                if abs(wrong / right - 1) > 1e-12:
                    out.append(Variant("attention_scale", f"scale {wrong:.6g}", _scaled_queries(config, wrong / right)))
        if config.attn_softcap is not None:
            out.append(Variant("softcap_missing", "no soft-capping",
                               lambda s, c: (s, _with(c, attn_logit_softcapping=None))))
        if config.sliding_window is not None:
            for w in (config.sliding_window + 1, config.sliding_window - 1):
                if w >= 1:
                    out.append(Variant("window_off_by_one", f"window {w}",
                                       lambda s, c, w=w: (s, _with(c, sliding_window=w))))
            kinds = cfg.get("layer_types")
            if isinstance(kinds, list) and len(set(kinds)) > 1:
                for every in ("sliding_attention", "full_attention"):
                    out.append(Variant("window_wrong_layers", f"every layer {every}",
                                       lambda s, c, e=every: (s, _with(c, layer_types=[e] * len(kinds)))))
        parts, _ = _layout(state, config)
        if any(name.endswith(suffix) for suffix, _, _ in parts if suffix.endswith("bias") for name in state):
            def unbiased(state, cfg):
                out_ = dict(state)
                for suffix, axis, idx in _layout(state, config)[0]:
                    if suffix.endswith("bias"):
                        for name in state:
                            if name.endswith(suffix):
                                value = state[name].copy()
                                for n in ("q", "k", "v"):
                                    if n in idx:
                                        value[np.ravel(idx[n])] = 0.0
                                out_[name] = value
                return out_, cfg
            out.append(Variant("qkv_bias_missing", "q, k, v biases left out", unbiased))
        fused = config.features.fused_qkv
        for wrong, layout in qkv_layouts(config).items():  # the fused weight read in the other layout
            if fused is not None and wrong != fused:
                def misread(state, cfg, layout=layout):
                    for suffix, axis, idx in _layout(state, config)[0]:
                        if set(idx) == {"q", "k", "v"}:
                            state = _reindexed(state, suffix, axis, [(idx[n], layout[n]) for n in "qkv"])
                    return state, cfg
                label = "split as [q | k | v]" if wrong == "blocks" else "split per head [q_h | k_h | v_h]"
                out.append(Variant("fused_qkv_split", f"the fused q, k, v {label}", misread))
    in_out = stored_in_out(config)
    if in_out:  # a square one loads either way round
        def transposed(state, cfg):
            out_ = dict(state)
            for name, value in state.items():
                if any(name.endswith(n) for n in in_out) and value.ndim == 2 and value.shape[0] == value.shape[1]:
                    out_[name] = value.T.copy()
            return out_, cfg
        out.append(Variant("conv1d_transpose", "square (in, out) weights used as (out, in)", transposed))
    if mlp:
        act = _field(family, "act", cfg)
        now = None if act is None else cfg.get(act, family.example.get(act) if family.example else None)
        if isinstance(now, str) and now.startswith("gelu"):
            other = "tanh" if now == "gelu" else "none"
            out.append(Variant("gelu_variant", "the exact GELU" if other == "none" else "GELU's tanh approximation",
                               compute=_gelu_compute(other)))

        def swapped(state, cfg):
            out_ = dict(state)
            for name, value in state.items():
                if name.endswith("mlp.gate_proj.weight"):
                    up = name.replace("gate_proj", "up_proj")
                    out_[name], out_[up] = state[up], value
                elif name.endswith("mlp.gate_up_proj.weight"):
                    half = value.shape[0] // 2
                    out_[name] = np.concatenate([value[half:], value[:half]], axis=0)
            return out_, cfg
        if any(w in " ".join(state) for w in ("gate_proj", "gate_up_proj")):
            out.append(Variant("gate_up_swapped", "activation on the up projection", swapped))
    if kind in ("decoder_layer", "model"):
        eps_key = _field(family, "eps", cfg)
        if eps_key is not None:
            for eps in EPSILONS:
                if eps != config.eps:
                    out.append(Variant("rms_norm_eps", f"eps {eps:g}",
                                       lambda s, c, e=eps, k=eps_key: (s, _with(c, **{k: e}))))
        if any("rms" in n for n in family.fields.numbers) or offset_norms(config):  # RMSNorm families
            shift = -1.0 if offset_norms(config) else 1.0

            def offset(state, cfg, shift=shift):
                return {k: (v + shift if k in _norm_names(state) else v) for k, v in state.items()}, cfg
            out.append(Variant("norm_offset", "norm weights w" if shift < 0 else "norm weights 1 + w", offset))
        if offset_norms(config) and config.features.norm_placement == "sandwich":  # Gemma's GeGLU block
            out.append(Variant("post_norm_missing", "no post-norms", compute=_without_post_norms))
        if config.features.parallel_residual:
            out.append(Variant("parallel_residual", "residual " + ("sequential" if config.use_parallel_residual else
                                                                    "parallel"),
                               lambda s, c: (s, _with(c, use_parallel_residual=not config.use_parallel_residual))))
    return out


def model_variants(cfg: dict, state: dict, their_head=None) -> list:
    """The layer-level variants on every layer, the padding mask left out, and the model-level
    mistakes: the embedding's scale, the head tied or not (``their_head``: the user's own
    ``lm_head.weight``, when it has one)."""
    config = config_of(cfg)
    family = family_of(config)
    out = layer_variants(cfg, "model", state)
    out.append(Variant("padding_ignored", "the attention mask left out", case=lambda ids, keep: (ids, None)))
    table = family.top[0].theirs
    factor = math.sqrt(config.d_model)
    if embedding_scale(config) != 1.0:
        out.append(Variant("embedding_scale", "embeddings not scaled by sqrt(D)",
                           lambda s, c: ({**s, table: s[table] / factor}, c)))
    else:
        out.append(Variant("embedding_scale", "embeddings scaled by sqrt(D)",
                           lambda s, c: ({**s, table: s[table] * factor}, c)))
    if config.final_softcap is not None:
        out.append(Variant("softcap_missing", "no soft-capping of the logits",
                           lambda s, c: (s, _with(c, final_logit_softcapping=None))))
    head_names = [n for n in state if n.rsplit(".", 1)[0] in ("lm_head", "embed_out")]
    if config.tie_word_embeddings and their_head is not None:
        head = np.asarray(their_head, np.float64)
        if head.shape == state[table].shape and not np.array_equal(head, state[table]):
            out.append(Variant("tied_head", "a separate lm_head (the model's own)",
                               lambda s, c: ({**s, "lm_head.weight": head}, _with(c, tie_word_embeddings=False))))
    if not config.tie_word_embeddings:
        out.append(Variant("tied_head", "the head tied to the embedding",
                           lambda s, c: ({k: v for k, v in s.items() if k not in head_names},
                                         _with(c, tie_word_embeddings=True))))
    return out

