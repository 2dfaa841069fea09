"""The checker as a process: student code runs in a forked child (POSIX) under a time limit
per case, which ends the child's process group when the alarm does not stop it, a memory limit
(Linux) and a fresh working folder; its ``sys.exit``, ``SystemExit`` and ``KeyboardInterrupt``
become sentences, and NumPy's global settings are the caller's again afterwards.
"""
from __future__ import annotations

import codecs
import contextlib
import os
import pickle
import select
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
import warnings
from typing import NamedTuple

import numpy as np

__all__ = []  # the checker's machinery: used by checker.py, command.py and mutation.py


class _OutOfTime(BaseException):
    """Raised inside the student's code when a case's time runs out (a BaseException, so that
    an ``except Exception`` in the student's code does not swallow it)."""


@contextlib.contextmanager
def _time_limit(seconds):
    """Raise :class:`_OutOfTime` in the code run under it after ``seconds``; no limit when
    ``seconds`` is None, off the main thread, or without ``signal.setitimer`` (Windows). A
    timer the caller had set (pytest-timeout's, say) runs on afterwards."""
    if seconds is None or not hasattr(signal, "setitimer") or \
            threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise _OutOfTime

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay:
            left = max(old_delay - (time.monotonic() - started), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, old_interval)


def _stopped(who, exc, where="") -> str:
    """The sentence for student code that exited or was interrupted instead of returning."""
    if isinstance(exc, SystemExit):
        return (f"your {who} called sys.exit({exc.code!r}) (SystemExit){where}: a {who} returns its"
                " result, it never ends the program")
    return f"your {who} was interrupted (KeyboardInterrupt){where}; the check stopped there"


@contextlib.contextmanager
def _numpy_state_kept():
    """NumPy's error settings and callback, print options and global random state, as they
    were before, whatever the code run under it changes."""
    err, call, printing = np.geterr(), np.geterrcall(), np.get_printoptions()
    random_state = np.random.get_state()
    try:
        yield
    finally:
        np.seterr(**err)
        np.seterrcall(call)
        np.set_printoptions(**printing)
        np.random.set_state(random_state)


def _check_arguments(seed, time_limit):
    """One-line errors for a seed or a time limit that cannot be used."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"check: seed must be a whole number >= 0, got {seed!r}")
    if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(time_limit, (int, float))
                                   or not time_limit > 0 or time_limit == float("inf")):
        raise ValueError(f"check: time_limit must be a number of seconds > 0 (or None), got {time_limit!r}")


# -- the student's code in a child process ---------------------------------------------------------

#: MiB the student's code may add to the child's address space (Linux), by default: NumPy's own
#: start-up is already in the parent when it forks, so this is what the student's arrays may take
MEMORY_LIMIT = 4096
_GRACE = 1.0  # seconds past the time limit before a child that ignores the alarm is ended
_PROGRESS = None  # in the child: sends ("run", label, seconds) and ("idle",) to the parent


def _can_fork() -> bool:
    """Whether the student's code can run in a forked child (POSIX)."""
    return hasattr(os, "fork") and hasattr(os, "killpg")


def _tell(*event):
    if _PROGRESS is not None:
        _PROGRESS(event)


@contextlib.contextmanager
def _student_code(seconds, label):
    """The time limit around one call of the student's code; in a child, the parent is told
    what runs, so it can end the child when the alarm does not stop it."""
    _tell("run", label, seconds)
    try:
        with _time_limit(seconds):
            yield
    finally:
        _tell("idle")


class ChildEnded(NamedTuple):
    """How a child ended without a result: ``why`` ("time" or "ended"), the label of the
    student's code that was running (or ran last), and a description of the ending."""

    why: str
    label: object
    how: str
    notes: dict


def _check_memory_limit(memory_limit):
    if memory_limit is not None and (isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, float))
                                     or not 0 < memory_limit < float("inf")):
        raise ValueError(f"check: memory_limit must be a number of MiB > 0 (or None), got {memory_limit!r}")


