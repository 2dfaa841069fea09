"""``compare.module`` and ``compare.model``: a user's torch attention layer, MLP, decoder layer or whole
model against the reference, the first module that differs, and the mistake named when a mistaken
variant of the reference (:mod:`attention_ref.compare.layers`) reproduces it on every case.

Both run in float64 (a copy of the user's module converted with ``.double()``) and judge
``max |user - reference| <= rtol * max |reference|`` with ``rtol`` = 1e-10 (:data:`MODULE_RTOL`) on
the real positions; padded positions (a query whose keys are all padding) are judged only for
NaN and infinity. transformers' own float32 steps run in float64 while the user's code runs
(:func:`transformers_in_float64`). A port whose output is float32 (or float16) is judged against
the reference run in that precision too: ``low_precision`` when every module is within
:data:`attention_ref.compare.PRECISION_FACTOR` times that run's own error, else the first module
beyond it, named by a mistaken variant run in that precision (docs/compare.md). torch is imported
only when these are called.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import json
import math
import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .._checks import signals_land_here
from ..interop.pretrained import load_pretrained
from ..models.config import LMConfig
from ..models.lm import step_modules
from ..models.trace import trace_names_4x
from .judge import PRECISION_FACTOR, _deviation, _separating, _user_line
from .layers import (KINDS, block_reference, config_of, drawn_state, embedding_scale, layer_variants, model_reference,
                     model_variants, module_names, read_params, stored_in_out, transformers_state)
from .verdict import Comparison

__all__ = ["module", "model", "MODULE_RTOL"]

#: the relative tolerance of the module and model levels (float64 against float64)
MODULE_RTOL = 1e-10
#: where a difference starts: once some module differs beyond MODULE_RTOL, the first module (in hook
#: order) whose error is above float64's rounding (a mistake whose effect is small at its own module,
#: as a soft cap on small scores, grows past the tolerance only in later ones)
LOCATE_RTOL = 1e-12
_SEED = 0


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError("compare.module and compare.model compare torch modules: install torch"
                          " (pip install attention_ref[interop])") from None
    return torch


def _config_dict(config) -> dict:
    """A transformers config object or a config.json dict, as a dict (checked by the family's reader)."""
    if isinstance(config, Mapping):
        d = copy.deepcopy(dict(config))
    elif hasattr(config, "to_dict") and callable(config.to_dict):
        d = config.to_dict()
    else:
        raise TypeError(f"config must be a transformers config object or a config.json dict, got"
                        f" {type(config).__name__}")
    if not isinstance(d.get("model_type"), str):
        raise ValueError("config has no model_type: it must be a transformers config (or its config.json dict)")
    d = {k: v for k, v in d.items() if k not in ("dtype", "torch_dtype") or isinstance(v, (str, type(None)))}
    config_of(d)  # the family's reader: a field this package does not compute is refused by name
    return d


def _one_layer(cfg: dict) -> dict:
    """The config of a model with its first two layers and a small vocabulary (the module is layer
    0, the second layer keeps an alternation of layer kinds: a real model's other layers and token
    table need not be drawn)."""
    small = copy.deepcopy(cfg)
    for key in ("num_hidden_layers", "n_layer"):
        if isinstance(small.get(key), int) and small[key] > 2:
            small[key] = 2
    for key in ("layer_types", "no_rope_layers"):
        if isinstance(small.get(key), list):
            small[key] = small[key][:2]
    if isinstance(small.get("vocab_size"), int) and small["vocab_size"] > 256:
        small["vocab_size"] = 256
        for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
            if isinstance(small.get(key), int) and small[key] >= 256:
                small[key] = None
    try:
        config_of(small)
    except Exception:  # a family whose rules the shortening breaks: the config as given
        return cfg
    return small


class _Raised(Exception):
    """The user's code raised: the verdict carries its line."""

    def __init__(self, error):
        super().__init__(str(error))
        self.line = f"{_user_line(error)}: {type(error).__name__}: {error}"


def _to_numpy(out):
    """A module's output as float64 NumPy: a tensor, the first item of a tuple, a ModelOutput's
    ``logits`` or ``last_hidden_state``; None when there is no tensor."""
    out = _tensor_of(out)
    return None if out is None else out.double().numpy()


#: the lower precisions a port may compute in whose reference this package runs (bfloat16 has none)
_LOWER = {"torch.float32": np.dtype(np.float32), "torch.float16": np.dtype(np.float16)}


def _precision(out):
    """The dtype of the user's output (``None``: float64, or a dtype with no reference run here)."""
    tensor = _tensor_of(out)
    return None if tensor is None else _LOWER.get(str(tensor.dtype))


def _lowest(dtypes):
    """The lowest of the outputs' precisions (None: they are all float64)."""
    found = [d for d in dtypes if d is not None]
    return min(found, key=lambda d: np.finfo(d).bits) if found else None


def _tensor_of(out):
    """The floating tensor of a module's output (see :func:`_to_numpy`), on the CPU, or None."""
    for attr in ("logits", "last_hidden_state"):
        if not isinstance(out, (tuple, list)) and getattr(out, attr, None) is not None:
            out = getattr(out, attr)
            break
    if isinstance(out, (tuple, list)):
        out = out[0] if out else None
    if out is None or not (hasattr(out, "detach") and hasattr(out, "cpu")):
        return None
    out = out.detach().cpu()
    return out if out.is_floating_point() else None


class _Recorder:
    """Forward hooks on every submodule of ``root``: ``(name, output)`` in the order they fire."""

    def __init__(self, root):
        self.records = []
        self.handles = []
        for name, sub in root.named_modules():
            if name:
                self.handles.append(sub.register_forward_hook(self._hook(name)))

    def _hook(self, name):
        def hook(mod, args, out):
            value = _to_numpy(out)
            if value is not None:
                self.records.append((name, value))
        return hook

    def close(self):
        for h in self.handles:
            h.remove()


@contextlib.contextmanager
def transformers_in_float64():
    """While the user's code runs: when it has imported transformers, transformers' own float32 steps
    in a float64 model (RMSNorms, RoPE angles, BLOOM's ALiBi slopes and softmax, routers: the table
    of :mod:`attention_ref.interop.float64`) computed in float64 with the same formulas, so that a
    model built from transformers' classes is judged at the float64 tolerance. The patches act at
    forward time: one a loader entered and left before returning the model no longer applies.
    A patch whose transformers module this installation lacks is skipped (no such model can run).
    Only patches of transformers' own modules and classes: ``qwen3_next_in_float64`` also makes
    ``torch.Tensor.float`` keep float64 for every caller (a port's own float32 steps too), so it is
    left to the user to enter around the call."""
    if "transformers" not in sys.modules:
        yield
        return
    from ..interop import float64 as f64
    with contextlib.ExitStack() as stack:
        for patch in (f64.llama_in_float64, f64.gemma3_in_float64, f64.gemma2_in_float64, f64.bloom_in_float64,
                      f64.gpt_oss_in_float64, f64.moe_models_in_float64):
            try:
                stack.enter_context(patch())
            except (ImportError, AttributeError):  # this transformers has no such model
                continue
        yield


def _run(torch, fn):
    """Call the user's code in float64 with no gradient (transformers' own float32 steps in float64:
    :func:`transformers_in_float64`); its exception becomes :class:`_Raised`."""
    try:
        with torch.no_grad(), transformers_in_float64(), warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            out = fn()
            signals_land_here()
    except Exception as error:  # the user's code: any exception is a verdict
        raise _Raised(error) from None
    return out


def _float64_copy(torch, user):
    try:
        user = copy.deepcopy(user)
    except Exception:  # a module that cannot be copied is converted as it is
        pass
    return user.double().eval()


# ---------------------------------------------------------------- judging one output
def _keep_rows(ref, keep):
    """The entries to skip (padded positions) of an output shaped like ``ref``, or None."""
    if keep is None or ref.ndim < 2 or ref.shape[:2] != keep.shape:
        return None
    return np.broadcast_to(~keep.reshape(keep.shape + (1,) * (ref.ndim - 2)), ref.shape)


def _compare(user, ref, keep, rtol):
    """(deviation relative to the reference's size, NaN at a padded position) or (inf, False) for a
    shape that does not fit."""
    if user.size != ref.size:
        try:  # an output without batch axes (GPT-2's wpe, (T, D)) against the user's (B, T, D)
            ref = np.broadcast_to(ref, user.shape) if user.ndim > ref.ndim else None
        except ValueError:
            ref = None
        if ref is None:
            return math.inf, False
    if user.ndim == ref.ndim == 4 and user.shape != ref.shape and user.shape == tuple(np.take(ref.shape, (0, 2, 1, 3))):
        user = np.swapaxes(user, 1, 2)  # a q/k norm's output per head (B, H, T, Dh) against transformers' (B, T, H, Dh)
    user = user.reshape(ref.shape)
    skip = _keep_rows(ref, keep)
    size = _deviation(ref, 0 * ref, skip)
    nan = bool(skip is not None and not np.all(np.isfinite(user[skip])))
    deviation = _deviation(user, ref, skip)
    if deviation == 0:
        return 0.0, nan
    if not deviation / 1e300 < size:  # a reference of zeros (a variant's norm weights all 0): no ratio overflows
        return math.inf, nan
    return deviation / size, nan


# ---------------------------------------------------------------- compare.module
def module(module, config, kind) -> Comparison:
    """Compare a user's torch attention layer, MLP or decoder layer with the reference.

    Parameters
    ----------
    module : a ``torch.nn.Module`` with transformers' parameter names relative to it
        (``q_proj.weight``, ``input_layernorm.weight``, ...); compared as layer 0 of the config's model
    config : a transformers config object or a ``config.json`` dict (any family of
        :data:`attention_ref.FAMILIES`)
    kind : ``"attention"`` (called ``module(x, positions, attention_mask)``: x (B, T, D) float64,
        positions (B, T) int64, attention_mask (B, T) int64 of 0/1 or None; causal masking implied;
        returns (B, T, D), or a tuple whose first item is that), ``"mlp"`` (``module(x)``) or
        ``"decoder_layer"`` (as attention)

    Weights are drawn (seed 0), loaded with ``module.load_state_dict(strict=True)`` into a float64
    copy of the module; a load that fails is a verdict (named when the catalogue explains it: a
    dropped bias, GPT-2's Conv1D weights not transposed, a head width not read from the config).
    The cases: positions from 0, not from 0, per batch row, with a jump (packed sequences), a
    left-padded batch, and T beyond the
    sliding window when the config has a small one. ``.where`` is the first submodule (forward
    hook order, transformers' names) whose output differs, or the module's output.
    """
    torch = _torch()
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    cfg = _one_layer(_config_dict(config))
    lm_config = config_of(cfg)
    state = drawn_state(cfg, _SEED)
    params = read_params(state, cfg)
    names = module_names(cfg, state)
    inner = {"attention": names["attention"], "mlp": names["mlp"], "decoder_layer": ""}[kind]
    prefix = names["layer"] + (inner + "." if inner else "")
    subject = f"{kind} ({lm_config.family})"
    theirs = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    user = _float64_copy(torch, module)
    failed = _load(torch, user, theirs, lm_config, subject)
    if failed is not None:
        return failed
    entries = names["entries"]
    input_key = None if kind == "decoder_layer" else entries[
        next(i for i, n in enumerate(entries) if n.startswith(inner + ".") or n.startswith(inner + ":")) - 1]
    cases = _module_cases(lm_config, np.random.default_rng(_SEED))
    recorder = _Recorder(user)
    dtypes = []
    try:
        results = []
        for case in cases:
            ref = block_reference(state, cfg, case.x, case.positions, case.keep, params)
            given = case.x if input_key is None else ref[input_key]
            recorder.records.clear()
            try:
                out = _run(torch, lambda: _call_module(torch, user, kind, given, case))
            except _Raised as raised:
                return Comparison(False, None, "the call raised", (), subject, len(cases), len(cases), math.inf,
                                  detail=f"It raised on a case with {', '.join(sorted(case.features))}:\n"
                                         f"  {raised.line}")
            value = _to_numpy(out)
            if value is None:
                raise TypeError(f"the {kind} returned {type(out).__name__}; a tensor (B, T, D) is expected")
            results.append((case, ref, given, value, list(recorder.records)))
            dtypes.append(_precision(out))
    finally:
        recorder.close()
    return _module_verdict(subject, cfg, kind, inner, input_key, state, results, _lowest(dtypes))


def _call_module(torch, user, kind, x, case):
    xt = torch.from_numpy(np.array(x, np.float64))
    if kind == "mlp":
        return user(xt)
    positions = torch.from_numpy(np.array(case.positions, np.int64))
    mask = None if case.keep is None else torch.from_numpy(case.keep.astype(np.int64))
    return user(xt, positions, mask)


class _Case:
    def __init__(self, x, positions, keep, features):
        self.x, self.positions, self.keep, self.features = x, positions, keep, features


def _module_cases(config: LMConfig, rng) -> list:
    B, T, D = 2, 7, config.d_model
    ar = np.arange(T)
    cases = [_Case(rng.standard_normal((B, T, D)), np.stack([ar, ar]), None, {"positions from 0": True}),
             _Case(rng.standard_normal((B, T, D)), np.stack([ar + 7, ar + 7]), None,
                   {"positions not from 0": True}),
             _Case(rng.standard_normal((B, T, D)), np.stack([ar + 3, ar + 1000]), None,
                   {"positions not from 0": True, "positions per batch row": True})]
    cases.append(_Case(rng.standard_normal((B, T, D)), np.stack([ar, np.r_[ar[:3], ar[:T - 3]]]), None,
                       {"positions with a jump": True, "positions per batch row": True}))  # packed sequences
    keep = np.ones((B, T), bool)
    keep[1, :2] = False
    positions = np.maximum(np.cumsum(keep, axis=1) - 1, 0)
    cases.append(_Case(rng.standard_normal((B, T, D)), positions, keep, {"left padding": True}))
    window = config.sliding_window
    if window is not None and window + 3 <= 48:
        ar = np.arange(window + 3)
        cases.append(_Case(rng.standard_normal((B, window + 3, D)), np.stack([ar, ar]), None,
                           {"T > sliding_window": True, "positions from 0": True}))
    return cases


def _load(torch, user, theirs, config, subject):
    """Load ``theirs`` into ``user`` (strict); a failure as a verdict (None when it loaded)."""
    own = user.state_dict()
    parameters = {n for n, _ in user.named_parameters(remove_duplicate=False)}
    missing = sorted(set(theirs) - set(own))
    unexpected = sorted(n for n in set(own) - set(theirs) if n in parameters)
    shapes = sorted(n for n in set(theirs) & set(own) if tuple(own[n].shape) != theirs[n].shape)
    if missing or unexpected or shapes:
        mistake = None
        if missing and not unexpected and not shapes and all(
                n.endswith("bias") and any(p in n for p in ("q_proj", "k_proj", "v_proj", "qkv", "c_attn",
                                                            "query_key_value")) for n in missing):
            mistake = "qkv_bias_missing"
        elif shapes and all(tuple(own[n].shape) == theirs[n].shape[::-1] and any(
                stored.endswith(n) for stored in stored_in_out(config)) for n in shapes):
            mistake = "conv1d_transpose"
        elif shapes and config.head_dim is not None and _head_dim_shapes(own, theirs, shapes, config):
            mistake = "head_dim"
        parts = [f"missing {', '.join(missing)}" if missing else "",
                 f"unexpected {', '.join(unexpected)}" if unexpected else "",
                 "; ".join(f"{n}: the checkpoint's {theirs[n].shape} into the module's {tuple(own[n].shape)}"
                           for n in shapes)]
        return Comparison(False, mistake, "load_state_dict", (), subject, 0, 0, None,
                          detail="load_state_dict(strict=True) fails: " + "; ".join(p for p in parts if p) + ".")
    full = {n: (torch.from_numpy(np.array(theirs[n])) if n in theirs else own[n]) for n in own}
    try:
        user.load_state_dict(full, strict=True)
    except Exception as error:  # a custom load hook of the user's
        return Comparison(False, None, "load_state_dict", (), subject, 0, 0, None,
                          detail=f"load_state_dict(strict=True) raised: {_user_line(error)}: {error}")
    return None


def _head_dim_shapes(own, theirs, shapes, config):
    """The mismatched shapes are those of a head width hidden_size / num_heads."""
    usual = config.d_model // config.num_heads
    for n in shapes:
        a, b = tuple(own[n].shape), theirs[n].shape
        if not any(s in n for s in ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "q_norm", "k_norm")):
            return False
        if not any(x * config.d_head == y * usual for x, y in zip(a, b) if x != y):
            return False
    return True


