"""Whole models from and to transformers: a ``save_pretrained`` directory read into our params,
and our params or gradients under transformers' names.

``load_pretrained(path)`` reads ``config.json`` and ``model.safetensors`` (or the shards
listed by ``model.safetensors.index.json``), with no torch; ``from_transformers_state`` maps a
state dict already in memory; ``to_transformers`` goes the other way, under the names of
``model.state_dict()`` (a tied head included) of the installed transformers or of a ``version=``,
so ``load_state_dict(..., strict=True)`` takes it. The tables are :data:`attention_ref.interop.MAPPINGS`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .._checks import check_float_dtype
from ..models.config import LMConfig, family_of
from ..models.family import block_tensors
from ..models.params import LAYER_PREFIX, TOKEN_TABLE, param_names
from .converters import _apply
from .mappings import MAPPINGS, WHOLE_MODELS
from .model_folder import expected_shapes, read_config, read_state_dir

__all__ = ["load_pretrained", "from_transformers_state", "to_transformers", "read_state_dir"]


def load_pretrained(path, dtype=None):
    """``(params, config)`` of the model (any family of :data:`attention_ref.FAMILIES`) saved in directory ``path``.

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

    Nothing outside the folder is read, and nothing in it is trusted (see
    :mod:`attention_ref.interop.model_folder` and :mod:`attention_ref.interop.safetensors`): every
    config field is checked for its type and range, every tensor's shape against config.json,
    and an error names the file, the field or tensor, what was expected and what was found. The
    weights are views on one read of each file: loading takes about the file's size in memory
    when ``dtype`` is the stored one.
    """
    if dtype is not None:
        dtype = check_float_dtype(dtype)  # float32 or float64: the models compute in nothing else
    folder = Path(path)
    config = read_config(folder)
    sources = {}
    state = read_state_dir(folder, sources)
    try:
        params = _params_from_state(state, config, dtype, copy=False)
    except KeyError as e:
        raise KeyError(f"{folder}: {e.args[0]}") from None
    except ValueError as e:
        raise ValueError(f"{folder}: {e.args[0]}") from None
    _check_shapes(params, config, state, sources, folder)
    return params, config


def _check_shapes(params, config, state, sources, folder):
    """Each tensor against the shape config.json implies, named by its file and its own name."""
    table, layer_prefix, _ = WHOLE_MODELS[config.family]
    theirs = {ours: rule.theirs for rule in MAPPINGS[table] for ours in rule.ours}
    for i in range(config.num_layers):
        theirs.update({f"{LAYER_PREFIX[config.family]}.{i}.{ours}": layer_prefix.format(i=i) + rule.theirs
                       for rule in _layer_rules(config, i) for ours in rule.ours})
    base = family_of(config).base
    for name, shape in expected_shapes(config).items():
        if name not in params:
            continue
        key = theirs.get(name, name)
        if "{e}" in key:  # stored per expert: the stacked shape (E, in, out) is each expert's (out, in)
            key = key.format(e=0)
            shape_note = f" (each expert (out, in) = {shape[:0:-1]})"
        else:
            shape_note = ""
        stored = key if key in sources else key[len(base):] if key.startswith(base) else key
        file = sources.get(stored, folder)
        if not np.issubdtype(params[name].dtype, np.floating):
            raise TypeError(f"{file}: tensor {stored!r} has dtype {params[name].dtype}; a weight must be floating"
                            " (F16, BF16, F32 or F64)")
        if params[name].shape != shape:
            found = np.shape(state[stored]) if stored in state else params[name].shape
            raise ValueError(f"{file}: tensor {stored!r} has shape {tuple(found)}; config.json ({config.family},"
                             f" vocab_size={config.vocab_size}, d_model={config.d_model}, d_ff={config.d_ff},"
                             f" num_heads={config.num_heads}, num_kv_heads={config.num_kv_heads},"
                             f" max_positions={config.max_positions}, num_experts={config.num_experts}) makes it"
                             f" {shape} as our {name!r}{shape_note}")


def _layer_rules(config, i):
    """The rules of the family's block table that block ``i`` of ``config``'s model has (a row's
    ``in_layer``: a dense MLP on some layers, a mixture of experts on others)."""
    family = family_of(config)
    rules = MAPPINGS[family.block_title]
    if all(t.in_layer is None for t in family.block):
        return rules
    has = {t.theirs for t in block_tensors(family, config, i)}
    return [rule for rule in rules if rule.theirs in has]


def _strip_base(state, family):
    """A bare base model's state (``GPT2Model``: ``wte.weight``; ``LlamaModel``: ``embed_tokens.weight``)
    under the LM's names (the family's ``base``: ``transformer.``, ``model.``); a head stored under
    another name than ``lm_head.weight`` (GPT-NeoX's ``embed_out.weight``) is read under either."""
    spec = family_of(family)
    base = spec.base
    head = [t.theirs for t in spec.final if t.ours == ("lm_head.W",)]
    if head and head[0] != "lm_head.weight" and "lm_head.weight" in state and head[0] not in state:
        state = {(head[0] if k == "lm_head.weight" else k): v for k, v in state.items()}  # 5.x's name
    if any(k.startswith(base) for k in state):
        return state
    return {k if k.startswith("lm_head.") else base + k: v for k, v in state.items()}


def from_transformers_state(state, config: LMConfig, dtype=None) -> dict:
    """Our params from a whole model's state dict (names -> arrays, e.g. ``{k: v.numpy() for
    k, v in model.state_dict().items()}``); a missing or mis-shaped tensor is named. The arrays
    are copies: the state stays the caller's."""
    return _params_from_state(state, config, dtype, copy=True)


def _params_from_state(state, config, dtype, copy):
    """from_transformers_state; ``copy=False`` for a state that is ours (read from files): views."""
    state = _strip_base(state, config.family)
    table, layer_prefix, block_table = WHOLE_MODELS[config.family]
    state = _split_fused_experts(state, config, layer_prefix)
    params = {k: v for k, v in _apply(table, state, "", copy=copy).items() if v is not None}
    if config.tie_word_embeddings:
        head = params.pop("lm_head.W", None)  # stored or not, the head is the token table
        table_name = TOKEN_TABLE[config.family]
        if head is not None and table_name in params and (
                head.shape != params[table_name].T.shape or not np.array_equal(head, params[table_name].T)):
            # transformers 4.x reads the token table as the head, 5.x the stored one: neither is guessed
            raise ValueError("the config says tie_word_embeddings = True but the state holds an 'lm_head.weight'"
                             " that differs from the token table (transformers 4.x would use the table, 5.x the"
                             " stored head); set tie_word_embeddings in config.json to say which is meant")
    elif "lm_head.W" not in params:
        raise KeyError("the config says tie_word_embeddings = False but the state has no 'lm_head.weight'")
    for i in range(config.num_layers):
        block = _apply(block_table, state, layer_prefix.format(i=i), copy=copy, rules=_layer_rules(config, i),
                       experts=config.num_experts)
        params.update({f"{LAYER_PREFIX[config.family]}.{i}.{k}": v for k, v in block.items() if v is not None})
    start = layer_prefix.split("{")[0]
    indices = {k: k[len(start):].split(".")[0] for k in state if k.startswith(start)}
    extra = [k for k, i in indices.items() if not i.isdigit() or int(i) >= config.num_layers]
    if extra:
        raise ValueError(f"the state has layers past the config's num_layers = {config.num_layers}: {extra[:3]}")
    _refuse_unread(state, config, table, layer_prefix)
    out = {}
    for name in param_names(config):
        if name in params:
            value = params[name]
            if dtype is not None:
                value = value.astype(dtype, copy=False)
            elif value.dtype == np.float16:
                value = value.astype(np.float32)
            out[name] = value
    return out


def _split_fused_experts(state, config, layer_prefix):
    """``state`` with transformers 5.x's fused experts (the family's ``experts_5x``: ``model.state_dict()``'s
    ``mlp.experts.gate_up_proj`` (E, 2F, D)) under the files' per-expert names (``mlp.experts.{e}.gate_proj.weight``
    (F, D)), as 5.x's ``save_pretrained`` writes them; a state without them is returned as it is."""
    fused = family_of(config).experts_5x
    if not fused or not any(layer_prefix.format(i=i) + name in state
                            for i in range(config.num_layers) for name, _ in fused):
        return state
    state = dict(state)
    E = config.num_experts
    for i in range(config.num_layers):
        prefix = layer_prefix.format(i=i)
        for name, parts in fused:
            if prefix + name not in state:
                continue
            t = np.asarray(state.pop(prefix + name))
            if t.ndim != 3 or t.shape[0] != E or t.shape[1] % len(parts):
                raise ValueError(f"{prefix + name} has shape {t.shape}; it must stack the config's num_experts = {E}"
                                 f" experts' {len(parts)} projection(s) (E, {len(parts)} F, D)")
            for part, block in zip(parts, np.split(t, len(parts), axis=1)):
                state.update({prefix + part.format(e=e): block[e] for e in range(E)})
    return state


def _refuse_unread(state, config, table, layer_prefix):
    """A tensor of ``state`` that no step reads is refused by name (a config of another family under this
    ``model_type``: Granite's, ERNIE 4.5's, HunYuan's extra weights). The buffers transformers computes
    from the config and never loads (the family's ``buffers``: old files' ``rotary_emb.inv_freq``,
    GPT-2's causal ``attn.bias`` / ``attn.masked_bias``) are left unread here too."""
    read = {rule.theirs for rule in MAPPINGS[table]}
    experts = range(config.num_experts or 0)
    for i in range(config.num_layers):
        for rule in _layer_rules(config, i):
            names = [rule.theirs.format(e=e) for e in experts] if "{e}" in rule.theirs else [rule.theirs]
            read.update(layer_prefix.format(i=i) + name for name in names)
    buffers = family_of(config).buffers
    unread = [k for k in state if k not in read and not any(k == b or k.endswith("." + b) for b in buffers)]
    if unread:
        raise ValueError(f"the state holds {unread[0]!r}{f' (and {len(unread) - 1} more)' if len(unread) > 1 else ''},"
                         f" which no step of a {config.family} model reads (not a tensor of transformers'"
                         f" {config.family} model: a checkpoint of another family?); the model cannot be run here")


def to_transformers(tree, config: LMConfig, version=None) -> dict:
    """Our params or gradients (a dict keyed like :func:`attention_ref.models.param_names`) under
    the names of transformers' ``model.state_dict()``, as a dict of arrays in their layouts
    (``nn.Linear`` transposed back, GPT-2's Q, K and V fused into ``c_attn``), so that
    ``model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)`` takes it.

    Parameters
    ----------
    tree : params (or their gradients) of the model ``config``
    config : LMConfig
    version : the transformers release whose names to use: a version string (``"4.57.1"``,
        ``"5.24.0"``) or its major number (4 or 5); default: the installed transformers (found
        without importing it), else 5.x. Two things differ: GPT-NeoX's head (``embed_out.weight`` in
        4.x, ``lm_head.weight`` in 5.x; its ``save_pretrained`` file still says ``embed_out.weight``), and a
        mixture of experts (the family's ``experts_5x``), one ``nn.Linear`` per expert in 4.x
        (``mlp.experts.{e}.gate_proj.weight``) and fused in 5.x (``mlp.experts.gate_up_proj`` (E, 2F, D),
        ``mlp.experts.down_proj`` (E, D, F)); 5.x's ``save_pretrained`` still writes them per expert, and
        :func:`load_pretrained` and :func:`from_transformers_state` read either.

    A tied head is in the state dict under the head's name too (the same array as the token
    table; for gradients, the table's gradient, which sums both uses, as the one tied parameter's
    ``.grad`` does). ``save_pretrained`` writes a tied weight once: drop the head's name when
    writing a file for a tied model.
    """
    if not isinstance(config, LMConfig):
        raise TypeError(f"config must be an LMConfig, got {type(config).__name__}")
    major = _major_version(version)
    table, layer_prefix, _ = WHOLE_MODELS[config.family]
    out = _reverse(MAPPINGS[table], tree, "", "")
    for i in range(config.num_layers):
        out.update(_reverse(_layer_rules(config, i), tree, f"{LAYER_PREFIX[config.family]}.{i}.",
                            layer_prefix.format(i=i)))
    if major >= 5:
        out = _fuse_experts(out, config, layer_prefix)
    return _state_dict_names(out, tree, config, major)


def _fuse_experts(out, config, layer_prefix):
    """The per-expert tensors of ``out`` fused as transformers 5.x's ``model.state_dict()`` holds them (the
    family's ``experts_5x``): each expert's (out, in) stacked on axis 0, the projections concatenated on axis 1."""
    fused = family_of(config).experts_5x
    for i in range(config.num_layers):
        prefix = layer_prefix.format(i=i)
        for name, parts in fused:
            if prefix + parts[0].format(e=0) not in out:
                continue
            stacks = [np.stack([out.pop(prefix + part.format(e=e)) for e in range(config.num_experts)])
                      for part in parts]  # each (E, out, in)
            out[prefix + name] = np.ascontiguousarray(np.concatenate(stacks, axis=1))
    return out


def _state_dict_names(out, tree, config, major):
    """The file's names (:data:`MAPPINGS`) as ``model.state_dict()`` of that transformers major
    version has them: the tied head added under the head's name, and in 5.x the modules 4.57 named
    otherwise (the family's ``names_4x``: GPT-NeoX's ``embed_out``) under their 5.x names."""
    names_4x = dict(family_of(config).names_4x)  # 5.x's module name -> 4.57's
    if major >= 5:
        renamed = {old: new for new, old in names_4x.items()}
        out = {_renamed(name, renamed): value for name, value in out.items()}
    head = f"{'lm_head' if major >= 5 else names_4x.get('lm_head', 'lm_head')}.weight"
    if config.tie_word_embeddings and tree.get(TOKEN_TABLE[config.family]) is not None:
        token_rule = next(rule for rule in MAPPINGS[WHOLE_MODELS[config.family][0]]
                          if rule.ours == (TOKEN_TABLE[config.family],))
        out[head] = out[token_rule.theirs]  # one parameter under two names, as in the state dict
    return out


def _renamed(name, renamed):
    """``name`` with its first module renamed when ``renamed`` has it (``embed_out.weight`` -> ``lm_head.weight``)."""
    first, _, rest = name.partition(".")
    return f"{renamed[first]}.{rest}" if first in renamed and rest else name


def _major_version(version):
    """transformers' major version number from ``version`` (None: the installed release, else 5)."""
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version("transformers")
        except metadata.PackageNotFoundError:
            return 5
    if isinstance(version, (int, np.integer)) and not isinstance(version, bool):
        major = int(version)
    elif isinstance(version, str) and version.split(".")[0].isdigit():
        major = int(version.split(".")[0])
    else:
        raise ValueError(f"version must be a transformers version such as '4.57.1' or '5.24.0', or its major"
                         f" number 4 or 5, got {version!r}")
    if major < 4:
        raise ValueError(f"version must be transformers 4.x or 5.x or later, got {version!r}")
    return major


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
        if rule.how == "stack experts, transpose":  # our (E, in, out) -> each expert's (out, in)
            out.update({theirs_prefix + rule.theirs.format(e=e): np.ascontiguousarray(w.T)
                        for e, w in enumerate(parts[0])})
            continue
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
