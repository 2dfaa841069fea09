"""The parameter plumbing of the blocks: one flat dict of dotted names, split by sub-layer and
joined back.

A block's parameters live in one flat dict keyed ``"group.name"`` (``"self_attn.W_q"``,
``"ln1.gamma"``, ``"ffn.W_1"``), so :func:`attention_ref.gradcheck` can perturb every parameter of
a block at once; :func:`split_params` and :func:`join_grads` convert between that flat dict and one
dict per sub-layer, :func:`check_block_params` checks the widths a residual sum needs, and
:func:`in_group` makes a sub-layer's errors name its group. (Until 0.4 these lived in
:mod:`attention_ref.nn.residual`, which still exports them.)
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from .._checks import as_real_array

__all__ = ["OPTIONAL_PARAMS", "split_params", "check_block_params", "check_flag", "join_grads", "in_group"]

#: Parameters a block may omit (absent or None): the biases.
OPTIONAL_PARAMS = ("b_q", "b_k", "b_v", "b_o", "b_1", "b_2")


def split_params(params, groups: Mapping) -> dict:
    """Split a flat dict keyed ``"group.name"`` into ``{group: {name: array}}``.

    ``groups`` maps each group to the names it allows. Raises ``ValueError`` naming any
    key that is not ``"group.name"`` with a known group and name, and any missing
    parameter other than the optional biases (:data:`OPTIONAL_PARAMS`).
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict keyed by dotted names such as"
                        f" 'self_attn.W_q', got {type(params).__name__}")
    out = {g: {} for g in groups}
    bad = []
    for key, value in params.items():
        group, _, name = str(key).partition(".")
        if group not in groups or name not in groups[group]:
            bad.append(key)
        else:
            out[group][name] = value
    if bad:
        allowed = [f"{g}.{n}" for g, names in groups.items() for n in names]
        raise ValueError(f"params has unknown keys {bad}; allowed keys are {allowed}")
    missing = [f"{g}.{n}" for g, names in groups.items() for n in names
               if n not in OPTIONAL_PARAMS and out[g].get(n) is None]
    if missing:
        raise ValueError(f"params is missing {missing}")
    return out


def check_block_params(p: Mapping, d_model: int, norms, outputs: Mapping) -> dict:
    """Check, before any arithmetic, the parameters whose width must be ``d_model``.

    ``p`` is :func:`split_params`'s ``{group: {name: array}}``; ``norms`` lists the layer
    norm groups (``gamma`` and ``beta`` must be ``(d_model,)``); ``outputs`` maps each
    sub-layer group to its last linear map ``(weight, bias)`` (the weight must have
    ``d_model`` columns and the bias shape ``(d_model,)``, so the sub-layer's output can
    be added to its input). Errors name the dotted key (``ffn.W_2``). Returns ``p`` with
    those entries as real arrays; the sub-layers check everything else themselves.
    """
    out = {g: dict(d) for g, d in p.items()}
    for g in norms:
        for n in ("gamma", "beta"):
            a = as_real_array(out[g][n], f"params['{g}.{n}']")
            if a.shape != (d_model,):
                raise ValueError(f"params['{g}.{n}'] must have shape ({d_model},) to match x of"
                                 f" width d_model = {d_model}, got shape {a.shape}")
            out[g][n] = a
    for g, (w, b) in outputs.items():
        W = as_real_array(out[g][w], f"params['{g}.{w}']")
        if W.ndim != 2 or W.shape[1] != d_model:
            raise ValueError(f"params['{g}.{w}'] must have {d_model} columns, shape (k, {d_model}): the {g}"
                             f" output is added to its input of width d_model = {d_model},"
                             f" got shape {W.shape}")
        out[g][w] = W
        if out[g].get(b) is not None:
            bias = as_real_array(out[g][b], f"params['{g}.{b}']")
            if bias.shape != (d_model,):
                raise ValueError(f"params['{g}.{b}'] must have shape ({d_model},) to match x of"
                                 f" width d_model = {d_model}, got shape {bias.shape}")
            out[g][b] = bias
    return out


def check_flag(value, name: str) -> bool:
    """A block's on/off option (``norm_first``, ``causal``) must be a real bool, not ``"post"``."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def join_grads(grads_by_group: Mapping, param_keys) -> dict:
    """Flatten ``{group: {name: grad}}`` back to dotted keys, in ``param_keys`` order,
    followed by any gradient that has no parameter (such as ``"self_attn.head_mask"``)."""
    flat = {f"{g}.{n}": v for g, d in grads_by_group.items() for n, v in d.items()}
    ordered = {k: flat[k] for k in param_keys}
    ordered.update({k: v for k, v in flat.items() if k not in ordered})
    return ordered


def in_group(group: str, sublayer: Callable) -> Callable:
    """Wrap a sub-layer forward so its input errors name the parameter group.

    ``params['W_q'] ...`` raised inside the self-attention becomes
    ``self_attn: params['W_q'] ...``, pointing at the dotted key ``self_attn.W_q``.
    """
    def wrapped(z):
        try:
            return sublayer(z)
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"{group}: {exc}") from None
    return wrapped