def _module_verdict(subject, cfg, kind, inner, input_key, state, results, low=None):
    out_key = inner
    judged = []
    for case, ref, given, value, records in results:
        error, nan = _compare(value, ref[out_key], case.keep, MODULE_RTOL)
        judged.append((case, ref, given, value, records, error, nan))
    error = max(j[5] for j in judged)
    wrong = [j for j in judged if not j[5] <= MODULE_RTOL]
    nans = [j for j in judged if j[6]]
    n = len(judged)
    if not wrong and not nans:
        return Comparison(True, None, None, (), subject, n, 0, error)
    if not wrong:
        return Comparison(False, "masked_row_nan", "softmax", ("left padding",), subject, n, len(nans), math.inf,
                          detail="Every real position matches, but padded positions hold NaN or inf.")
    inputs = _separating([j[0] for j in judged], [j[0] for j in wrong])
    case, ref, _, value, records = wrong[0][:5]
    if value.size != ref[out_key].size:
        return Comparison(False, None, "the output's shape", inputs, subject, n, len(wrong), math.inf,
                          detail=f"It returned shape {value.shape} where the reference has {ref[out_key].shape}.")
    where = _first_divergent(records, ref, inner, case.keep) or (inner or "the decoder layer's output")
    if low is not None:  # the port computes in a lower precision: the reference is run in it too
        return _module_low_verdict(subject, cfg, kind, inner, input_key, state, judged, low, where, inputs, error)
    variant = _name_module(cfg, kind, inner, input_key, state, judged)
    if variant is not None:
        return Comparison(False, variant.mistake, where, inputs, subject, n, len(wrong), error,
                          detail=f"Reproduced by the reference with {variant.label} on every case, within"
                                 " the tolerance.")
    if _module_in_size(cfg, inner, state, judged, np.dtype(np.float32)):  # a float64 port with float32 steps
        return Comparison(False, "low_precision", where, inputs, subject, n, len(wrong), error,
                          detail="Reproduced in size (within a factor of 10 on every case) by the reference run in"
                                 " float32: a step computed in float32; no mistake of the catalogue reproduces it.")
    return Comparison(False, None, where, inputs, subject, n, len(wrong), error,
                      detail=f"Largest relative error {error:.3g} ({len(wrong)} of {n} cases differ); no mistake of"
                             " the catalogue reproduces it on every case.")


