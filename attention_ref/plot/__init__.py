"""Figures (matplotlib is imported here and nowhere else; ``import attention_ref`` never
loads it). ``figures``: attention heatmaps, saturation curves, the convex hull, singular
value spectra, and :func:`save_all`; ``training``: the two-heads demo's loss curves and
attention maps. Every function returns a figure and shows nothing.
"""
from .figures import *  # noqa: F401,F403
from .figures import __all__  # noqa: F401
