"""Qwen3-MoE (transformers' ``Qwen3MoeForCausalLM``): Qwen3 whose MLP is a mixture of SwiGLU experts,
softmax-routed with a top-k, on most layers.

The difference from :mod:`.qwen3`: step 5 of a block, ``m = MLP(u)``, is on a *sparse* layer a mixture
of experts (:func:`attention_ref.nn.swiglu_moe_forward`): router logits ``u W_router`` (no bias), a
softmax over all ``E`` experts, the top ``k`` of it (normalised to sum 1 when ``norm_topk_prob``), each
chosen expert's SwiGLU of width ``moe_intermediate_size``, their weighted sum. A layer ``i`` is sparse
when it is not in ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0`` (transformers'
``Qwen3MoeDecoderLayer``); the others keep Qwen3's dense SwiGLU of width ``intermediate_size``. The block
is :mod:`attention_ref.nn.qwen3_moe_block`'s six steps (one definition; its backward holds each token's
chosen experts fixed, as autograd does).

Reader: Qwen3's fields (:func:`.llama.read_llama`: RoPE as Qwen3, ``head_dim``) with Qwen3MoeConfig's defaults (``num_key_value_heads`` 4, ``max_position_embeddings``
32768), and ``num_experts`` (4.57's name; 5.x writes ``num_local_experts``) 128, ``num_experts_per_tok``
8, ``moe_intermediate_size`` 768, ``norm_topk_prob`` False, ``decoder_sparse_step`` 1,
``mlp_only_layers`` [], and ``use_sliding_window`` (False; when true every layer attends to its last
``sliding_window`` keys, 4096 by default, as transformers' sliding mask). The per-layer plan and the experts' width are the config's ``settings``:
``sparse_layers`` (a bool per layer), ``moe_d_ff``, ``norm_topk_prob``. A ``head_dim``, ``num_experts`` or
``decoder_sparse_step`` written as null is refused by name (transformers reads None there and cannot build the
model; an absent key takes the default). ``router_aux_loss_coef`` and
``output_router_logits`` only concern the auxiliary loss, which :func:`attention_ref.lm_loss` leaves
out (transformers' language-modelling loss; the auxiliary term is
:func:`attention_ref.nn.load_balancing_loss_forward`).

Checkpoints store one ``nn.Linear`` per expert (``mlp.experts.{e}.gate_proj.weight``, 4.57's and 5.x's
``save_pretrained`` both); they are stacked here into ``mlp.experts.W_gate`` (E, D, F) (the table's
``"stack experts, transpose"``); transformers 5.x's ``model.state_dict()`` fuses them
(:data:`attention_ref.models.family.EXPERTS_5X`), which the loader and ``to_transformers`` also speak.
"""
from __future__ import annotations

from ...nn.moe_routing import Routing
from ...nn.qwen3_moe_block import Qwen3MoeLayer, qwen3_moe_block_backward, qwen3_moe_block_formula
from ..config import refuse
from ..family import COMPUTED, EXPERTS_5X, Features, Tensor, computed, neutral
from ..trace_steps import linear_output, norm_output
from .llama import read_llama, trace_llama_attention, trace_llama_block
from .qwen3 import FAMILY as QWEN3

__all__ = ["FAMILY", "sparse_layers", "qwen3_moe_layers", "qwen3_moe_block", "qwen3_moe_trace_block"]

MODEL_TYPE = "qwen3_moe"


def sparse_layers(d, layers):
    """Which of ``layers`` layers hold experts, as transformers' ``Qwen3MoeDecoderLayer`` decides."""
    only = d.get("mlp_only_layers")
    only = [] if only is None else only
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
        raise ValueError(f"{MODEL_TYPE}: mlp_only_layers must be a list of layer indices, got {only!r}")
    step = d.get("decoder_sparse_step", 1)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:  # null too: transformers' modulo fails
        raise ValueError(f"{MODEL_TYPE}: decoder_sparse_step must be a positive integer, got {step!r}")
    return tuple(i not in only and (i + 1) % step == 0 for i in range(layers))