def _in_size(user, own):
    """The user's error and the reference's own error in the lower precision are the same size:
    within :data:`PRECISION_FACTOR` of each other (both at least the tolerance), the rule of the
    operation level's ``low_precision`` (STYLE item 28: precision named only when so measured)."""
    user, own = max(user, MODULE_RTOL), max(own, MODULE_RTOL)
    return 1 / PRECISION_FACTOR <= user / own <= PRECISION_FACTOR


def _within_noise(error, noise, low):
    """An error within :data:`PRECISION_FACTOR` of the reference's own rounding in ``low`` (at least
    ``low``'s resolution): what a port computing in ``low`` cannot do better than."""
    return error <= PRECISION_FACTOR * max(noise, float(np.finfo(low).eps))


def _module_in_size(cfg, inner, state, judged, low):
    """Whether the reference of layer 0 run in ``low`` differs from the float64 one by the size of
    the user's error, on every case."""
    for j in judged:
        case, ref = j[0], j[1]
        try:
            own = block_reference(state, cfg, case.x.astype(low), case.positions, case.keep)[inner]
        except Exception:  # a reference this precision cannot run reproduces nothing
            return False
        noise, _ = _compare(own.astype(np.float64), ref[inner], case.keep, MODULE_RTOL)
        if not _in_size(j[5], noise):
            return False
    return True


