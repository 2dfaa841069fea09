"""Deprecated import paths: modules that moved when the package was split into layers.

``import attention_ref.masks`` and ``attention_ref.masks`` as an attribute (the flat layout
of 0.1) still work for one release: they warn with a ``DeprecationWarning`` naming the new
path and give the moved module itself, so its functions and classes are the same objects.
Remove in 0.3.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import operator
import sys
import warnings

import numpy as np

#: old module name (under attention_ref) -> new dotted path (under attention_ref)
MOVED = {
    "linear": "core.linear", "softmax": "core.softmax", "masks": "core.masks",
    "attention": "core.attention", "heads": "core.heads", "multi_head": "core.multi_head",
    "separate_heads": "core.separate_heads",
    "flash": "variants.blockwise", "local": "variants.local",
    "linear_attention": "variants.linear_attention", "rope": "variants.rope",
    "layer": "nn.multi_head_attention", "layer_norm": "nn.layer_norm", "feed_forward": "nn.feed_forward",
    "blocks": "nn.residual", "encoder_block": "nn.encoder_block", "decoder_block": "nn.decoder_block",
    "optim": "nn.optim",
    "worked_examples": "documents.worked_examples", "walkthrough": "documents.walkthrough",
    "toy_task": "documents.toy_task", "experiments": "documents.experiments",
    "experiments_more": "documents.experiments", "claims": "documents.claims",
    "claims_design": "documents.claims.parameters_and_cost",
    "claims_examples": "documents.claims.worked_examples",
    "claims_more": "documents.claims.paths_and_variants",
    "plot_training": "plot.training",
}
_PACKAGE = __name__.rpartition(".")[0]  # "attention_ref"


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``attention_ref.<old>`` and answers with the module at its new path."""

    def __init__(self):
        self._specs = {}  # new module name -> its own spec

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if _new_name(fullname) else None

    def create_module(self, spec):
        new = _new_name(spec.name)
        warnings.warn(f"{spec.name} moved to {new}; the old path will be removed in 0.3",
                      DeprecationWarning, stacklevel=2)  # warnings skips importlib's frames
        module = importlib.import_module(new)
        self._specs.setdefault(new, module.__spec__)
        return module

    def exec_module(self, module):
        """Nothing to run: the moved module is executed already. The import system has just
        set ``module.__spec__`` to the old name's spec; give the module its own back."""
        module.__spec__ = self._specs[module.__name__]


def _new_name(fullname: str) -> str | None:
    """``attention_ref.masks`` -> ``attention_ref.core.masks``, and a submodule of a moved
    package (``attention_ref.claims.claim``) -> its new path; None for every other name."""
    parts = fullname.split(".")
    if len(parts) < 2 or parts[0] != _PACKAGE or parts[1] not in MOVED:
        return None
    return ".".join([_PACKAGE, MOVED[parts[1]], *parts[2:]])


def module_getattr(name: str):
    """The package's ``__getattr__``: ``attention_ref.masks`` as an attribute (0.1 had it)."""
    if name not in MOVED:
        raise AttributeError(f"module {_PACKAGE!r} has no attribute {name!r}")
    warnings.warn(f"{_PACKAGE}.{name} moved to {_PACKAGE}.{MOVED[name]}; the old path will be removed"
                  " in 0.3", DeprecationWarning, stacklevel=2)
    return importlib.import_module(f"{_PACKAGE}.{MOVED[name]}")


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once: first, so that a submodule of a moved
    package is answered by it before the path finder would load that file a second time."""
    if not any(type(f).__name__ == _MovedModuleFinder.__name__ for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())


# ------------------------------------------------------------------ removed thread pools
_REMOVED = ("attention_ref runs no threads of its own (its thread pools were removed: the first did"
            " not pay, the second could not be made safe against Ctrl-C and fork; docs/performance.md);"
            " BLAS keeps its own threads, and")


def get_num_threads() -> int:
    """Deprecated: always 1 (the library runs no threads of its own)."""
    warnings.warn(f"{_REMOVED} get_num_threads() is always 1", DeprecationWarning, stacklevel=2)
    return 1


def set_num_threads(n: int) -> None:
    """Deprecated: checks ``n`` (a positive integer) and changes nothing."""
    if isinstance(n, (bool, np.bool_)):
        raise TypeError(f"n must be a positive integer, got {type(n).__name__} {n!r}")
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"n must be a positive integer, got {type(n).__name__} {n!r}") from None
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    warnings.warn(f"{_REMOVED} set_num_threads() has no effect", DeprecationWarning, stacklevel=2)
