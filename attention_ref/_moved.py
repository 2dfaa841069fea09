"""Deprecated import paths: modules that moved when the package was split into layers.

``import attention_ref.masks`` (the flat layout of 0.1) still works for one release: it
warns with a ``DeprecationWarning`` naming the new path and returns the moved module
itself, so its functions and classes are the same objects. Remove in 0.3.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

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
        package, _, old = fullname.rpartition(".")
        if package == _PACKAGE and old in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        old = spec.name.rpartition(".")[2]
        new = f"{_PACKAGE}.{MOVED[old]}"
        warnings.warn(f"{spec.name} moved to {new}; the old path will be removed in 0.3",
                      DeprecationWarning, stacklevel=2)  # warnings skips importlib's frames
        module = importlib.import_module(new)
        self._specs.setdefault(new, module.__spec__)
        return module

    def exec_module(self, module):
        """Nothing to run: the moved module is executed already. The import system has just
        set ``module.__spec__`` to the old name's spec; give the module its own back."""
        module.__spec__ = self._specs[module.__name__]


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