def _module_low_verdict(subject, cfg, kind, inner, input_key, state, judged, low, where, inputs, error):
    """A port computing in ``low``: ``low_precision`` when the reference run in ``low`` reproduces its
    error in size on every case; else a mistaken variant run in ``low`` whose float64 output the user's
    is within that precision's noise of, on every case; else located only."""
    n, wrong = len(judged), sum(1 for j in judged if not j[5] <= MODULE_RTOL)
    name = np.dtype(low).name
    if _module_in_size(cfg, inner, state, judged, low):
        return Comparison(False, "low_precision", where, inputs, subject, n, wrong, error,
                          detail=f"Your module computes in {name}: reproduced in size (within a factor of 10 on every"
                                 f" case) by the reference run in {name}; no other difference.")
    order = sorted(judged, key=lambda j: j[5] <= MODULE_RTOL)
    for variant in layer_variants(cfg, kind, state):
        try:
            s, c = variant.edit(state, cfg) if variant.edit is not None else (state, cfg)
            params, params_low = read_params(s, c), read_params(s, c, low)
        except Exception:  # a variant this config refuses reproduces nothing
            continue
        if all(_reproduces_module_low(variant, s, c, params, params_low, inner, input_key, j, low) for j in order):
            return Comparison(False, variant.mistake, where, inputs, subject, n, wrong, error,
                              detail=f"Your module computes in {name}: reproduced by the reference with {variant.label}"
                                     f" on every case, within {PRECISION_FACTOR:g} times that reference's own error"
                                     f" in {name}.")
    return Comparison(False, None, where, inputs, subject, n, wrong, error,
                      detail=f"Your module computes in {name}; largest relative error {error:.3g}, beyond the"
                             f" reference's own error in {name}; no mistake of the catalogue reproduces it.")


