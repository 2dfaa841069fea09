"""Figures for the two-heads training demo: loss curves and the heads' attention maps.

Matplotlib is imported here only (never by the core package). The functions build a
:class:`matplotlib.figure.Figure` directly, without pyplot, so they neither show anything
nor change the caller's matplotlib backend or pyplot state. Save them with
``fig.savefig(path)``; in a notebook with ``%matplotlib inline`` they display by themselves.

Symbols: E epochs, B examples shown, N tokens, H heads.
"""
from __future__ import annotations

import numpy as np

__all__ = ["plot_loss_curves", "plot_attention_maps"]


def _figure(**kwargs):
    """A new :class:`matplotlib.figure.Figure`, not registered with pyplot (imported on first use)."""
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def plot_loss_curves(curves, *, title="Training loss (mean squared error)"):
    """One line per model: ``curves`` maps a label to its per-epoch losses (E,).

    The y axis is logarithmic, so a loss that keeps falling stays visible next to one
    that has stalled. Returns the figure.
    """
    from matplotlib.ticker import MaxNLocator

    fig = _figure(figsize=(6, 3.6))
    ax = fig.subplots()
    for label, losses in curves.items():
        losses = np.asarray(losses)
        ax.plot(np.arange(1, len(losses) + 1), losses, marker="o", markersize=3, label=label)
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_attention_maps(maps, x, *, title="Where the summary token looks"):
    """Heat maps of the summary token's attention, one panel per head.

    Parameters
    ----------
    maps : dict mapping a panel title (e.g. ``"2 heads: head 0"``) to weights (B, N), the
        summary token's attention over the N tokens of B examples
    x : array (B, N, 3), the examples; the token with the largest ``a`` is marked with a
        circle, the one with the largest ``b`` with a cross

    Returns the figure.
    """
    x = np.asarray(x)
    a_max, b_max = x[..., 0].argmax(axis=1), x[..., 1].argmax(axis=1)  # (B,), (B,)
    rows = np.arange(x.shape[0])
    fig = _figure(figsize=(3.2 * len(maps) + 1.2, 3.8), layout="constrained")
    axes = fig.subplots(1, len(maps), squeeze=False)
    for ax, (label, w) in zip(axes[0], maps.items()):
        image = ax.imshow(np.asarray(w), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        ax.scatter(a_max, rows, marker="o", s=60, facecolors="none", edgecolors="red", label="largest a")
        ax.scatter(b_max, rows, marker="X", s=45, facecolors="white", edgecolors="black",
                   linewidths=0.6, label="largest b")
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("token")
    axes[0][0].set_ylabel("example")
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside lower center", ncol=2, fontsize=8)
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="attention weight")
    fig.suptitle(title)
    return fig
