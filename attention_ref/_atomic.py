"""Atomic writes: a file is either its old self or its new self, never half of one.

Every writer of the package (committed docs and tables, figures, the book, ``write_safetensors``)
writes into a temporary file in the target's own folder, flushes and fsyncs it, and renames it
over the target with :func:`os.replace` (atomic on POSIX and Windows within one file system).
A writer killed at any moment, or stopped by a full disk, leaves the old file as it was and at
most a stray ``.NAME.*.tmp`` beside it (NAME shortened to fit the file system's longest name);
an exception removes the temporary file. A target that is a folder is refused before anything
is written (IsADirectoryError).

``write_atomic(path, data)`` writes bytes or text; ``atomic_path(path)`` is a context manager
that yields the temporary path for writers that want a file name (``fig.savefig``,
``np.savez``): it keeps the target's suffix, so format detection works.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["atomic_path", "write_atomic"]


def _new_file_mode(target: Path) -> int:
    """The permission bits the target has, or those a plain ``open(..., "w")`` would give it."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _name_max(folder: Path) -> int:
    """The longest file name the folder's file system takes, in bytes (255 where it cannot be asked)."""
    try:
        return int(os.pathconf(folder if str(folder) else ".", "PC_NAME_MAX"))
    except (AttributeError, OSError, ValueError):
        return 255


def _temporary_affixes(target: Path) -> tuple:
    """``(".NAME.", ".tmp.SUFFIX")`` for :func:`tempfile.mkstemp`, the name shortened so that the
    temporary's name (8 random characters between them) fits the file system: a target whose
    name is 230-255 bytes long still gets a temporary beside it. The suffix is kept (format
    detection) unless the name is too long for it as well. A target name longer than the file
    system allows is refused by the file system itself when it is renamed into place, naming
    it (ENAMETOOLONG)."""
    room = _name_max(target.parent) - 8  # mkstemp's random part
    suffix = f".tmp{target.suffix}"
    if len(os.fsencode(suffix)) + 2 > room:
        suffix = ".tmp"
    name = os.fsencode(target.name)[:max(room - len(os.fsencode(suffix)) - 2, 1)]
    return "." + os.fsdecode(name.decode("utf-8", "ignore").encode()) + ".", suffix


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path``; when the block ends normally, fsync it and rename it
    over ``path``; when it raises, remove it and leave ``path`` untouched."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(target))
    prefix, suffix = _temporary_affixes(target)
    fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=suffix)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, _new_file_mode(target))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_folder(folder)


def write_atomic(path, data, encoding: str = "utf-8") -> Path:
    """Write ``data`` (bytes, or text encoded with ``encoding``) to ``path`` atomically; returns the path."""
    blob = data.encode(encoding) if isinstance(data, str) else bytes(data)
    target = Path(path)
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
    return target
