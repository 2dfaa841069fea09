"""A small model folder with random weights, as ``save_pretrained`` writes one: for examples,
the README and tests that need a model of a given family without downloading one.

``write_random_model(path, "llama", seed=0)`` writes ``config.json`` (transformers' field names
for that family, readable by transformers 4.57 and 5.x and by :func:`load_pretrained`) and
``model.safetensors`` (the weights under transformers' names, float32 by default as a model
built in PyTorch saves them). Every number comes from ``seed``: the same seed gives the same
files.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .._atomic import write_atomic
from .._checks import check_float_dtype
from ..models.config import FAMILIES, LMConfig
from ..models.families import FAMILY
from ..models.params import init_lm_params
from .pretrained import to_transformers
from .safetensors import write_safetensors

__all__ = ["write_random_model", "random_model_config"]

_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # inside the vocabulary, for every family


def random_model_config(family: str, **fields) -> dict:
    """The ``config.json`` that :func:`write_random_model` writes for ``family`` (one of
    :data:`attention_ref.models.FAMILIES`), with ``fields`` (transformers' names) set over it."""
    if family not in FAMILY or FAMILY[family].example is None:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    return {"model_type": family, **_TOKENS, **FAMILY[family].example, **fields}  # the family file's small model


def write_random_model(path, family: str = "llama", *, seed=None, dtype=np.float32, **fields) -> Path:
    """Write a small ``family`` model with random weights into the folder ``path``, as
    ``save_pretrained`` does: ``config.json`` and ``model.safetensors``. Returns the folder.

    Parameters
    ----------
    path : a folder, created if missing (its parent must exist); config.json and
        model.safetensors in it are replaced, nothing else is touched
    family : transformers' ``model_type``, one of :data:`attention_ref.models.FAMILIES`
    seed : None, an int or a ``numpy.random.Generator``: the weights
        (:func:`attention_ref.models.init_lm_params`: normal with std 0.02, norms at 1)
    dtype : float32 (default, as a model built in PyTorch saves) or float64
    fields : config.json fields to set, by transformers' names (``vocab_size=100``,
        ``tie_word_embeddings=True``, ...); the model is 64 tokens, width 16, 2 layers of 4 heads
        (2 key/value heads where the family has grouped heads), MLP width 32, 64 positions

    The config is read back with :meth:`LMConfig.from_dict` before anything is written, so a
    field this package does not compute is refused by name and no file is left behind.
    """
    dtype = check_float_dtype(dtype)
    config_json = random_model_config(family, **fields)
    config = LMConfig.from_dict(config_json)
    folder = Path(os.fspath(path))
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder}: path must be a folder (or a new name), found a file")
    params = init_lm_params(config, seed=seed, dtype=dtype)
    state = to_transformers(params, config, version=4)  # the files' names: 5.x's save_pretrained writes 4.x's too
    if config.tie_word_embeddings:  # a tied weight once, under the token table's name, as save_pretrained writes
        state = {k: v for k, v in state.items() if k not in ("lm_head.weight", "embed_out.weight")}
    folder.mkdir(exist_ok=True)
    write_atomic(folder / "config.json", json.dumps(config_json, indent=2) + "\n")
    write_safetensors(state, folder / "model.safetensors", metadata={"format": "pt"})
    return folder