def read(d):
    """An LMConfig of Qwen3-MoE from its ``config.json`` (the module docstring lists the fields)."""
    for name in ("num_experts", "num_local_experts"):
        if name in d and d[name] is None:  # not the default 128: transformers builds no experts from null
            raise ValueError(f"{MODEL_TYPE}: {name} is null in config.json; give the number of experts")
    given = [(name, d[name]) for name in ("num_experts", "num_local_experts") if d.get(name) is not None]
    if len(given) == 2 and given[0][1] != given[1][1]:
        raise ValueError(f"{MODEL_TYPE}: config.json gives num_experts = {given[0][1]!r} and num_local_experts ="
                         f" {given[1][1]!r} (one field, 4.57's and 5.x's spelling); keep one of them")
    experts = given[0][1] if given else 128
    if "head_dim" in d and d["head_dim"] is None:  # Qwen3MoeAttention reads it with getattr: None, not hidden / heads
        raise ValueError(f"{MODEL_TYPE}: head_dim is null in config.json (transformers cannot build that model); give"
                         " the width or leave the key out (hidden_size / num_attention_heads)")
    if d.get("norm_topk_prob", False) not in (True, False):
        refuse("norm_topk_prob", d["norm_topk_prob"], MODEL_TYPE)
    settings = {"sparse_layers": sparse_layers(d, d["num_hidden_layers"]),
                "moe_d_ff": d.get("moe_intermediate_size", 768), "norm_topk_prob": d.get("norm_topk_prob", False)}
    if d.get("use_sliding_window", False) not in (True, False):
        refuse("use_sliding_window", d["use_sliding_window"], MODEL_TYPE)
    # use_sliding_window: every layer attends to its last sliding_window keys (Qwen3MoeConfig keeps the window only
    # then; no max_window_layers in Qwen3-MoE)
    window = d.get("sliding_window", 4096) if d.get("use_sliding_window", False) else None
    d = {"num_key_value_heads": 4, "max_position_embeddings": 32768,  # Qwen3MoeConfig's defaults
         **d, "use_sliding_window": False, "sliding_window": window}
    return read_llama(d, MODEL_TYPE, num_experts=experts, experts_per_token=d.get("num_experts_per_tok", 8),
                      settings=settings)


def check(config):
    """A Qwen3-MoE config has its experts and a plan of one bool per layer."""
    if config.num_experts is None:
        raise ValueError(f"a {config.family} model needs num_experts and experts_per_token (its mixture of experts)")
    plan = config.setting("sparse_layers")
    if not isinstance(plan, tuple) or len(plan) != config.num_layers or any(not isinstance(b, bool) for b in plan):
        raise ValueError(f"{config.family}: settings sparse_layers must be one bool per layer ({config.num_layers}),"
                         f" got {plan!r}")
    width = config.setting("moe_d_ff")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"{config.family}: settings moe_d_ff (moe_intermediate_size) must be a positive integer,"
                         f" got {width!r}")
    if config.setting("norm_topk_prob") not in (True, False):
        raise ValueError(f"{config.family}: settings norm_topk_prob must be true or false,"
                         f" got {config.setting('norm_topk_prob')!r}")
    unknown = sorted(set(dict(config.settings)) - {"sparse_layers", "moe_d_ff", "norm_topk_prob"})
    if unknown:
        raise ValueError(f"{config.family}: settings {unknown} are not Qwen3-MoE's (sparse_layers, moe_d_ff,"
                         " norm_topk_prob)")


def qwen3_moe_layers(config):
    """Each layer's :class:`attention_ref.nn.Qwen3MoeLayer`: RoPE's frequencies, and the routing on a sparse layer."""
    theta = config.rope_frequencies()
    routing = Routing(config.experts_per_token, "softmax_topk", config.setting("norm_topk_prob"))
    return [Qwen3MoeLayer(config.num_heads, config.num_kv_heads, config.eps, theta, routing if sparse else None,
                          config.sliding_window) for sparse in config.setting("sparse_layers")]


def qwen3_moe_block(x, p, config, layer: Qwen3MoeLayer, mask, positions, kv):
    """Step 2, one block: :func:`attention_ref.nn.qwen3_moe_block_formula`'s six steps over the sequence, or
    with ``kv`` its decoding step at ``positions`` (B, t)."""
    return qwen3_moe_block_formula(x, p, layer, positions, mask, kv)  # (..., T, D)


