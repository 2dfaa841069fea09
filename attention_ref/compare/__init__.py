"""Does your implementation match? ``compare`` checks a user's own code against the reference.

:func:`operation` runs the user's softmax, attention, causal mask, RoPE, norms or activations on
cases drawn from the operation's whole input contract and returns a :class:`Comparison`: it
matches, or it does not, and then either the mistake is named from the catalogue
(:data:`MISTAKES`, ``docs/compare.md``; only when a mistaken variant of the reference reproduces
the user's outputs on every case) or the difference is located (the step, the inputs that show
it, its size). NumPy only; torch tensors are accepted when torch is installed.

:func:`module` and :func:`model` compare a user's torch attention layer, MLP, decoder layer or
whole model (needs torch): the first module that differs (by transformers' names) and the
layer- and model-level mistake named by a mistaken variant of the reference (:mod:`.layers`).

This folder stands apart, like ``interop/``: it imports from every layer below, and nothing in the
package imports it.
"""
from .catalogue import MISTAKES, OPERATION_MISTAKES, Mistake
from .judge import PRECISION_FACTOR, R_LIMIT, operation
from .levels import MODULE_RTOL, model, module
from .operations import OPERATIONS
from .verdict import Comparison

__all__ = ["operation", "module", "model", "MODULE_RTOL", "Comparison", "Mistake", "MISTAKES", "OPERATION_MISTAKES",
           "OPERATIONS", "R_LIMIT", "PRECISION_FACTOR"]
