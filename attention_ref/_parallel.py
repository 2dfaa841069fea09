"""Row blocks and a small thread pool for the elementwise (..., Nq, Nk) work.

Why this module exists. The matrix products of attention run in BLAS, which already uses
every core. The elementwise work on the (..., Nq, Nk) scores - the softmax's max,
subtract, ``exp``, sum and divide, and the backward's ``dS = P * (dP - D)`` - runs in
NumPy's own loops, on ONE core, and each of those passes streams the whole score array
through memory. At Nq = Nk = 2048 that was a quarter to a third of the forward+backward
time.

Two plain ideas, neither of which changes a single number:

* every one of those operations works row by row (a row = one query's scores over all
  keys), so the rows can be processed in blocks of about ``BLOCK_ELEMENTS`` numbers that
  stay in the CPU cache while all five softmax passes run over them;
* NumPy releases the GIL inside its loops, so two threads working on two different
  blocks really do run on two cores.

Each row is computed by exactly the same NumPy calls whichever block or thread it lands
in, so the results are bit-for-bit those of the unblocked code (``tests/test_thread_pool.py``
and the fast-path tests in ``tests/core/`` check this with the pool on and off).

The switch: ``set_num_threads(1)`` (or the environment variable
``ATTENTION_REF_NUM_THREADS=1`` before import) turns the pool off; the default is the
number of cores, at most 8. Arrays smaller than ``PARALLEL_MIN_ELEMENTS`` are always done
in the calling thread, in one piece, so small (test-sized) problems pay no overhead.
"""
from __future__ import annotations

import operator
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

__all__ = ["get_num_threads", "set_num_threads", "num_threads", "for_each_row_block"]

#: Numbers per row block: 2**18 = 1 MiB in float32, 2 MiB in float64, so two threads'
#: blocks stay in a shared L3 cache through all five softmax passes, while the ~25 us of
#: Python per block (measured) stays a few percent of the ~1 ms of work in it.
BLOCK_ELEMENTS = 1 << 18
#: Below this many numbers the work is done in one piece in the calling thread.
PARALLEL_MIN_ELEMENTS = 1 << 18


def _default_threads() -> int:
    """ATTENTION_REF_NUM_THREADS if set, else the number of cores (at most 8)."""
    env = os.environ.get("ATTENTION_REF_NUM_THREADS")
    if env:
        if not env.strip().isdecimal() or not env.strip().isascii() or int(env) < 1:
            raise ValueError(f"ATTENTION_REF_NUM_THREADS must be a positive integer, got {env!r}")
        return int(env)
    return max(1, min(8, os.cpu_count() or 1))


_lock = threading.Lock()
_threads = _default_threads()
_pool: ThreadPoolExecutor | None = None


def get_num_threads() -> int:
    """How many threads the elementwise (..., Nq, Nk) work may use (1 = pool off)."""
    return _threads


def set_num_threads(n: int) -> None:
    """Set the number of threads for the elementwise work; 1 turns the pool off.

    The setting is process-wide (like BLAS's thread count): set it once, not from several
    threads at a time.
    """
    global _threads, _pool
    if isinstance(n, (bool, np.bool_)):
        raise TypeError(f"n must be a positive integer, got {type(n).__name__} {n!r}")
    try:
        n = operator.index(n)  # int or NumPy integer
    except TypeError:
        raise TypeError(f"n must be a positive integer, got {type(n).__name__} {n!r}") from None
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    with _lock:
        if n != _threads and _pool is not None:
            _pool.shutdown(wait=True)
            _pool = None
        _threads = n


@contextmanager
def num_threads(n: int):
    """``with num_threads(1): ...`` runs the block with the pool off, then restores it.

    Process-wide, like :func:`set_num_threads`: do not nest it across threads.
    """
    old = get_num_threads()
    set_num_threads(n)
    try:
        yield
    finally:
        set_num_threads(old)


def _get_pool() -> ThreadPoolExecutor:
    """The module's pool, created on first use (call with ``_lock`` held)."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_threads, thread_name_prefix="attention_ref")
    return _pool


def _forget_pool_after_fork() -> None:
    """A forked child inherits the pool object but not its threads: start afresh."""
    global _pool, _lock
    _pool = None
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def for_each_row_block(fn, n_rows: int, n_cols: int) -> None:
    """Call ``fn(start, stop)`` on row blocks ``[start, stop)`` covering ``range(n_rows)``.

    ``fn`` must touch only its own rows (then the blocks are independent and the order
    in which they run cannot matter). Big arrays go to the thread pool, small ones run
    in the calling thread in one piece.
    """
    total = n_rows * n_cols
    if total <= PARALLEL_MIN_ELEMENTS or n_rows < 2:
        fn(0, n_rows)
        return
    rows = max(1, BLOCK_ELEMENTS // max(1, n_cols))  # rows per block
    blocks = [(start, min(start + rows, n_rows)) for start in range(0, n_rows, rows)]
    if _threads == 1:
        for start, stop in blocks:  # a loop over cache-sized BLOCKS, not over positions
            fn(start, stop)
        return
    errstate = np.geterr()  # np.errstate is per thread: carry the caller's into the workers

    def run(block):
        with np.errstate(**errstate):
            fn(*block)

    with _lock:  # submit under the lock, so set_num_threads cannot shut the pool meanwhile
        futures = [_get_pool().submit(run, block) for block in blocks]
    for future in futures:  # wait for every block; re-raise the first exception
        future.result()
