"""Read and write the ``.safetensors`` format in plain NumPy (no torch, no safetensors package).

A file is: 8 bytes, the little-endian length n of a JSON header; n bytes of JSON, one entry
per tensor ``{"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}`` (offsets into
the data after the header) and an optional ``"__metadata__"`` (strings to strings); then the
tensors' bytes, little-endian, row-major. bfloat16 (``BF16``) is read into float32 exactly (its
16 bits are the high half of a float32).

The reader trusts nothing in the file, as the format's own rules say: a regular file only
(never a device or a FIFO, which are refused before they are opened for reading), a header of
at most :data:`MAX_HEADER_BYTES`, a JSON object without repeated names, each entry's dtype,
shape and offsets of the right types, ``end - begin = prod(shape) * itemsize``, and the
tensors' byte ranges sorted, contiguous from 0, non-overlapping and covering the data exactly.
Every error names the file, the tensor or field, what was expected and what was found. The
data is read once into one buffer and the tensors are views on it (no second copy).
"""
from __future__ import annotations

import json
import math
import os
import stat
import struct
import sys

import numpy as np

from .._atomic import write_atomic

__all__ = ["read_safetensors", "write_safetensors", "MAX_HEADER_BYTES"]

#: The largest header read (the safetensors package's own limit).
MAX_HEADER_BYTES = 100_000_000
_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
           "I8": "i1", "U8": "u1", "BOOL": "?"}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items() if k != "BF16"}
_RESERVED = "__metadata__"


def open_regular(path, what="file", max_bytes=None):
    """``(unbuffered binary file, size)`` of ``path`` if it is a regular file (a symlink to one is
    fine); a device, FIFO, socket or folder is refused with its kind named, before it is opened
    for reading (and opened non-blocking, so a FIFO swapped in meanwhile cannot hang)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: {what} not found") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise ValueError(f"{path}: {what} must be a regular file, found {kind}")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between the two looks
            raise ValueError(f"{path}: {what} must be a regular file, found something else when opened")
        if max_bytes is not None and st.st_size > max_bytes:
            raise ValueError(f"{path}: {what} has {st.st_size} bytes, more than the {max_bytes} allowed")
        return os.fdopen(fd, "rb", buffering=0), st.st_size
    except BaseException:
        os.close(fd)
        raise


def _read_exactly(f, buffer, path) -> None:
    view = memoryview(buffer).cast("B")
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise ValueError(f"{path}: the file ended after {done} of {len(view)} bytes while reading it"
                             " (it changed while being read)")
        done += n


def _no_repeats(pairs):
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"the name {repeated[0]!r} appears more than once")
    return dict(pairs)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _entry(path, name, entry):
    """(dtype code, shape, begin, end) of one header entry, every field checked."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        found = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise ValueError(f"{where}: expected an object with dtype, shape and data_offsets, found {found}")
    code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(code, str) or code not in _DTYPES:  # a list or an object is no dtype name either
        raise ValueError(f"{where}: field 'dtype' is {code!r:.100}, which this reader does not know (known:"
                         f" {sorted(_DTYPES)})")
    if not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
        raise ValueError(f"{where}: shape must be a list of integers >= 0, found {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(n) for n in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise ValueError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, found {offsets!r}")
    begin, end = offsets
    expected = math.prod(shape) * np.dtype(_DTYPES[code]).itemsize
    if end - begin != expected:
        raise ValueError(f"{where}: shape {shape} of {code} needs {expected} bytes, data_offsets {offsets} hold"
                         f" {end - begin}")
    return code, tuple(shape), begin, end


