"""Blocks of independent work on parallel threads, with BLAS on one thread.

Attention is independent across its batch axes: the scores, softmax and ``P v`` of one
(batch item, head) never look at another's. A matrix product ``a @ b`` is independent
across the rows of ``a``. So inside :func:`parallel_region` the attention cuts its
``(..., Nq, Nk)`` work along one batch axis, and :func:`matmul` cuts a product into row
blocks, one block per core, each handed to a thread that runs the library's ordinary
formulas on its slices. BLAS is limited to one thread for the whole region:

* a thin product (``N x d_k`` by ``d_k x N``) gains little from BLAS's own threads, which it
  hands out and waits for at every call, and the softmax's elementwise passes, which NumPy
  runs on one core, now run on every core;
* OpenBLAS's threads keep spinning on their cores for a while after each product they ran,
  so a pool running while BLAS is multi-threaded fights them for the cores (the reason the
  first thread pool of this library was removed, docs/performance.md). With BLAS on one
  thread from the start to the end of the region, they never wake.

What this buys is measured by ``python benchmarks/bench_mha.py`` (``docs/performance.md``).
Limiting BLAS's threads needs ``threadpoolctl`` (``pip install attention_ref[fast]``), an
optional dependency: without it, when BLAS has one thread (``OPENBLAS_NUM_THREADS=1``,
``threadpoolctl.threadpool_limits(1)``) or for small problems, everything runs in the
calling thread, as the plain code reads. While a region is open, BLAS called from another
thread of the program runs on one thread too (the limit is process-wide).

Each block computes exactly what the whole-array code computes for its part; a matrix
product may round differently with another number of BLAS threads, so the tests compare the
two paths with tolerances, and run the gradient checks through this one.
"""
from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["MIN_ELEMENTS", "parallel_region", "plan_blocks", "run_blocks", "take_block", "matmul"]

#: Fewest numbers in the (..., Nq, Nk) probabilities of an attention call worth a region
#: (2**24: e.g. 8 heads from N = 1,449). Measured with ``bench_mha.py --blocks-ab 5`` (two
#: runs, docs/performance.md): 16-26% faster at B = 1, N = 2,048 (2**25) in both dtypes, but
#: at B = 4, N = 512 (2**23) and below sometimes faster, sometimes slower, within the noise
#: of a shared machine; below this the call keeps BLAS's own threads.
MIN_ELEMENTS = 1 << 24

_state = threading.local()  # .workers: threads for blocks in this thread's open region (0: none);
#                              .pool: that region's threads (started at its first blocks);
#                              .in_block: this thread is running a block
_lock = threading.Lock()
_blas = None  # threadpoolctl's controller of NumPy's BLAS, found on first use
_looked = False
_owner = None  # the thread whose region holds BLAS at one thread: one region at a time
_before = None  # during a region: (controller, BLAS's thread counts before it), for a forked child


def _after_fork_in_child() -> None:
    """A fork copies this module's state but not the other threads: a region another thread
    had open (and the lock, if it held it) would stay taken for ever in the child, and its
    BLAS at one thread. Start free, with BLAS's thread counts from before that region."""
    global _lock, _owner, _state, _before
    _lock, _owner, _state = threading.Lock(), None, threading.local()
    if _before is not None:
        blas, counts = _before
        _before = None
        try:
            for lib, n in zip(blas.lib_controllers, counts):
                lib.set_num_threads(n)
        except Exception:  # noqa: BLE001 - never let a fork fail for a thread count
            pass


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _is_numpys(lib) -> bool:
    """Whether a threadpoolctl library controller is the OpenBLAS that NumPy's wheel ships
    (in ``numpy.libs`` or inside the ``numpy`` package), not another one in the process."""
    parts = os.path.normpath(getattr(lib, "filepath", "") or "").split(os.sep)
    return any(part in ("numpy", "numpy.libs") for part in parts[:-1])


def _blas_controller():
    """threadpoolctl's controller of NumPy's BLAS, or None: without threadpoolctl, or unless
    it is the OpenBLAS of NumPy's wheels built with pthreads, whose thread limit is
    process-wide (an OpenMP build limits each thread on its own, and the blocks' threads
    would keep every BLAS thread; another library in the process is not NumPy's)."""
    global _blas, _looked
    if not _looked:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # optional dependency: without it, no regions
            blas = None
        else:
            blas = ThreadpoolController().select(internal_api="openblas")
            libraries = blas.lib_controllers  # NumPy's, alone: another OpenBLAS beside it is not limited
            if (len(libraries) != 1 or not _is_numpys(libraries[0])
                    or getattr(libraries[0], "threading_layer", None) != "pthreads"):
                blas = None
        _blas, _looked = blas, True
    return _blas


def workers() -> int:
    """Threads for blocks in the calling thread's open region (0 outside one, and inside a
    block: a block is never cut again)."""
    return 0 if getattr(_state, "in_block", False) else getattr(_state, "workers", 0)