def qwen3_moe_trace_block(cache, p, config):
    """The trace of one ``Qwen3MoeDecoderLayer`` (after ``model.layers.<i>.``): a dense layer's is Qwen3's; a
    sparse layer's ends on ``mlp.gate`` (the router's logits, (B T, E)), ``mlp.experts`` (5.x's module: the
    weighted sum, (B T, D)) and ``mlp`` (B, T, D) in place of the dense MLP's modules (4.57's experts are one
    module per expert, each run on the tokens routed to it: not traced)."""
    if not cache.routed:
        return trace_llama_block(cache, p, config)
    m = cache.m  # (..., T, D)
    return trace_llama_attention(cache, p) + [
        ("post_attention_layernorm", norm_output(cache.norm_2)), ("mlp.gate", linear_output(cache.mlp.router.linear)),
        ("mlp.experts", m.reshape(-1, m.shape[-1])), ("mlp", m)]


def _sparse(c, i):
    return c.setting("sparse_layers")[i]


def _dense(c, i):
    return not c.setting("sparse_layers")[i]


def _F(c):
    return c.setting("moe_d_ff")


#: Qwen3's block with the MLP's rows per layer: the dense SwiGLU on the dense layers, the router and the stacked
#: experts on the sparse ones (theirs after ``model.layers.<i>.``; ``{e}``: each expert)
BLOCK = tuple(t._replace(in_layer=_dense) if t.ours[0].startswith("mlp.") else t for t in QWEN3.block) + (
    Tensor(("mlp.W_router",), "mlp.gate.weight", "transpose", lambda c: (c.d_model, c.num_experts),
           in_layer=_sparse),
    Tensor(("mlp.experts.W_gate",), "mlp.experts.{e}.gate_proj.weight", "stack experts, transpose",
           lambda c: (c.num_experts, c.d_model, _F(c)), in_layer=_sparse),
    Tensor(("mlp.experts.W_up",), "mlp.experts.{e}.up_proj.weight", "stack experts, transpose",
           lambda c: (c.num_experts, c.d_model, _F(c)), in_layer=_sparse),
    Tensor(("mlp.experts.W_down",), "mlp.experts.{e}.down_proj.weight", "stack experts, transpose",
           lambda c: (c.num_experts, _F(c), c.d_model), in_layer=_sparse),
)

#: Qwen3MoeConfig's keys (``to_dict()`` on 4.57.1 and 5.24) and what each is here; a key of no row is refused
KEYS = {
    **{k: v for k, v in QWEN3.keys.items() if k != "max_window_layers"},
    **computed("num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
               "decoder_sparse_step", "mlp_only_layers"),
    **neutral("router_aux_loss_coef", "output_router_logits"),  # the auxiliary loss only
    "use_sliding_window": COMPUTED, "sliding_window": COMPUTED,  # a window on every layer when switched on
}

FAMILY = QWEN3._replace(
    model_type=MODEL_TYPE, read=read, check=check, keys=KEYS, features=Features(qk_norm="head"), block=BLOCK,
    fields=QWEN3.fields._replace(
        optional_positive=QWEN3.fields.optional_positive + (
            "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"),
        flags=QWEN3.fields.flags + ("norm_topk_prob",)),
    allowed=QWEN3.allowed + ("sliding_window", "num_experts", "experts_per_token", "settings"),
    model_title="transformers Qwen3MoeForCausalLM (whole model; blocks: model.layers.<i>. as Qwen3MoeDecoderLayer)",
    block_title="transformers Qwen3MoeDecoderLayer (layers.<i>.)", layers=qwen3_moe_layers,
    block_forward=qwen3_moe_block, block_backward=qwen3_moe_block_backward, init_block=None,
    float32_steps=(("qwen3_moe", "Qwen3Moe"),), experts_5x=EXPERTS_5X, trace_block=qwen3_moe_trace_block)

#: a small Qwen3-MoE (attention_ref.interop.write_random_model): three layers, the first dense by mlp_only_layers,
#: four experts, two per token (normalised), every config.json field that changes the maths written out
EXAMPLE = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 24, "moe_intermediate_size": 12,
           "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
           "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True, "decoder_sparse_step": 1,
           "mlp_only_layers": [0], "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "hidden_act": "silu", "use_sliding_window": False, "tie_word_embeddings": False}
FAMILY = FAMILY._replace(example=EXAMPLE)