def read_header(f, path, size):
    """``(entries, metadata, data start)`` of an open safetensors file of ``size`` bytes, checked;
    entries are ``(name, dtype code, shape, begin, end)`` in the order of their bytes."""
    if size < 8:
        raise ValueError(f"{path} is not a safetensors file: {size} bytes, fewer than the 8 of the header length")
    head = bytearray(8)
    _read_exactly(f, head, path)
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_BYTES:
        raise ValueError(f"{path} is not a safetensors file: a header of {n} bytes, more than the"
                         f" {MAX_HEADER_BYTES} allowed")
    if 8 + n > size:
        raise ValueError(f"{path} is not a safetensors file: a header of {n} bytes in a file of {size}")
    raw = bytearray(n)
    _read_exactly(f, raw, path)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_repeats)
    except (UnicodeDecodeError, ValueError) as e:  # json's errors are ValueErrors
        raise ValueError(f"{path}: the header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header must be a JSON object, found {type(header).__name__}")
    metadata = header.pop(_RESERVED, None)
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(v, str) for v in metadata.values())):
        raise ValueError(f"{path}: __metadata__ must map strings to strings, found {metadata!r:.200}")
    entries = sorted(((name, *_entry(path, name, e)) for name, e in header.items()), key=lambda t: (t[3], t[4]))
    data = size - 8 - n
    at, previous = 0, None
    for name, _, _, begin, end in entries:
        if end > data:
            raise ValueError(f"{path}: tensor {name!r} ends at byte {end} of the data, which has {data} bytes:"
                             " the file is truncated")
        if begin != at:
            what = (f"overlaps tensor {previous!r}, which ends at {at}" if begin < at
                    else f"leaves a gap: the previous tensor ends at {at}")
            raise ValueError(f"{path}: tensor {name!r} begins at byte {begin}, which {what} (the tensors' bytes"
                             " must be contiguous, in order, from 0)")
        at, previous = end, name
    if at != data:
        raise ValueError(f"{path}: the tensors cover {at} bytes but the data after the header has {data}")
    return entries, metadata, 8 + n


def read_safetensors(path) -> dict:
    """Names -> arrays of one ``.safetensors`` file (native byte order; views on one buffer read
    once, so the arrays are writeable and the caller's own)."""
    f, size = open_regular(path, "safetensors file")
    with f:
        entries, _, start = read_header(f, path, size)
        buffer = np.empty(size - start, np.uint8)  # pages are touched only by the read
        _read_exactly(f, buffer, path)
    out = {}
    for name, code, shape, begin, end in entries:
        dtype = np.dtype(_DTYPES[code])
        if begin == end:
            arr = np.empty(shape, dtype)
        else:
            arr = buffer[begin:end].view(dtype) if begin % dtype.itemsize == 0 else \
                np.frombuffer(buffer[begin:end].tobytes(), dtype)  # an unaligned tensor: copied alone
            arr = arr.reshape(shape)
        if code == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)  # the high half of a float32
        elif sys.byteorder != "little" and dtype.itemsize > 1:
            arr = arr.astype(dtype.newbyteorder("="))
        out[name] = arr
    return out


def write_safetensors(tensors: dict, path, metadata: dict | None = None) -> None:
    """Write names -> arrays as one ``.safetensors`` file (float64/32/16, integers, bool),
    atomically (see :mod:`attention_ref._atomic`). Names must be distinct strings other than
    ``__metadata__``, which the format reserves."""
    if not hasattr(tensors, "items"):
        raise TypeError(f"tensors must be a dict of names -> arrays, got {type(tensors).__name__}")
    items = list(tensors.items())
    names = [name for name, _ in items]
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be strings, got {name!r}")
        if name == _RESERVED:
            raise ValueError(f"tensor name {_RESERVED!r} is reserved by the safetensors format for the metadata")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"tensor name {repeated[0]!r} appears more than once")
    header, chunks, offset = {}, [], 0
    for name, arr in items:
        arr = np.ascontiguousarray(arr)
        if arr.dtype not in _NAMES and arr.dtype.newbyteorder("<") not in _NAMES:
            raise TypeError(f"tensor {name!r} has dtype {arr.dtype}, which safetensors cannot hold here")
        key = _NAMES.get(arr.dtype) or _NAMES[arr.dtype.newbyteorder("<")]
        blob = arr.astype(np.dtype(_DTYPES[key]), copy=False).tobytes()
        header[name] = {"dtype": key, "shape": list(arr.shape), "data_offsets": [offset, offset + len(blob)]}
        chunks.append(blob)
        offset += len(blob)
    if metadata:
        header[_RESERVED] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-aligned
    write_atomic(path, struct.pack("<Q", len(text)) + text + b"".join(chunks))