@contextlib.contextmanager
def parallel_region(n_elements: int, batch: tuple = ()):
    """Run the body with BLAS on one thread and blocks on as many threads as BLAS had.

    ``batch``: the batch axes the attention will cut; the region opens only if one of them
    gives every thread a block (otherwise BLAS would sit on one thread with cores idle).
    Does nothing when a region is already open in this thread, inside a block, for fewer
    than ``MIN_ELEMENTS`` numbers of work, without threadpoolctl, or with one BLAS thread.
    One region at a time in the process: a large call from another thread meanwhile runs in
    one piece (on BLAS's one thread), and cuts no blocks if another thread holds BLAS's
    limit in a way that leaves it above one (threadpoolctl lets one thread control OpenBLAS;
    a ``threadpool_limits`` entered in another thread during a region records one thread as
    its "before" and restores that when it exits).
    """
    global _owner, _before
    if getattr(_state, "workers", 0) or getattr(_state, "in_block", False) or n_elements < MIN_ELEMENTS:
        yield
        return
    with _lock:
        blas = None if _owner is not None else _blas_controller()
        counts = () if blas is None else tuple(lib.num_threads for lib in blas.lib_controllers)
        threads = max(counts, default=0)
        if threads >= 2 and max(batch, default=0) >= threads:
            _owner, _before = threading.get_ident(), (blas, counts)
        else:
            threads = 0
    if threads < 2:
        yield
        return
    try:
        with blas.limit(limits=1):  # threadpoolctl's own limiter: this thread restores it at the end
            limited = all(lib.num_threads == 1 for lib in blas.lib_controllers)
            _state.workers, _state.pool = (threads if limited else 0), None
            try:
                yield
            finally:
                if _state.pool is not None:  # the threads end with the region: none idle afterwards
                    _state.pool.shutdown()
                _state.workers, _state.pool = 0, None
    finally:
        with _lock:
            _owner, _before = None, None


def plan_blocks(batch: tuple):
    """``(axis, [slice, ...])`` cutting the batch axis ``axis`` (counted from the end of
    ``batch``) into one block per worker, or None outside a region or with no axis to cut."""
    threads = workers()
    if threads < 2 or not batch:
        return None
    # the first axis long enough to give every thread a block, else the longest
    axis = next((a for a, n in enumerate(batch) if n >= threads), None)
    if axis is None:
        axis = max(range(len(batch)), key=lambda a: batch[a])
    n = batch[axis]
    if n < 2:
        return None
    return axis - len(batch), _cut(n, min(n, threads))


def _cut(n: int, parts: int) -> list:
    """``parts`` near-equal consecutive slices covering ``range(n)``."""
    bounds = [i * n // parts for i in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


def take_block(x, axis: int, block: slice):
    """The block of ``x`` (..., rows, cols) along batch axis ``axis`` (negative: counted from
    the end of the batch axes, which broadcast aligned from the right); ``x`` itself where it
    has no such axis or broadcasts along it (size 1)."""
    if x is None:
        return None
    pos = x.ndim - 2 + axis  # the batch axes come before the last two
    if pos < 0 or x.shape[pos] == 1:
        return x
    return x[(slice(None),) * pos + (block,)]


def run_blocks(fn, blocks) -> None:
    """Call ``fn(block)`` for every block: the first in the calling thread, the others on the
    open region's threads; after all have finished, re-raise the first block's exception
    (in block order)."""
    if len(blocks) > 1 and _state.pool is None:
        _state.pool = ThreadPoolExecutor(max_workers=_state.workers - 1, thread_name_prefix="attention_ref")

    errors_setting, callback = np.geterr(), np.geterrcall()  # new threads start from NumPy's defaults

    def one(block):
        inside = getattr(_state, "in_block", False)
        _state.in_block = True  # a block never opens a region or cuts blocks of its own
        try:
            with np.errstate(call=callback, **errors_setting):
                fn(block)
        finally:
            _state.in_block = inside

    futures = [_state.pool.submit(one, block) for block in blocks[1:]]
    errors = []
    try:
        one(blocks[0])
    except Exception as e:  # noqa: BLE001 - re-raised below, after the other blocks
        errors.append(e)
    errors += [f.exception() for f in futures]  # waits for every block
    for e in errors:
        if e is not None:
            raise e


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for 2-D ``a`` and ``b``; inside a region, row blocks of ``a`` on the threads
    (each row of the result is the same row-times-matrix product either way)."""
    threads = workers()
    if threads < 2 or a.shape[0] < 2 * threads:
        return a @ b  # (m, n)
    y = np.empty((a.shape[0], b.shape[1]), np.result_type(a, b))  # (m, n)
    run_blocks(lambda rows: np.matmul(a[rows], b, out=y[rows]), _cut(a.shape[0], threads))
    return y
