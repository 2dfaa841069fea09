"""Figures (matplotlib is imported here and nowhere else; ``import attention_ref`` never
loads it). ``figures``: attention heatmaps, saturation curves, the convex hull, singular
value spectra, and :func:`save_all`; ``mechanisms``: the blockwise tiles, the softmax
Jacobian, RoPE against the offset, printed vs computed numbers; ``heads``: what trained
heads do (every head's attention on a line of real text, per-head scores, one query's walk
through Q, K and V, the induction-head circuit); ``training``: the two-heads demo's loss
curves and attention maps. Every function returns a figure and shows nothing.
"""
from .figures import *  # noqa: F401,F403
from .figures import __all__ as _figures
from .mechanisms import *  # noqa: F401,F403
from .mechanisms import __all__ as _mechanisms
from .heads import *  # noqa: F401,F403
from .heads import __all__ as _heads

__all__ = _figures + _mechanisms + _heads
