"""Read and write the ``.safetensors`` format in plain NumPy (no torch, no safetensors package).

A file is: 8 bytes, the little-endian length n of a JSON header; n bytes of JSON, one entry
per tensor ``{"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}`` (offsets into
the data after the header) and an optional ``"__metadata__"``; then the tensors' bytes,
little-endian, row-major. bfloat16 (``BF16``) is read into float32 exactly (its 16 bits are the
high half of a float32).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from .._atomic import write_atomic

__all__ = ["read_safetensors", "write_safetensors"]

_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
           "U8": "u1", "BOOL": "?"}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def read_safetensors(path) -> dict:
    """Names -> arrays of one ``.safetensors`` file (copies, native byte order)."""
    path = Path(path)
    raw = path.read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path} is not a safetensors file: {len(raw)} bytes")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path} is not a safetensors file: a header of {n} bytes in a file of {len(raw)}")
    header = json.loads(raw[8:8 + n])
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if entry["dtype"] == "BF16":
            bits = np.frombuffer(data[begin:end], "<u2").astype(np.uint32) << 16  # the high half of a float32
            out[name] = bits.view(np.float32).reshape(shape)
            continue
        if entry["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {entry['dtype']}, which this reader does not know")
        dtype = np.dtype(_DTYPES[entry["dtype"]])
        arr = np.frombuffer(data[begin:end], dtype)
        if arr.size != int(np.prod(shape)):
            raise ValueError(f"{path}: tensor {name!r} of shape {shape} has {arr.size} values")
        out[name] = arr.reshape(shape).astype(dtype.newbyteorder("="))
    return out


def write_safetensors(tensors: dict, path, metadata: dict | None = None) -> None:
    """Write names -> arrays as one ``.safetensors`` file (float64/32/16, integers, bool)."""
    header, chunks, offset = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        if arr.dtype not in _NAMES and arr.dtype.newbyteorder("<") not in _NAMES:
            raise TypeError(f"tensor {name!r} has dtype {arr.dtype}, which safetensors cannot hold here")
        key = _NAMES.get(arr.dtype) or _NAMES[arr.dtype.newbyteorder("<")]
        blob = arr.astype(np.dtype(_DTYPES[key]), copy=False).tobytes()
        header[name] = {"dtype": key, "shape": list(arr.shape), "data_offsets": [offset, offset + len(blob)]}
        chunks.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-aligned
    write_atomic(path, struct.pack("<Q", len(text)) + text + b"".join(chunks))
