"""A ``save_pretrained`` folder read as hostile input: its config, its weights, nothing outside it.

``read_config(folder)`` reads ``config.json`` and checks every field the model reads for its
type and range (a count is a positive JSON integer, a flag a JSON boolean, an epsilon a
positive number) before :meth:`LMConfig.from_dict` sees it. ``read_state_dir(folder)`` reads
``model.safetensors`` or the shards that ``model.safetensors.index.json`` lists: a shard name
must be a plain file name in the folder (no ``/``, ``\\``, ``..``, absolute path or NUL), each
file a regular one (a symlink to one is fine: the Hugging Face cache is made of them), and
each tensor in the shard the index names. ``expected_shapes(config)`` is the shape of every
parameter that config.json implies. Every error names the file and the field or tensor.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..models.config import LMConfig, check_config_fields
from ..models.params import tensor_shapes
from .safetensors import open_regular, read_safetensors

__all__ = ["read_config", "read_state_dir", "expected_shapes", "MAX_JSON_BYTES"]

#: config.json and the shard index are small; a bigger one is refused before it is read.
MAX_JSON_BYTES = 50_000_000


def _read_json(path: Path, what: str):
    f, _ = open_regular(path, what, max_bytes=MAX_JSON_BYTES)
    with f:
        raw = f.read()
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def _check_fields(d: dict, path: Path) -> None:
    """The fields :meth:`LMConfig.from_dict` reads, by type and range
    (:func:`attention_ref.models.config.check_config_fields`); one error naming the file and the field."""
    try:
        check_config_fields(d)
    except ValueError as e:
        raise ValueError(f"{path}: {e.args[0]}") from None


def read_config(folder) -> LMConfig:
    """The :class:`LMConfig` of ``folder/config.json``, every field it reads checked."""
    path = Path(folder) / "config.json"
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{folder} has no config.json: not a save_pretrained directory")
    d = _read_json(path, "config.json")
    if not isinstance(d, dict):
        raise ValueError(f"{path}: expected a JSON object, found {_kind(d)}")
    _check_fields(d, path)
    try:
        return LMConfig.from_dict(d)
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{path}: {e.args[0] if e.args else e}") from None


def _shard_path(folder: Path, name, index: Path) -> Path:
    """``folder / name`` when ``name`` is a plain file name; anything that could leave the folder is refused."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
            or "\x00" in name or os.path.isabs(name) or os.path.basename(name) != name):
        raise ValueError(f"{index}: weight_map names the file {name!r}; a shard must be a plain file name in"
                         f" {folder} (no folders, no '..', no absolute path)")
    return folder / name


def read_state_dir(path, sources: dict | None = None) -> dict:
    """Names -> arrays of the weights in a ``save_pretrained`` directory (one file or shards).
    ``sources``, when given, is filled with each tensor's file."""
    folder = Path(path)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if os.path.lexists(single):
        state = read_safetensors(single)
        if sources is not None:
            sources.update(dict.fromkeys(state, single))
        return state
    if os.path.lexists(index):
        return _read_shards(folder, index, sources)
    found = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else "not a directory"
    variants = [n for n in found if n.startswith("model.") and n.endswith(".safetensors")] if folder.is_dir() else []
    hint = (f"; {variants} look like a save_pretrained(variant=...) file: rename it to model.safetensors"
            if variants else "; save the model with save_pretrained (safetensors, the default)")
    raise FileNotFoundError(f"{folder} has neither model.safetensors nor model.safetensors.index.json"
                            f" (found: {found}){hint}")


def _read_shards(folder: Path, index: Path, sources) -> dict:
    table = _read_json(index, "the shard index")
    weight_map = table.get("weight_map") if isinstance(table, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: expected an object with a non-empty 'weight_map' of tensor names -> file"
                         f" names, found {_kind(weight_map) if isinstance(table, dict) else _kind(table)}")
    files = {}
    for tensor, name in weight_map.items():
        files.setdefault(_shard_path(folder, name, index), []).append(tensor)
    state, where = {}, {}
    for file, listed in sorted(files.items()):
        shard = read_safetensors(file)
        missing = [t for t in listed if t not in shard]
        if missing:
            raise ValueError(f"{index}: weight_map puts {missing[0]!r} in {file.name}, which has no such tensor")
        for tensor in shard:
            if tensor in state:
                raise ValueError(f"{file}: tensor {tensor!r} is also in {where[tensor].name}")
            where[tensor] = file
        state.update(shard)
    if sources is not None:
        sources.update(where)
    return state


def expected_shapes(config: LMConfig) -> dict:
    """Our parameter names -> the shapes config.json implies (the token table (V, D), ...): the
    family's parameter table, :func:`attention_ref.models.params.tensor_shapes`."""
    return tensor_shapes(config)
