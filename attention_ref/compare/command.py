"""``python -m attention_ref compare FOLDER FILE.py:FUNCTION``: a user's whole model, loaded by the
user's own ``FUNCTION(folder)``, against the reference (:func:`attention_ref.compare.model`).

Exit codes: 0 it matches; 1 it does not (the verdict printed); 2 bad input, or the user's loader or
model raised (the user's line and the error shown, no traceback of ours), or the time limit ended
it. The user's code runs in this process, under a signal alarm after ``--time-limit`` seconds
(:data:`TIME_LIMIT` by default); code that ignores the alarm is ended :data:`GRACE` seconds later.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys
import threading
from pathlib import Path

__all__ = ["main", "TIME_LIMIT", "GRACE"]

#: seconds the user's loader and model may take together (``--time-limit``)
TIME_LIMIT = 300.0
#: seconds after the alarm before a process that ignored it is ended
GRACE = 10.0
_PROG = "python -m attention_ref compare"


class _OutOfTime(BaseException):
    """Raised by the alarm (a BaseException: the user's ``except Exception`` does not swallow it)."""


class _BadInput(Exception):
    pass


def _parser():
    p = argparse.ArgumentParser(prog=_PROG, description="Does your whole model match transformers'? FUNCTION(FOLDER)"
                                " returns your loaded model; it is called on token ids (and a left-padded batch"
                                " with its attention_mask) and every submodule's output is compared with the"
                                " reference at transformers' module names.")
    p.add_argument("folder", help="a save_pretrained folder (config.json and the weights)")
    p.add_argument("function", help="FILE.py:FUNCTION or package.module:FUNCTION, returning the loaded model")
    p.add_argument("--time-limit", type=float, default=TIME_LIMIT, metavar="SECONDS",
                   help=f"seconds your loader and model may take together (default {TIME_LIMIT:g})")
    return p


def _load_function(spec: str):
    """The user's ``FUNCTION`` from ``FILE.py:FUNCTION`` or ``package.module:FUNCTION``."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise _BadInput(f"function must be FILE.py:FUNCTION or package.module:FUNCTION, got {spec!r}")
    if where.endswith(".py"):
        path = Path(where).resolve()
        if not path.is_file():
            raise _BadInput(f"{where}: no such file")
        sys.path.insert(0, str(path.parent))  # the user's file may import its neighbours
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module
        module_spec.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        module = importlib.import_module(where)
    fn = getattr(module, name, None)
    if fn is None:
        raise _BadInput(f"{where} has no {name!r}")
    if not callable(fn):
        raise _BadInput(f"{where}:{name} is not callable")
    return fn


def _user_error(error) -> str:
    from .judge import _user_line

    return f"{_user_line(error)}\n  {type(error).__name__}: {error}"


def _alarm(seconds):
    """Raise :class:`_OutOfTime` in this thread after ``seconds`` (where there is a signal alarm),
    and end the process ``GRACE`` seconds later if the code ignored it. Returns the cancel function."""
    def ring(signum, frame):
        raise _OutOfTime()

    previous = None
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, seconds)

    def end():
        print(f"{_PROG}: the time limit ({seconds:g} s) ended it (the alarm was ignored)", file=sys.stderr,
              flush=True)
        os._exit(2)
    watchdog = threading.Timer(seconds + GRACE, end)
    watchdog.daemon = True
    watchdog.start()

    def cancel():
        watchdog.cancel()
        if previous is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return cancel


def main(argv=None) -> int:
    """Run the command; returns the exit code (0 match, 1 differs, 2 bad input or the user's code raised)."""
    args = _parser().parse_args(argv)
    folder = Path(args.folder)
    if not (folder / "config.json").is_file():
        print(f"{_PROG}: {folder}: not a save_pretrained folder (no config.json)", file=sys.stderr)
        return 2
    if not args.time_limit > 0:
        print(f"{_PROG}: --time-limit must be a positive number of seconds, got {args.time_limit}", file=sys.stderr)
        return 2
    try:
        from . import levels
        levels._torch()
    except ImportError as error:
        print(f"{_PROG}: {error}", file=sys.stderr)
        return 2
    cancel = _alarm(args.time_limit)
    try:
        try:
            fn = _load_function(args.function)
        except _BadInput as error:
            print(f"{_PROG}: {error}", file=sys.stderr)
            return 2
        except Exception as error:  # the user's file raised on import
            print(f"{_PROG}: importing {args.function} raised:\n{_user_error(error)}", file=sys.stderr)
            return 2
        try:
            model = fn(str(folder))
        except Exception as error:  # the user's loader: any exception is a verdict
            print(f"{_PROG}: the loader {args.function} raised:\n{_user_error(error)}", file=sys.stderr)
            return 2
        try:
            verdict = levels.model(model, folder)
        except (TypeError, ValueError, OSError) as error:  # bad input: the folder, the model's output
            print(f"{_PROG}: {error}", file=sys.stderr)
            return 2
    except _OutOfTime:
        print(f"{_PROG}: the time limit ({args.time_limit:g} s) ended it", file=sys.stderr)
        return 2
    finally:
        cancel()
    print(verdict)
    if verdict.where == "the call raised":
        return 2
    return 0 if verdict.ok else 1
