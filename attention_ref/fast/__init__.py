"""The fast path: the reference's pairs (``core/``) with the speed tricks, checked against them.

Optional reading, like CS231n's ``fast_layers.py`` beside its ``layers.py``: every public
function here is its reference's name with ``_fast`` appended (``linear_forward_fast``, as
CS231n's ``conv_forward_fast``), with the signature and the cache of its reference, and ``tests/fast/`` checks each one
against it (bit for bit where the arithmetic is the same, else within a stated bound).
What each trick buys is measured in ``docs/performance.md``:

* ``row_blocks``: the elementwise ``(..., Nq, Nk)`` passes over cache-sized blocks of rows;
* ``softmax``: the softmax and ``dS = P * (dP - D)`` in place, over those blocks;
* ``attention``: the scale folded into ``q``, overflow ruled out by a bound, the mask written
  into the fresh scores, and the backward over blocks of query rows in one reused buffer;
* ``linear``: each projection as one tall BLAS product;
* ``multi_head``: the six steps of the reference with the fast pairs;
* ``dispatch``: the public functions of the package: validate once, then this path from
  ``FAST_MIN_ELEMENTS`` numbers and the reference below; ``reference_only()`` switches to
  the reference everywhere.

``fast/`` imports ``core/``; ``core/`` never imports ``fast/`` (``tests/test_layout.py``).
"""
from .linear import linear_backward_fast, linear_forward_fast
from .attention import scaled_dot_product_attention_backward_fast, scaled_dot_product_attention_forward_fast
from .multi_head import multi_head_attention_backward_fast, multi_head_attention_forward_fast
from .dispatch import FAST_MIN_ELEMENTS, reference_only, uses_fast_path

__all__ = [
    "linear_backward_fast", "linear_forward_fast",
    "scaled_dot_product_attention_backward_fast", "scaled_dot_product_attention_forward_fast",
    "multi_head_attention_backward_fast", "multi_head_attention_forward_fast",
    "FAST_MIN_ELEMENTS", "reference_only", "uses_fast_path",
]
