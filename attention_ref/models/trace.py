"""The reference's output at every module of transformers' model, by the module's name: :func:`lm_trace`.

The trace runs the whole model's one step list (:func:`attention_ref.models.lm.run_steps`, the steps
:func:`lm_forward` runs) and reads each module's output from what the steps returned: the residual
stream after the embedding and after each block, the block caches the backward uses (each family's
``trace_block`` says which field is which of transformers' modules), the final norm and the head.
No step is written a second time: where a module's output is not kept, the trace applies the
same formula to the input the step kept (a linear layer's ``x W + b``).

Keys are the names of ``named_modules()`` of transformers 5.x's ``*ForCausalLM`` (the root's
name ``""`` holds the logits), in the order transformers' forward hooks fire (a module after the
modules it calls); steps inside a module that transformers has no module for are keyed
``<module>:<step>`` (:data:`attention_ref.models.trace_steps.ATTENTION_STEPS` inside attention).
"""
from __future__ import annotations

import numpy as np

from .config import LMConfig, family_of
from .lm import prepared_blocks, run_steps, step_modules
from .params import check_lm_inputs
from .trace_steps import linear_output

__all__ = ["lm_trace", "trace_names_4x"]


def _selector(only):
    """``only`` as a predicate on names: None (every name), a list/tuple/set of names or a callable."""
    if only is None:
        return lambda name: True
    if callable(only):
        return only
    if isinstance(only, str) or not isinstance(only, (list, tuple, set, frozenset)):
        raise TypeError(f"only must be None, a list of module names or a predicate on a name,"
                        f" got {type(only).__name__}")
    names = set(only)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"only must list module names (str), got {bad[0]!r}")
    return names.__contains__


def lm_trace(ids, params, config: LMConfig, attention_mask=None, *, only=None) -> dict:
    """Every module's output of transformers' ``*ForCausalLM`` for the config's family, by name.

    Parameters
    ----------
    ids : integer array (..., T), token ids in ``[0, vocab_size)``
    params : dict with the keys of :func:`attention_ref.models.param_names`
    config : LMConfig
    attention_mask : optional (..., T) of 0/1, as :func:`attention_ref.lm_forward` (the values at
        padded positions follow no single convention: compare the real positions only)
    only : None (every module), a list of names (each must be one of the model's), or a predicate
        ``name -> bool``; the model runs whole either way, only the chosen outputs are kept

    Returns
    -------
    dict name -> array, in the order transformers' forward hooks fire: each embedding, and for
    each layer its norms, linear layers (q/k norms where the family has them), the attention's
    steps (``<attention>:q_rope`` (..., H, T, Dh), ``:k_rope`` (..., Hkv, T, Dh), ``:scores`` and
    ``:probs`` (..., H, T, T)), the attention module, the activation, the MLP and the decoder
    layer, then the final norm, the base model (its last hidden state), the head and ``""`` (the
    logits, after Gemma 2's cap). Values in the params' dtype; shapes as transformers' outputs
    (batch axes ``...`` for its B; GPT-2's ``transformer.wpe`` (T, D) broadcasts over them).
    ``q_rope`` and ``k_rope`` are the queries and keys as the attention used them (not rotated
    where the layer has no RoPE: GPT-2, SmolLM3's NoPE layers); ``scores`` are ``-inf`` where the
    probability is 0 (masked keys). A full trace keeps every activation, the (..., H, T, T) scores and probabilities of
    every layer among them: pass ``only`` to keep the modules you need from a long sequence.
    Names transformers 4.57 spells otherwise: :func:`trace_names_4x`.
    """
    if not isinstance(config, LMConfig):
        raise TypeError(f"config must be an LMConfig (attention_ref.LMConfig.from_dict(config.json)),"
                        f" got {type(config).__name__}")
    keep = _selector(only)
    ids, params, mask = check_lm_inputs(ids, params, config, attention_mask)  # mask: (..., 1, T) or None
    family, modules = family_of(config), step_modules(config)  # each step's module name
    if family.trace_block is None:
        raise ValueError(f"{config.family}: this family has no trace (its file sets no trace_block)")
    positions = np.arange(ids.shape[-1])
    stream = []  # the residual stream after step 1 and after each block
    blocks = prepared_blocks(params, config)  # each layer's params as its block takes them
    logits, (embed, caches, _, head, _) = run_steps(ids, positions, params, config, mask, blocks=blocks,
                                                    record=stream.append)
    entries = []
    # 1. the embeddings
    if family.trace_embed is None:
        entries.append((modules["embed"], stream[0]))
    else:
        entries.extend(family.trace_embed(stream[0], embed, params, config))
    # 2. each block: its modules, then the decoder layer itself
    for layer, (cache, name) in enumerate(zip(caches, modules["block"])):
        inside = family.trace_block(cache, blocks[layer], config)  # [(name inside the layer, output)]
        # a name starting with ":" is a step of the layer module itself (BLOOM's block returns its probabilities)
        entries.extend((f"{name}{inner}" if inner.startswith(":") else f"{name}.{inner}", value)
                       for inner, value in inside)
        entries.append((name, stream[layer + 1]))
    # 3. the final norm (the head's input), the base model's last hidden state
    entries.append((modules["final_norm"], head.x))
    entries.append((family.base[:-1], head.x))
    # 4. the head, 5. the whole model: the logits
    entries.append((modules["head"], linear_output(head)))
    entries.append(("", logits))
    listed = only if isinstance(only, (list, tuple, set, frozenset)) else ()
    unknown = sorted(set(listed) - {name for name, _ in entries})
    if unknown:
        raise ValueError(f"only names modules this model does not have: {unknown[:3]} (its names: lm_trace's keys)")
    return {name: value for name, value in entries if keep(name)}


def trace_names_4x(config) -> dict:
    """``{5.x name: 4.57 name}`` for the modules of ``config``'s family (an LMConfig or a
    ``model_type``) that transformers 4.57 names otherwise (GPT-NeoX's head ``embed_out``); empty
    when the names agree."""
    return dict(family_of(config).names_4x)
