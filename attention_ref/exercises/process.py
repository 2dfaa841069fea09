"""The checker as a process: student code runs under a time limit per case, its
``sys.exit``, ``SystemExit`` and ``KeyboardInterrupt`` become sentences, and NumPy's global
settings are the caller's again afterwards.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time

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