def _reproduces_module_low(variant, s, c, params, params_low, inner, input_key, j, low):
    case, value = j[0], j[3]
    try:
        positions, keep = variant.case(case.positions, case.keep) if variant.case is not None else (
            case.positions, case.keep)
        theirs = block_reference(s, c, case.x, positions, keep, params)
        x_low = case.x.astype(low)
        own = block_reference(s, c, x_low, positions, keep, params_low)
        if variant.compute is not None:
            theirs = {**theirs, **(variant.compute(s, c, theirs, case.x, "") or {})}
            own = {**own, **(variant.compute(s, c, own, x_low, "") or {})}
    except Exception:  # a variant this config refuses reproduces nothing
        return False
    if input_key is not None:  # the variant must leave the module's input as it was
        moved, _ = _compare(theirs[input_key], j[2], None, MODULE_RTOL)
        if not moved <= MODULE_RTOL:
            return False
    error, _ = _compare(value, theirs[inner], case.keep, MODULE_RTOL)
    noise, _ = _compare(np.asarray(own[inner], np.float64), theirs[inner], case.keep, MODULE_RTOL)
    return _within_noise(error, noise, low)


def _first_divergent(records, ref, inner, keep):
    for name, value in records:
        key = f"{inner}.{name}" if inner else name
        if key in ref:
            error, _ = _compare(value, ref[key], keep, MODULE_RTOL)
            if not error <= MODULE_RTOL:
                return key
    return None


def _name_module(cfg, kind, inner, input_key, state, judged):
    # the cases that differ first: a variant that cannot reproduce them is dropped at once
    order = sorted(judged, key=lambda j: j[5] <= MODULE_RTOL)
    for variant in layer_variants(cfg, kind, state):
        try:
            s, c = variant.edit(state, cfg) if variant.edit is not None else (state, cfg)
            params = read_params(s, c)
        except Exception:  # a variant this config refuses reproduces nothing
            continue
        if all(_reproduces_module(variant, s, c, params, inner, input_key, j) for j in order):
            return variant
    return None


def _reproduces_module(variant, s, c, params, inner, input_key, j):
    case, ref, given, value = j[:4]
    try:
        positions, keep = variant.case(case.positions, case.keep) if variant.case is not None else (
            case.positions, case.keep)
        theirs = block_reference(s, c, case.x, positions, keep, params)
        if variant.compute is not None:
            theirs = {**theirs, **(variant.compute(s, c, theirs, case.x, "") or {})}
    except Exception:  # a variant this config refuses reproduces nothing
        return False
    if input_key is not None:  # the variant must leave the module's input as it was
        moved, _ = _compare(theirs[input_key], given, None, MODULE_RTOL)
        if not moved <= MODULE_RTOL:
            return False
    error, _ = _compare(value, theirs[inner], case.keep, MODULE_RTOL)
    return error <= MODULE_RTOL