def _address_space() -> int:
    """This process's address space in bytes (Linux), or 0 when it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _limit_memory(memory_limit):
    """Let the address space grow by at most ``memory_limit`` MiB (Linux; elsewhere no limit)."""
    if memory_limit is None or not sys.platform.startswith("linux"):
        return
    import resource

    now = _address_space()
    if not now:
        return
    soft = now + int(memory_limit * 2**20)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _send(fd, obj):
    blob = pickle.dumps(obj)
    data = struct.pack("<Q", len(blob)) + blob
    while data:
        data = data[os.write(fd, data):]


def _child(work, events, out, err, folder, memory_limit):
    """The child's life: its own process group, a fresh folder, its output to the parent,
    ``work()`` under the memory limit; then it ends at once (threads and atexit handlers it
    started never keep it alive)."""
    global _PROGRESS
    status = 0
    try:
        os.setpgid(0, 0)
        os.chdir(folder)
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stdin = open(os.devnull)
        _PROGRESS = lambda event: _send(events, ("event", event))  # noqa: E731
        _limit_memory(memory_limit)
        try:
            value = ("return", work())
        except BaseException as exc:  # noqa: BLE001  (carried to the parent, raised there)
            value = ("raise", exc)
        _PROGRESS = None
        with contextlib.suppress(Exception):  # what was printed reaches the parent before the result
            sys.stdout.flush()
            sys.stderr.flush()
        try:
            _send(events, value)
        except Exception:  # noqa: BLE001  (an exception that does not pickle: its text)
            exc = value[1] if value[0] == "raise" else TypeError("the result cannot be sent back")
            _send(events, ("raise", RuntimeError(f"{type(exc).__name__}: {exc}")))
    except BaseException:  # noqa: BLE001  (nothing of the child may reach the parent's code)
        status = 70
    finally:
        os._exit(status)


def _echo(decoder, data, stream):
    text = decoder.decode(data)
    if text:
        stream.write(text)
        stream.flush()


def _kill_group(pid):
    """End the child and everything it started in its process group, and reap the child."""
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        with contextlib.suppress(OSError):
            target()
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _ending(status) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"it was ended by {name}" + (" (out of memory?)" if number == signal.SIGKILL else "")
    return f"it exited with status {os.WEXITSTATUS(status)} (os._exit?)"


def _in_child(work, memory_limit=MEMORY_LIMIT):
    """``work()`` in a forked child, whose student code (run under :func:`_student_code`) the
    parent ends, with its whole process group, when it runs past its time limit.

    Returns ``work()``'s value, raises what it raised, or returns :class:`ChildEnded` when the
    child ran out of time or ended without a result. The child works in a fresh temporary folder
    (removed afterwards), under the memory limit, and what it prints is printed here. Nothing of
    this process changes: its signal handlers, NumPy's settings and its folder stay as they were,
    and a Ctrl-C here ends the child too."""
    folder = tempfile.mkdtemp(prefix="attention_ref_check_")
    pipes = [os.pipe() for _ in range(3)]  # events, stdout, stderr
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():  # Python 3.12+: NumPy's BLAS threads make fork() warn
        warnings.filterwarnings("ignore", message=r".*multi-threaded.*fork", category=DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        for r, _ in pipes:
            os.close(r)
        _child(work, *(w for _, w in pipes), folder, memory_limit)
    try:
        return _watch(pid, [r for r, _ in pipes], [w for _, w in pipes])
    finally:
        _kill_group(pid)
        for r, _ in pipes:
            with contextlib.suppress(OSError):
                os.close(r)
        shutil.rmtree(folder, ignore_errors=True)


def _watch(pid, reads, writes):
    """Read the child's events and output until it returns a result, ends, or runs out of time."""
    for w in writes:
        os.close(w)
    events, out, err = reads
    decoders = {out: codecs.getincrementaldecoder("utf-8")("replace"),
                err: codecs.getincrementaldecoder("utf-8")("replace")}
    streams = {out: lambda: sys.stdout, err: lambda: sys.stderr}
    buffer, label, deadline, limit, notes = b"", "code", None, None, {}
    open_fds = set(reads)
    result, status, ended_at = None, None, None
    while result is None:
        timeout = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
        ready = select.select(list(open_fds), [], [], timeout)[0] if open_fds else time.sleep(timeout) or []
        for fd in ready:
            data = os.read(fd, 1 << 16)
            if not data:
                open_fds.discard(fd)
            elif fd == events:
                buffer += data
            else:
                _echo(decoders[fd], data, streams[fd]())
        while len(buffer) >= 8 and len(buffer) >= 8 + struct.unpack("<Q", buffer[:8])[0]:
            size = struct.unpack("<Q", buffer[:8])[0]
            kind, value = pickle.loads(buffer[8:8 + size])
            buffer = buffer[8 + size:]
            if kind != "event":
                result = (kind, value)
                break
            if value[0] == "note":
                notes[value[1]] = value[2]
            elif value[0] == "run":
                label, limit = value[1], value[2]
                deadline = None if limit is None else time.monotonic() + limit + _GRACE
            else:
                deadline = None
        if result is not None:
            break
        if deadline is not None and time.monotonic() > deadline:
            return ChildEnded("time", label, f"it took more than {limit:g} s and did not stop when told", notes)
        if status is None:
            done, status = os.waitpid(pid, os.WNOHANG)
            status, ended_at = (status, time.monotonic()) if done else (None, None)
        # ended without a result: what it sent is read first (a process it started may hold the
        # pipe open, so half a second at most)
        if status is not None and (events not in open_fds or time.monotonic() - ended_at > 0.5):
            return ChildEnded("ended", label, _ending(status), notes)
    for fd in (out, err):  # what the child printed before it returned
        while fd in open_fds and select.select([fd], [], [], 0.05)[0]:
            data = os.read(fd, 1 << 16)
            if not data:
                break
            _echo(decoders[fd], data, streams[fd]())
    kind, value = result
    if kind == "raise":
        raise value
    return value
