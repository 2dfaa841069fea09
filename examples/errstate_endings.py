"""Can one decorator or context manager replace the ``signals_land_here()`` line that ends each
``np.errstate`` block? An experiment (issue 37 item 4); it prints a table and writes nothing.

A Ctrl-C that arrives while NumPy computes is only raised at the next point where CPython's
evaluation loop looks for pending signals (a Python-level call, a loop's jump back). If that
point is the ``__exit__`` of the context manager that should restore NumPy's error settings, the
KeyboardInterrupt is raised there, before it restores them, and the user's ``np.seterr`` stays
changed. Each form below runs a formula (a few ``exp`` and products over a 256 x 4096 array)
while a SIGALRM timer, whose handler raises KeyboardInterrupt as Ctrl-C does, fires at a random
moment; after each interrupted call we compare ``np.geterr()`` with the user's settings:

* ``bare``: ``with np.errstate(...)`` whose last line is arithmetic (the mistake the rule
  forbids);
* ``landing line``: the same block ending on ``signals_land_here()`` (today's rule);
* ``context manager``: ``with quiet(...)``, a context manager of ours (class with
  ``__enter__``/``__exit__`` that save and restore ``np.seterr``), no landing line;
* ``decorator``: ``@quiet_formula(...)`` on the formula; its wrapper opens ``np.errstate``,
  calls the formula and ends the block on ``signals_land_here()``.

Run: ``python examples/errstate_endings.py [rounds]`` (default 400 per form; POSIX only).
"""
from __future__ import annotations

import functools
import random
import signal
import sys
import time
import traceback

import numpy as np

from attention_ref._checks import signals_land_here

X = np.random.default_rng(0).standard_normal((256, 4096))


def bare(x):
    with np.errstate(under="ignore", over="ignore"):
        e = np.exp(-0.5 * x * x)
        y = e * x + np.exp(x) * e
    return y


def landing_line(x):
    with np.errstate(under="ignore", over="ignore"):
        e = np.exp(-0.5 * x * x)
        y = e * x + np.exp(x) * e
        signals_land_here()
    return y


class quiet:
    """A context manager of ours: np.seterr on entry, the old settings back on exit."""

    def __init__(self, **settings):
        self.settings = settings

    def __enter__(self):
        self.old = np.seterr(**self.settings)

    def __exit__(self, *exc):
        np.seterr(**self.old)


def context_manager(x):
    with quiet(under="ignore", over="ignore"):
        e = np.exp(-0.5 * x * x)
        y = e * x + np.exp(x) * e
    return y


def quiet_formula(**settings):
    """The decorator: the whole formula under np.errstate, the block ended on a Python call."""
    def decorate(formula):
        @functools.wraps(formula)
        def wrapper(*args, **kwargs):
            with np.errstate(**settings):
                result = formula(*args, **kwargs)
                signals_land_here()
            return result
        return wrapper
    return decorate


@quiet_formula(under="ignore", over="ignore")
def decorator(x):
    e = np.exp(-0.5 * x * x)
    return e * x + np.exp(x) * e


FORMS = {"bare": bare, "landing line": landing_line, "context manager": context_manager, "decorator": decorator}
LANDED = []


def _interrupt(signum, frame):
    LANDED[:] = [f"{f.name}:{f.lineno}" for f in traceback.extract_stack(frame)[-2:]]
    raise KeyboardInterrupt


def measure(form, rounds: int, rand: random.Random) -> dict:
    np.seterr(all="raise")  # the user's settings
    user = np.geterr()
    start = time.perf_counter()
    form(X)
    call_s = time.perf_counter() - start
    interrupted, changed, where = 0, 0, {}
    for _ in range(rounds):
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, rand.uniform(1e-5, call_s))
                form(X)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except KeyboardInterrupt:
            interrupted += 1
            if np.geterr() != user:
                changed += 1
                where[LANDED[-1]] = where.get(LANDED[-1], 0) + 1
        np.seterr(**user)
    np.seterr(**{k: "warn" if k != "under" else "ignore" for k in user})
    return {"interrupted": interrupted, "changed": changed, "where": where}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rounds = int(argv[0]) if argv else 400
    if not hasattr(signal, "setitimer"):
        print("needs signal.setitimer (POSIX)")
        return 1
    signal.signal(signal.SIGALRM, _interrupt)
    saved = np.geterr()
    print(f"Python {sys.version.split()[0]}, NumPy {np.__version__}, {rounds} timed interrupts per form")
    print("| form | interrupted | seterr left changed | where the KeyboardInterrupt was raised then |")
    print("| --- | --- | --- | --- |")
    try:
        for name, form in FORMS.items():
            r = measure(form, rounds, random.Random(1))
            print(f"| {name} | {r['interrupted']} | {r['changed']} | {r['where'] or '-'} |")
    finally:
        np.seterr(**saved)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
