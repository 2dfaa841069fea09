"""Whole models from and to transformers: a ``save_pretrained`` directory read into our params,
and our params or gradients under transformers' names.

``load_pretrained(path)`` reads ``config.json`` and ``model.safetensors`` (or the shards
listed by ``model.safetensors.index.json``), with no torch; ``from_transformers_state`` maps a
state dict already in memory; ``to_transformers`` goes the other way, a tied weight once,
under the name ``model.named_parameters()`` uses (``transformer.wte.weight``,
``model.embed_tokens.weight``). The tables are :data:`attention_ref.interop.MAPPINGS`.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .._checks import check_float_dtype
from ..models.config import LMConfig
from ..models.params import LAYER_PREFIX, param_names
from .converters import _apply
from .mappings import MAPPINGS, WHOLE_MODELS
from .safetensors import read_safetensors

__all__ = ["load_pretrained", "from_transformers_state", "to_transformers", "read_state_dir"]


def read_state_dir(path) -> dict:
    """Names -> arrays of the weights in a ``save_pretrained`` directory (one file or shards)."""
    path = Path(path)
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.exists():
        return read_safetensors(single)
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state = {}
        for name in files:
            state.update(read_safetensors(path / name))
        return state
    found = sorted(p.name for p in path.iterdir()) if path.is_dir() else "not a directory"
    variants = [n for n in found if n.startswith("model.") and n.endswith(".safetensors")] if path.is_dir() else []
    hint = (f"; {variants} look like a save_pretrained(variant=...) file: rename it to model.safetensors"
            if variants else "; save the model with save_pretrained (safetensors, the default)")
    raise FileNotFoundError(f"{path} has neither model.safetensors nor model.safetensors.index.json"
                            f" (found: {found}){hint}")


def load_pretrained(path, dtype=None):
    """``(params, config)`` of the GPT-2 or Llama model saved in directory ``path``.

    Parameters
    ----------
    path : a directory as transformers' ``save_pretrained`` writes it: ``config.json`` and
        ``model.safetensors`` or its shards
    dtype : optional float32 or float64 for every weight (default: as stored; bfloat16 and
        float16 become float32)

    Returns
    -------
    params : dict for :func:`attention_ref.lm_forward` and :func:`attention_ref.generate`
    config : LMConfig
    """
    if dtype is not None:
        dtype = check_float_dtype(dtype)  # float32 or float64: the models compute in nothing else
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.exists():
        raise FileNotFoundError(f"{path} has no config.json: not a save_pretrained directory")
    config = LMConfig.from_dict(json.loads(config_file.read_text()))
    return from_transformers_state(read_state_dir(path), config, dtype=dtype), config


def _strip_base(state, family):
    """A bare base model's state (``GPT2Model``: ``wte.weight``; ``LlamaModel``: ``embed_tokens.weight``)
    under the LM's names (``transformer.``, ``model.``)."""
    base = {"gpt2": "transformer.", "llama": "model."}[family]
    if any(k.startswith(base) for k in state):
        return state
    return {k if k.startswith("lm_head.") else base + k: v for k, v in state.items()}


def from_transformers_state(state, config: LMConfig, dtype=None) -> dict:
    """Our params from a whole model's state dict (names -> arrays, e.g. ``{k: v.numpy() for
    k, v in model.state_dict().items()}``); a missing or mis-shaped tensor is named."""
    state = _strip_base(state, config.family)
    table, layer_prefix, block_table = WHOLE_MODELS[config.family]
    params = {k: v for k, v in _apply(table, state, "").items() if v is not None}
    if config.tie_word_embeddings:
        params.pop("lm_head.W", None)  # stored or not, the head is the token table
    elif "lm_head.W" not in params:
        raise KeyError("the config says tie_word_embeddings = False but the state has no 'lm_head.weight'")
    for i in range(config.num_layers):
        block = _apply(block_table, state, layer_prefix.format(i=i))
        params.update({f"{LAYER_PREFIX[config.family]}.{i}.{k}": v for k, v in block.items() if v is not None})
    extra = [k for k in state if k.startswith(layer_prefix.split("{")[0])
             and int(k[len(layer_prefix.split("{")[0]):].split(".")[0]) >= config.num_layers]
    if extra:
        raise ValueError(f"the state has layers past the config's num_layers = {config.num_layers}: {extra[:3]}")
    out = {}
    for name in param_names(config):
        if name in params:
            value = params[name]
            if dtype is not None:
                value = value.astype(dtype)
            elif value.dtype == np.float16:
                value = value.astype(np.float32)
            out[name] = value
    return out


def to_transformers(tree, config: LMConfig) -> dict:
    """Our params or gradients (a dict keyed like :func:`attention_ref.models.param_names`) under
    transformers' state-dict names, as a dict of arrays in their layouts (``nn.Linear``
    transposed back, GPT-2's Q, K and V fused into ``c_attn``). A tied weight appears once,
    under the name ``named_parameters()`` gives it (the token table's)."""
    if not isinstance(config, LMConfig):
        raise TypeError(f"config must be an LMConfig, got {type(config).__name__}")
    table, layer_prefix, block_table = WHOLE_MODELS[config.family]
    out = _reverse(MAPPINGS[table], tree, "", "")
    for i in range(config.num_layers):
        out.update(_reverse(MAPPINGS[block_table], tree, f"{LAYER_PREFIX[config.family]}.{i}.",
                            layer_prefix.format(i=i)))
    return out


def _reverse(rules, tree, ours_prefix, theirs_prefix):
    """One table of :data:`MAPPINGS` backwards: our tensors -> theirs."""
    out = {}
    for rule in rules:
        names = [ours_prefix + n for n in rule.ours]
        if any(tree.get(n) is None for n in names):
            if rule.optional or all(tree.get(n) is None for n in names):
                continue
            raise KeyError(f"{theirs_prefix + rule.theirs} needs {names}; missing {[n for n in names if n not in tree]}")
        parts = [np.asarray(tree[n]) for n in names]
        if rule.how == "split columns":
            t = np.concatenate(parts, axis=1)
        elif rule.how == "split rows, transpose":
            t = np.concatenate([p.T for p in parts], axis=0)
        elif rule.how == "split":
            t = np.concatenate(parts, axis=0)
        elif rule.how == "transpose":
            t = parts[0].T
        else:
            t = parts[0]
        out[theirs_prefix + rule.theirs] = np.ascontiguousarray(t)
    return out
