"""Where each tensor of a real model goes in our parameter dicts: one table per model, as data.

The family tables come from each family module's parameter table
(:mod:`attention_ref.models.families`); the converters of :mod:`.converters` apply them, and ``docs/model_mappings.md`` is
rendered from them (:func:`render_markdown`), so the two cannot disagree. Every weight is
stored by PyTorch's ``nn.Linear`` as ``(out, in)``: we use the row-vector convention
``y = x W`` with ``W`` of shape ``(in, out)``, so those are transposed. GPT-2's ``Conv1D``
already stores ``(in, out)``. A fused projection is split into equal parts: along the
columns for ``Conv1D`` (``c_attn``: Q, K, V side by side), along the rows for
``nn.MultiheadAttention``'s ``in_proj_weight`` (Q, K, V stacked), before the transpose.
"""
from __future__ import annotations

from typing import NamedTuple

from ..models.families import FAMILY

__all__ = ["Rule", "MAPPINGS", "WHOLE_MODELS", "render_markdown", "HOW"]


class Rule(NamedTuple):
    """One tensor of theirs: its key (after the prefix), our name(s), and how it is turned into ours."""

    theirs: str
    ours: tuple  # one name, or three for a fused Q, K, V
    how: str  # a key of HOW
    optional: bool = False  # absent in some configurations (biases)


#: How a tensor becomes ours, in words (the converters implement each).
HOW = {
    "as is": "copied",
    "transpose": "transposed: (out, in) -> (in, out)",
    "split columns": "split into 3 equal column blocks (Q, K, V), each (in, out)",
    "split rows, transpose": "split into 3 equal row blocks (Q, K, V), each transposed",
    "split": "split into 3 equal parts (Q, K, V)",
    "stack experts, transpose": "one tensor per expert `{e}` = 0..E-1 (E = `num_experts`), each transposed"
                                " (out, in) -> (in, out), stacked on axis 0 into (E, in, out)",
}

_QKV = ("W_q", "W_k", "W_v")
_QKV_BIAS = ("b_q", "b_k", "b_v")

MAPPINGS = {
    "torch.nn.MultiheadAttention": [
        Rule("in_proj_weight", _QKV, "split rows, transpose"),
        Rule("in_proj_bias", _QKV_BIAS, "split", optional=True),
        Rule("out_proj.weight", ("W_o",), "transpose"),
        Rule("out_proj.bias", ("b_o",), "as is", optional=True),
    ],
    "transformers GPT2Attention (attn.)": [
        Rule("c_attn.weight", _QKV, "split columns"),
        Rule("c_attn.bias", _QKV_BIAS, "split"),
        Rule("c_proj.weight", ("W_o",), "as is"),
        Rule("c_proj.bias", ("b_o",), "as is"),
    ],
    "transformers BertLayer (encoder.layer.<i>.)": [
        Rule("attention.self.query.weight", ("self_attn.W_q",), "transpose"),
        Rule("attention.self.query.bias", ("self_attn.b_q",), "as is"),
        Rule("attention.self.key.weight", ("self_attn.W_k",), "transpose"),
        Rule("attention.self.key.bias", ("self_attn.b_k",), "as is"),
        Rule("attention.self.value.weight", ("self_attn.W_v",), "transpose"),
        Rule("attention.self.value.bias", ("self_attn.b_v",), "as is"),
        Rule("attention.output.dense.weight", ("self_attn.W_o",), "transpose"),
        Rule("attention.output.dense.bias", ("self_attn.b_o",), "as is"),
        Rule("attention.output.LayerNorm.weight", ("ln1.gamma",), "as is"),
        Rule("attention.output.LayerNorm.bias", ("ln1.beta",), "as is"),
        Rule("intermediate.dense.weight", ("ffn.W_1",), "transpose"),
        Rule("intermediate.dense.bias", ("ffn.b_1",), "as is"),
        Rule("output.dense.weight", ("ffn.W_2",), "transpose"),
        Rule("output.dense.bias", ("ffn.b_2",), "as is"),
        Rule("output.LayerNorm.weight", ("ln2.gamma",), "as is"),
        Rule("output.LayerNorm.bias", ("ln2.beta",), "as is"),
    ],
    "transformers LlamaAttention (self_attn.)": [
        Rule("q_proj.weight", ("W_q",), "transpose"),
        Rule("k_proj.weight", ("W_k",), "transpose"),
        Rule("v_proj.weight", ("W_v",), "transpose"),
        Rule("o_proj.weight", ("W_o",), "transpose"),
    ],
}
# each family's tables, from its module's parameter table (attention_ref/models/families/)
for _family in FAMILY.values():
    MAPPINGS.setdefault(_family.block_title, [Rule(t.theirs, t.ours, t.how, t.optional) for t in _family.block])
    MAPPINGS.setdefault(_family.model_title, [Rule(t.theirs, t.ours, t.how, t.optional)
                                              for t in _family.top + _family.final])

#: Whole models: their table, the prefix of layer i in their state dict and its block table.
WHOLE_MODELS = {name: (f.model_title, f.their_layer, f.block_title) for name, f in FAMILY.items()}


def render_markdown() -> str:
    """``docs/model_mappings.md``: one table per model, from :data:`MAPPINGS`."""
    out = ["# Real models' tensors, and where they go in attention_ref",
           "",
           "Generated from `attention_ref/interop/mappings.py` (`python tests/interop/test_mappings.py --write`);",
           "the converters of `attention_ref.interop` apply the same tables. PyTorch's `nn.Linear` stores",
           "`(out, in)`; we compute `y = x W` with `W` of shape `(in, out)`, so those weights are transposed.",
           "GPT-2's `Conv1D` stores `(in, out)` already. `<prefix>` is the module's path in the model's",
           "state dict, e.g. `h.0.` in `GPT2Model`, `layers.0.` in `LlamaModel` (pass it as `prefix=`).",
           "",
           "The converters return the weights only; the settings come from the model's config:",
           "",
           "| config (transformers) | argument here |",
           "|---|---|",
           "| `num_attention_heads`, `n_head` | `num_heads` |",
           "| `num_key_value_heads` (Llama) | `num_kv_heads` (read from the shapes when omitted) |",
           "| `rope_theta` (Llama) | `rope_base` |",
           "| `rms_norm_eps` (Llama), `layer_norm_epsilon` (GPT-2), `layer_norm_eps` (BERT) | `eps` |",
           "| `scale_attn_weights=False` (GPT-2) | `scale=1.0` |",
           "| `hidden_act=\"gelu\"` (BERT) | `activation=\"gelu_exact\"` |",
           "",
           "Behaviour that differs: a query whose every key is masked gets a zero output here (as",
           "PyTorch's `scaled_dot_product_attention`), while transformers' eager attention gives it",
           "the mean of all values (its softmax over a row of equal large negative scores).",
           "transformers computes Llama's RMSNorm, RoPE angles and eager softmax in float32 even in a",
           "float64 model; here everything runs in the inputs' dtype, so a float64 Llama matches ours to",
           "about 1e-7, not 1e-10, unless those steps are computed in float64 too (the tests patch them).",
           ""]
    for model, rules in MAPPINGS.items():
        out += [f"## {model}", "", "| theirs | ours | how |", "|---|---|---|"]
        for r in rules:
            ours = ", ".join(f"`{n}`" for n in r.ours)
            out.append(f"| `<prefix>{r.theirs}`{' (optional)' if r.optional else ''} | {ours} | {HOW[r.how]} |")
        out.append("")
    return "\n".join(out)
