"""Convert real models' weights into the parameter dicts of this package, pure NumPy.

``state`` is a mapping from names to arrays: ``{k: v.numpy() for k, v in
model.state_dict().items()}``, an ``.npz`` file, or a ``.safetensors`` file when the
``safetensors`` package is installed (see :func:`load_state`). ``prefix`` is the module's
path inside the model's state dict. The tables of :mod:`.mappings` say where each tensor
goes and how; a missing or mis-shaped tensor is a ``KeyError`` / ``ValueError`` naming it.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .mappings import MAPPINGS

__all__ = ["load_state", "from_torch_multihead_attention", "from_gpt2_attention", "from_llama_attention",
           "from_gpt2_block", "from_llama_block", "from_bert_layer"]


def load_state(source) -> Mapping:
    """Names -> arrays from a mapping (returned as is), an ``.npz`` or a ``.safetensors`` file."""
    if isinstance(source, Mapping):
        return source
    path = Path(source)
    if path.suffix == ".npz":
        from .safetensors import open_regular  # a FIFO or a device is refused before it is read

        raw, _ = open_regular(path, ".npz file")
        with raw, np.load(raw) as f:
            return {k: f[k] for k in f.files}
    if path.suffix == ".safetensors":
        from .safetensors import read_safetensors  # plain NumPy, no safetensors package needed

        return read_safetensors(path)
    raise ValueError(f"state must be a mapping, an .npz or a .safetensors file, got {source!r}")


def _tensor(state, key):
    if key not in state:
        near = sorted(k for k in state if k.split(".")[-1] == key.split(".")[-1])[:5]
        raise KeyError(f"the state has no tensor {key!r}" + (f"; keys ending alike: {near}" if near else ""))
    return np.asarray(state[key])


def _apply(model, state, prefix, copy=True, rules=None, experts=None):
    """Apply one table of :data:`MAPPINGS` to ``state`` (keys ``prefix + theirs``); ``copy=False``
    returns views (for a state that is already ours); ``rules``: those of the table to apply (a
    block's that its layer has; None: all); ``experts``: E, the number of experts a ``"stack experts,
    transpose"`` row reads (``{e}`` = 0..E-1 in its name)."""
    state = load_state(state)
    out = {}
    for rule in MAPPINGS[model] if rules is None else rules:
        key = prefix + rule.theirs
        if rule.how == "stack experts, transpose":
            out[rule.ours[0]] = _stack_experts(state, key, experts)
            continue
        if rule.optional and key not in state:
            out.update({name: None for name in rule.ours})
            continue
        t = _tensor(state, key)
        if rule.how in ("split columns", "split rows, transpose", "split"):
            axis = 1 if rule.how == "split columns" else 0
            if t.ndim <= axis or t.shape[axis] % 3:
                raise ValueError(f"{key} of shape {t.shape} does not split into 3 equal parts along axis {axis}"
                                 " (Q, K and V fused)")
            parts = np.split(t, 3, axis=axis)  # Q, K, V
            if rule.how == "split rows, transpose":
                parts = [p.T if copy else _transposed_in_place(p) for p in parts]  # (out, in) -> (in, out)
        elif rule.how == "transpose":
            if t.ndim != 2:
                raise ValueError(f"{key} must be a matrix (out, in), got shape {t.shape}")
            parts = [t.T if copy else _transposed_in_place(t)]  # nn.Linear's (out, in) -> our (in, out)
        else:
            parts = [t]
        # copies, ours to keep, with their rows contiguous (C order: see _transposed_in_place)
        out.update({name: np.array(p, order="C") if copy else p for name, p in zip(rule.ours, parts)})
    return out


def _stack_experts(state, key, experts):
    """Experts ``0..E-1`` of ``key`` (``{e}`` in it), each ``nn.Linear``'s (out, in), as our (E, in, out)."""
    if isinstance(experts, bool) or not isinstance(experts, (int, np.integer)) or experts < 1:
        raise ValueError(f"{key} is stored per expert: the config's num_experts must be a positive integer,"
                         f" got {experts!r}")
    first = _tensor(state, key.format(e=0))
    if first.ndim != 2:
        raise ValueError(f"{key.format(e=0)} must be a matrix (out, in), got shape {first.shape}")
    out = np.empty((experts,) + first.shape[::-1], dtype=first.dtype)  # (E, in, out): one copy, no views
    for e in range(experts):
        t = first if e == 0 else _tensor(state, key.format(e=e))
        if t.shape != first.shape or t.dtype != first.dtype:
            raise ValueError(f"{key.format(e=e)} has shape {t.shape} and dtype {t.dtype}; expert 0's"
                             f" {key.format(e=0)} has {first.shape} and {first.dtype}: the experts must agree")
        out[e] = t.T  # (out, in) -> (in, out)
    return out
def _transposed_in_place(t):
    """``t.T`` (in, out) of a matrix ``t`` (out, in) of a state that is ours (one read of a file, every
    tensor a view on it), with its rows contiguous (C order): the numbers are moved within ``t``'s own
    bytes, so the loaded model still takes about the file's size. One row times a C-ordered matrix
    (a decoding step's product) runs BLAS's faster matrix-vector kernel than on the transposed view
    (docs/performance.md, "Decoding at batch 1"). A read-only or non-contiguous ``t``: the view."""
    if not (t.flags.c_contiguous and t.flags.writeable):
        return t.T
    flat = t.reshape(-1)  # a view: t is C-contiguous
    flat[:] = t.T.reshape(-1)  # a (t.size,) copy of the transposed numbers, written over t's own
    return flat.reshape(t.shape[::-1])  # (in, out), C order, on the file's bytes


def from_torch_multihead_attention(state, prefix=""):
    """Weights only (the mask and dropout are the caller's; check a port with :mod:`attention_ref.compare`).

    ``torch.nn.MultiheadAttention`` (with ``in_proj_weight``: equal query, key and value
    widths) -> the params of :func:`attention_ref.multi_head_attention_forward`. Its
    ``attn_mask``/``key_padding_mask`` True means *ignore*, the opposite of this package's
    boolean masks (``compare``'s ``mask_inverted``)."""
    return _apply("torch.nn.MultiheadAttention", state, prefix)


def from_gpt2_attention(state, prefix=""):
    """Weights only, without GPT-2's causal mask (pass ``mask=``); a port is checked with :mod:`attention_ref.compare`.

    transformers' ``GPT2Attention`` (``c_attn``, ``c_proj``; prefix e.g. ``"h.0.attn."``)
    -> the params of :func:`attention_ref.multi_head_attention_forward` (``Conv1D`` weights are
    already (in, out), as here: no transpose)."""
    return _apply("transformers GPT2Attention (attn.)", state, prefix)


def from_llama_attention(state, num_heads, prefix=""):
    """Weights only, without RoPE or the causal mask: to check a Llama attention port use :mod:`attention_ref.compare`.

    transformers' ``LlamaAttention`` (prefix e.g. ``"layers.0.self_attn."``) -> the params of
    :func:`attention_ref.multi_head_attention_forward` (no biases; pass ``num_kv_heads``, the
    ratio of ``W_q``'s to ``W_k``'s columns times ``num_heads``, to the forward). That forward
    has no rotary positions, so its output differs from ``LlamaAttention``'s (by about 1e-1 on
    random weights); :func:`attention_ref.llama_block_forward` with these params under
    ``self_attn.`` applies RoPE (rotate-half, ``rope_base=config.rope_theta``)."""
    p = _apply("transformers LlamaAttention (self_attn.)", state, prefix)
    _check_heads(p["W_q"], p["W_k"], num_heads, prefix + "q_proj.weight", prefix + "k_proj.weight")
    return p


def from_gpt2_block(state, prefix=""):
    """Weights only (eps and the GELU are :func:`attention_ref.gpt2_block_forward`'s; see :mod:`attention_ref.compare`).

    transformers' ``GPT2Block`` (prefix e.g. ``"h.0."``) -> the params of
    :func:`attention_ref.gpt2_block_forward`."""
    return _apply("transformers GPT2Block (h.<i>.)", state, prefix)


def from_llama_block(state, num_heads, prefix=""):
    """Weights only: RoPE's base and eps are the forward's arguments, from the config (see :mod:`attention_ref.compare`).

    transformers' ``LlamaDecoderLayer`` (prefix e.g. ``"layers.0."``) -> the params of
    :func:`attention_ref.llama_block_forward` (``rope_base=config.rope_theta``, ``eps=config.rms_norm_eps``)."""
    p = _apply("transformers LlamaDecoderLayer (layers.<i>.)", state, prefix)
    _check_heads(p["self_attn.W_q"], p["self_attn.W_k"], num_heads, prefix + "self_attn.q_proj.weight",
                 prefix + "self_attn.k_proj.weight")
    return p


def from_bert_layer(state, prefix=""):
    """Weights only: eps and the activation are the forward's arguments (see :mod:`attention_ref.compare`).

    transformers' ``BertLayer`` (prefix e.g. ``"encoder.layer.0."``) -> the params of
    :func:`attention_ref.encoder_block_forward` with ``norm_first=False``,
    ``activation="gelu_exact"`` and ``eps=config.layer_norm_eps`` (BERT is the post-norm
    encoder block of "Attention Is All You Need" with the exact GELU)."""
    return _apply("transformers BertLayer (encoder.layer.<i>.)", state, prefix)


def _check_heads(W_q, W_k, num_heads, q_key, k_key):
    """``num_heads`` divides W_q's columns, and the head width divides W_k's (grouped heads)."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, (int, np.integer)) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive integer, got {num_heads!r}")
    if W_q.shape[1] % num_heads:
        raise ValueError(f"{q_key} has {W_q.shape[1]} output rows, not divisible by num_heads={num_heads}")
    d_head = W_q.shape[1] // num_heads
    if W_k.shape[1] % d_head:
        raise ValueError(f"{k_key} has {W_k.shape[1]} output rows, not a multiple of the head width {d_head}")
