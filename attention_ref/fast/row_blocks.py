"""Cache-sized blocks of rows for the elementwise (..., Nq, Nk) work.

The matrix products of attention run in BLAS. The elementwise work on the (..., Nq, Nk)
scores - the softmax's max, subtract, ``exp``, sum and divide, and the backward's
``dS = P * (dP - D)`` - runs in NumPy's own loops, and each of those passes streams the
whole score array through memory. Every one of those operations works row by row (a row =
one query's scores over all keys), so the rows can be processed in blocks of about
``BLOCK_ELEMENTS`` numbers that stay in the CPU cache while all the passes run over them.
Each row is computed by exactly the same NumPy calls whichever block it lands in, so the
results are bit-for-bit those of the unblocked code (``tests/fast/`` checks this).

Part of the fast path (:mod:`attention_ref.fast`); the reference in ``core/`` has no blocks.
"""
from __future__ import annotations

__all__ = ["for_each_row_block", "rows_per_block", "BLOCK_ELEMENTS"]

#: Numbers per row block: 2**18 = 1 MiB in float32, 2 MiB in float64, inside the L2/L3
#: cache through all five softmax passes, while the ~25 us of Python per block (measured)
#: stays a few percent of the ~1 ms of work in it.
BLOCK_ELEMENTS = 1 << 18


def for_each_row_block(fn, n_rows: int, n_cols: int, block: int | None = None) -> None:
    """Call ``fn(start, stop)`` on row blocks ``[start, stop)`` covering ``range(n_rows)``, in order.

    ``fn`` must touch only its own rows. Arrays of at most ``block`` numbers (default
    ``BLOCK_ELEMENTS``) are done in one piece.
    """
    rows = rows_per_block(n_rows, n_cols, block)
    for start in range(0, n_rows, rows):  # a loop over cache-sized BLOCKS, not over positions
        fn(start, min(start + rows, n_rows))
    if n_rows == 0:
        fn(0, 0)  # an empty array is one (empty) piece too


def rows_per_block(n_rows: int, n_cols: int, block: int | None = None) -> int:
    """Rows in each block of :func:`for_each_row_block` (the last one may have fewer): all
    ``n_rows`` when the ``n_rows * n_cols`` numbers fit in one ``block``, else as many rows
    of ``n_cols`` as about ``block`` numbers hold (at least one)."""
    block = BLOCK_ELEMENTS if block is None else block
    if n_rows * n_cols <= block:
        return max(1, n_rows)
    return max(1, block // n_cols)