# ---------------------------------------------------------------- compare.model
def model(model, folder, names=None) -> Comparison:
    """Compare a user's whole model, loaded by the user's own code from ``folder``, with the reference.

    Parameters
    ----------
    model : called ``model(ids)`` with ids (B, T) int64 (and ``model(ids, attention_mask)`` on a
        left-padded batch when its forward takes a second argument), returning logits (B, T, V) or
        an object with ``.logits``; a ``torch.nn.Module`` gets forward hooks on every submodule
    folder : the ``save_pretrained`` folder it was loaded from (config.json and the weights)
    names : optional ``{"their name": "transformers' name"}`` for submodules named otherwise (a key
        maps that module and, as a prefix, the modules inside it: ``{"blocks": "model.layers"}``)

    ``.where`` is the sub-layer (``model.layers.1.self_attn``, ``model.norm``, ...) holding the first
    module, in forward-hook order, whose output differs from :func:`attention_ref.models.lm_trace`
    beyond the tolerance (padded positions excluded); ``.detail`` names that module. The mistake is
    named when a mistaken variant of the reference reproduces that module's output on every batch.
    Without names that match transformers', only the logits are compared (the verdict says so).
    """
    torch = _torch()
    if not callable(model):
        raise TypeError(f"model must be callable (a torch.nn.Module), got {type(model).__name__}")
    folder = Path(os.fspath(folder))
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder}: folder must be a save_pretrained folder (no config.json in it)")
    if names is not None and (not isinstance(names, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in names.items())):
        raise TypeError("names must be a dict {their module name: transformers' module name} of strings")
    cfg = json.loads((folder / "config.json").read_text())
    params, config = load_pretrained(folder, dtype=np.float64)
    state = transformers_state(params, config)
    subject = f"model ({config.family}, {folder.name})"
    user = _float64_copy(torch, model) if isinstance(model, torch.nn.Module) else model
    mapping = _mapping(names, config)
    runs = _model_runs(config, user, np.random.default_rng(_SEED))
    recorder = _Recorder(user) if isinstance(user, torch.nn.Module) else None
    results, dtypes = [], []
    try:
        for ids, mask, features in runs:
            if recorder is not None:
                recorder.records.clear()
            ids_t = torch.from_numpy(ids)
            args = (ids_t,) if mask is None else (ids_t, torch.from_numpy(mask.astype(np.int64)))
            try:
                out = _run(torch, lambda: user(*args))
            except _Raised as raised:
                return Comparison(False, None, "the call raised", (), subject, len(runs), len(runs), math.inf,
                                  detail=f"The model raised: {raised.line}")
            logits = _to_numpy(out)
            if logits is None:
                raise TypeError(f"the model returned {type(out).__name__}; logits (B, T, V) or an object with"
                                " .logits is expected")
            records = [] if recorder is None else [(mapping(n), v) for n, v in recorder.records]
            results.append((ids, mask, features, logits, records))
            dtypes.append(_precision(out))
    finally:
        if recorder is not None:
            recorder.close()
    their_head = _their_head(user, mapping) if isinstance(user, torch.nn.Module) else None
    return _model_verdict(subject, cfg, config, state, results, their_head, _lowest(dtypes))


def _mapping(names, config):
    """Their module name -> transformers' (5.x) name: ``names`` (exact or as a prefix), then 4.57's names."""
    names = dict(names or {})
    old = {v: k for k, v in trace_names_4x(config).items()}

    def mapped(name):
        for key in sorted(names, key=len, reverse=True):
            if name == key or name.startswith(key + "."):
                name = names[key] + name[len(key):]
                break
        return old.get(name, name)
    return mapped


def _takes_mask(user):
    target = getattr(user, "forward", user)
    try:
        parameters = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in parameters)


def _model_runs(config, user, rng):
    B, T = 2, min(8, config.max_positions)
    ids = rng.integers(3, config.vocab_size, (B, T)).astype(np.int64) if config.vocab_size > 3 else \
        rng.integers(0, config.vocab_size, (B, T)).astype(np.int64)
    runs = [(ids, None, {"no padding": True})]
    if _takes_mask(user):
        keep = np.ones((B, T), bool)
        keep[1, :3] = False
        padded = ids.copy()
        if config.pad_token_id is not None:
            padded[1, :3] = config.pad_token_id
        runs.append((padded, keep, {"left padding": True}))
    return runs


def _their_head(user, mapping):
    for name, p in user.named_parameters():
        if mapping(name[:-len(".weight")] if name.endswith(".weight") else name) in ("lm_head", "embed_out"):
            return p.detach().cpu().double().numpy()
    return None


def _sub_layer(key, config):
    for block in step_modules(config)["block"]:
        if key.startswith(block + "."):
            return block + "." + key[len(block) + 1:].split(".")[0]
    return key


