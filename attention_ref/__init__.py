"""attention_ref: multi-head attention in plain NumPy, one formula at a time.

Every step is a pure pair ``*_forward(...) -> (out, cache)`` and
``*_backward(dout, cache) -> gradients`` with a hand-derived backward, and
:func:`gradcheck` checks any such pair against finite differences.

Conventions (the same in every module):

* row vectors, as in the documents: ``Q = X W^Q``, ``W`` of shape ``(d_in, d_out)``;
* shapes ``(..., n, d)`` with any number of leading batch axes;
* boolean masks: ``True`` = "may attend" (see :mod:`attention_ref.core.masks`);
* float64 by default, float32 stays float32, integers are computed in float64.

The folders are the layers, and imports flow down only: ``core`` (the layer of the
documents, the reference) <- ``fast`` (the same pairs with speed tricks, checked against
core) <- ``variants`` <- ``nn`` (layer classes, blocks, optimisers) <- ``models`` (GPT-2 and Llama whole, generation)
<- ``documents``
(claims, experiments, walkthrough) and ``plot``. ``docs/reading_guide.md`` says what to read
first. Every name below is importable from ``attention_ref`` directly.
"""

# the checker: any hand-written (forward, backward) pair against finite differences
from .gradcheck import GradcheckError, GradcheckReport, gradcheck, numerical_gradient

# core: linear, softmax, masks, scaled dot-product attention, split/merge heads, multi-head
# attention (parallel form, grouped-query, head masks) and the separate-heads strategy
from .core import *  # noqa: F401,F403  (the names: attention_ref/core/__init__.py)

# the public pairs of linear and attention validate once, then run the fast path for large
# inputs and the reference (core) otherwise; reference_only() switches everything to the
# reference (attention_ref/fast/dispatch.py)
from .fast.dispatch import (  # noqa: F811
    linear_backward,
    linear_forward,
    reference_only,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_forward,
)

# variants: blockwise (flash) attention, local windows, linear attention, RoPE, the KV cache,
# and multi-head attention with grouped-query heads and a head mask: the public
# multi_head_attention_forward/backward (the plain layer, core's, when neither is asked for)
from .variants import *  # noqa: F401,F403

# nn: the MultiHeadAttention class, layer norm, feed-forward, Add & Norm, encoder and
# decoder blocks, SGD and Adam
from .nn import *  # noqa: F401,F403

# models: GPT-2 and Llama as whole language models (ids -> logits -> loss and back), generation
from .models import *  # noqa: F401,F403

# deprecated: the library runs no threads of its own; these change nothing
from ._moved import get_num_threads, set_num_threads

# the flat module paths of 0.1 (attention_ref.masks, ...) still import, with a DeprecationWarning
from . import _moved, core, fast, models, nn, variants

_moved.install()
__getattr__ = _moved.module_getattr  # attention_ref.masks as an attribute, with the same warning

__version__ = "0.2.0"

__all__ = list(dict.fromkeys(["GradcheckError", "GradcheckReport", "gradcheck", "numerical_gradient"]
           + core.__all__ + ["reference_only"] + variants.__all__ + nn.__all__ + models.__all__
           + ["get_num_threads", "set_num_threads"]))