def _embed_scaled(config):
    return embedding_scale(config) != 1.0


def _divergences(config, ref, records, logits, keep, own=None, low=None):
    """The names of the modules whose output differs, in hook order, then ``""`` for the logits, each
    ``(name, output, error)``. With ``own`` (the reference run in ``low``, the port's precision), a
    module differs when its error is beyond :data:`PRECISION_FACTOR` times that reference's own
    error there (the list empty when none is, though the logits differ beyond the tolerance)."""
    out, compared, largest = [], 0, 0.0
    embed = step_modules(config)["embed"]

    def differs(name, value, error):
        if own is None:
            return not error <= LOCATE_RTOL
        noise, _ = _compare(np.asarray(own[name], np.float64), ref[name], keep, MODULE_RTOL)
        return not _within_noise(error, noise, low)
    for name, value in records:
        if name not in ref or name == "":
            continue
        compared += 1
        error, _ = _compare(value, ref[name], keep, MODULE_RTOL)
        if not error <= MODULE_RTOL and name == embed and _embed_scaled(config):  # 4.57 scales after the module
            error, _ = _compare(value, ref[name] / math.sqrt(config.d_model), keep, MODULE_RTOL)
        largest = max(largest, error)
        if differs(name, value, error):
            out.append((name, value, error))
    error, _ = _compare(logits, ref[""], keep, MODULE_RTOL)
    if differs("", logits, error):
        out.append(("", logits, error))
    if own is None and not any(not e <= MODULE_RTOL for _, _, e in out):
        out = []  # nothing beyond the tolerance: it matches
    return out, compared, max(largest, error)


def _model_verdict(subject, cfg, config, state, results, their_head, low=None):
    judged, compared, largest, refs = [], 0, 0.0, []
    for ids, mask, features, logits, records in results:
        ref = model_reference(state, cfg, ids, mask)
        refs.append(ref)
        own = None if low is None else model_reference(state, cfg, ids, mask, low)
        diverging, n, error = _divergences(config, ref, records, logits, mask, own, low)
        compared, largest = max(compared, n), max(largest, error)
        _, nan = _compare(logits, ref[""], mask, MODULE_RTOL)
        judged.append((ids, mask, features, logits, dict(records), diverging, nan))
    note = "" if compared else (" No submodule name matched transformers' (pass names={...}): the logits alone"
                                " were compared.")
    error = largest
    wrong = [j for j in judged if j[5]]
    n = len(judged)
    if low is not None and not wrong and not largest <= MODULE_RTOL:
        return _model_in_low_precision(subject, config, results, refs, low, error, note)
    if not wrong:
        if any(j[6] for j in judged):
            return Comparison(False, "masked_row_nan", "softmax", ("left padding",), subject, n, 1, math.inf,
                              detail="Every real position matches, but padded positions hold NaN or inf." + note)
        return Comparison(True, None, None, (), subject, n, 0, error, detail=note.strip())
    first = wrong[0]
    key = first[5][0][0]
    where = _sub_layer(key, config) if key else "logits"

    class _C:  # the batches as cases for the separating features
        def __init__(self, f):
            self.features = f
    cases = [_C(j[2]) for j in judged]
    inputs = _separating(cases, [cases[i] for i, j in enumerate(judged) if j[5]])
    inside = f" (first module: {key})" if key and key != where else ""
    variants = model_variants(cfg, state, their_head)
    # each weight edit on every layer (a port's class is shared), then on the diverging sub-layer alone
    # (a loader's mistake in one tensor, the final norm's own eps or offset)
    variants += [v._replace(edit=_only_under(v.edit, where + "."), label=f"{v.label} in {where} alone")
                 for v in variants if v.edit is not None and where not in ("logits", "lm_head")]
    name = None if low is None else np.dtype(low).name
    for variant in variants:
        if low is not None and all(_reproduces_model_low(variant, cfg, state, key, j, low) for j in judged):
            return Comparison(False, variant.mistake, where, inputs, subject, n, len(wrong), error,
                              detail=f"Your model computes in {name}: reproduced at {key or 'the logits'} by the"
                                     f" reference with {variant.label} on every batch, within {PRECISION_FACTOR:g}"
                                     f" times that reference's own error in {name}.{note}")
        if low is None and all(_reproduces_model(variant, cfg, state, key, j) for j in judged):
            return Comparison(False, variant.mistake, where, inputs, subject, n, len(wrong), error,
                              detail=f"Reproduced at {key or 'the logits'} by the reference with {variant.label} on"
                                     f" every batch.{note}")
    if low is None and all(_model_in_size(cfg, state, key, j, np.dtype(np.float32)) for j in judged):
        return Comparison(False, "low_precision", where, inputs, subject, n, len(wrong), error,
                          detail=f"Reproduced in size at {key or 'the logits'} and the logits (within a factor of 10 on every batch)"
                                 f" by the reference run in float32: a step computed in float32; no mistake of the"
                                 f" catalogue reproduces it.{note}")
    if low is not None:
        inside += f"; your model computes in {name}, and this is beyond the reference's own error in it"
    return Comparison(False, None, where, inputs, subject, n, len(wrong), error,
                      detail=f"Largest relative error {error:.3g}{inside}; no mistake of the catalogue reproduces it"
                             f" on every batch.{note}")


def _model_in_low_precision(subject, config, results, refs, low, error, note):
    """Every module of a port computing in ``low`` within the reference's own error in ``low`` on
    every batch: ``low_precision``, located at the first module beyond the float64 tolerance."""
    name = np.dtype(low).name
    differing = [i for i, (r, ref) in enumerate(zip(results, refs))
                 if not _compare(r[3], ref[""], r[1], MODULE_RTOL)[0] <= MODULE_RTOL]
    ids, mask, features, logits, records = results[differing[0]]
    ref = refs[differing[0]]
    where = next((_sub_layer(key, config) for key, value in records if key in ref and key != ""
                  and not _compare(value, ref[key], mask, MODULE_RTOL)[0] <= MODULE_RTOL), "logits")
    return Comparison(False, "low_precision", where, (), subject, len(results), len(differing), error,
                      detail=f"Your model computes in {name}: every module and the logits are within"
                             f" {PRECISION_FACTOR:g} times the reference's own error in {name} on every batch"
                             f" (reproduced in size by the reference run in {name}).{note}")


def _model_in_size(cfg, state, key, j, low):
    """Whether the reference run in ``low`` differs from the float64 one by the size of the user's
    error at ``key`` and at the logits (a float64 port with a step in float32)."""
    ids, mask, features, logits, records = j[:5]
    try:
        ref = model_reference(state, cfg, ids, mask)
        own = model_reference(state, cfg, ids, mask, low)
    except Exception:  # a reference this precision cannot run reproduces nothing
        return False
    for name, value in ((key, logits if key == "" else records.get(key)), ("", logits)):
        if value is None:
            continue  # this batch did not reach the module (recorded on the others)
        user, _ = _compare(value, ref[name], mask, MODULE_RTOL)
        noise, _ = _compare(np.asarray(own[name], np.float64), ref[name], mask, MODULE_RTOL)
        if not _in_size(user, noise):
            return False
    return True


def _reproduces_model_low(variant, cfg, state, key, j, low):
    """A variant run in float64 and in ``low``: the user's output at ``key`` within
    :data:`PRECISION_FACTOR` times the low run's own error of the float64 one, on this batch."""
    ids, mask, features, logits, records = j[:5]
    value = logits if key == "" else records.get(key)
    if value is None:
        return True
    try:
        s, c = variant.edit(state, cfg) if variant.edit is not None else (state, cfg)
        _, keep = variant.case(ids, mask) if variant.case is not None else (ids, mask)
        theirs = model_reference(s, c, ids, keep)
        own = model_reference(s, c, ids, keep, low)
        if variant.compute is not None:  # on layer 0, whose input is the embedding's output
            modules = step_modules(config_of(c))
            prefix = modules["block"][0] + "."
            theirs = {**theirs, **(variant.compute(s, c, theirs, theirs[modules["embed"]], prefix) or {})}
            own = {**own, **(variant.compute(s, c, own, own[modules["embed"]], prefix) or {})}
    except Exception:  # a variant this config refuses reproduces nothing
        return False
    error, _ = _compare(value, theirs[key], mask, MODULE_RTOL)
    noise, _ = _compare(np.asarray(own[key], np.float64), theirs[key], mask, MODULE_RTOL)
    return _within_noise(error, noise, low)


def _only_under(edit, prefix):
    """``edit`` kept for the tensors under ``prefix`` only (the config as ``edit`` leaves it)."""
    def restricted(state, cfg):
        edited, c = edit(state, cfg)
        return {k: (edited[k] if k.startswith(prefix) else v) for k, v in state.items()}, c
    return restricted


def _reproduces_model(variant, cfg, state, key, j):
    ids, mask, features, logits, records = j[:5]
    value = logits if key == "" else records.get(key)
    if value is None:
        return True  # this batch did not reach the module (recorded on the others)
    try:
        s, c = variant.edit(state, cfg) if variant.edit is not None else (state, cfg)
        _, keep = variant.case(ids, mask) if variant.case is not None else (ids, mask)
        theirs = model_reference(s, c, ids, keep)
        if variant.compute is not None:  # on layer 0, whose input is the embedding's output
            config = config_of(c)
            modules = step_modules(config)
            theirs = {**theirs, **(variant.compute(s, c, theirs, theirs[modules["embed"]],
                                                   modules["block"][0] + ".") or {})}
    except Exception:  # a variant this config refuses reproduces nothing
        return False
    error, _ = _compare(value, theirs[key], mask, MODULE_RTOL)
    before = {name: e for name, _, e in j[5]}.get(key, 0.0)  # the user's error against the reference there
    return error <= min(MODULE_RTOL, before / 100) or (before == 0.0 and error <= MODULE_RTOL)
