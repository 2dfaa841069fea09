"""Figures for the mechanism notebooks: the blockwise path's tiles, the softmax Jacobian,
RoPE's scores against the offset, and the documents' printed numbers beside ours.

Like :mod:`.figures`, every function builds a :class:`matplotlib.figure.Figure` without
pyplot and returns it.
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..variants.blockwise import visited_tiles
from ..variants.local import local_window_mask
from ..variants.rope import rope_forward

__all__ = ["tile_maps", "softmax_jacobians", "rope_scores_by_offset", "printed_vs_computed"]


def _allowed(n_q, n_k, causal, window):
    """The scores the causal / window rules allow, (Nq, Nk); query i sits at i + n_k - n_q."""
    allowed = np.ones((n_q, n_k), bool)
    if causal:
        allowed &= np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q)
    if window is not None:
        allowed &= local_window_mask(n_q, window, n_k)
    return allowed


def tile_maps(n_q, n_k, block_size, rules=({"causal": True}, {"window": 8})) -> Figure:
    """One panel per rule: the allowed scores (white; blocked ones grey) and the tiles the blockwise path
    visits (outlined) or skips (hatched), from :func:`attention_ref.visited_tiles`."""
    rules = list(rules)
    fig = Figure(figsize=(3.6 * len(rules) + 0.4, 3.9), layout="constrained")
    axes = fig.subplots(1, len(rules), squeeze=False)[0]
    for ax, rule in zip(axes, rules):
        causal, window = rule.get("causal", False), rule.get("window")
        visited = set(visited_tiles(n_q, n_k, block_size, causal=causal, window=window))
        ax.imshow(~_allowed(n_q, n_k, causal, window), cmap="Greys", vmin=0, vmax=2.5,  # blocked: grey
                  extent=(0, n_k, n_q, 0), interpolation="nearest")
        total = 0
        for qs in range(0, n_q, block_size):
            for ks in range(0, n_k, block_size):
                total += 1
                size = (min(block_size, n_k - ks), min(block_size, n_q - qs))
                if (qs, ks) in visited:
                    ax.add_patch(Rectangle((ks, qs), *size, fill=False, edgecolor="C0", lw=1.5))
                else:
                    ax.add_patch(Rectangle((ks, qs), *size, fill=False, edgecolor="C3", lw=0.5, hatch="///"))
        name = ", ".join(f"{k}={v}" for k, v in rule.items())
        ax.set_title(f"{name}: {len(visited)} of {total} tiles", fontsize=10)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    fig.suptitle(f"blockwise tiles of {block_size}: visited (blue), skipped (red hatch)")
    return fig


def softmax_jacobians(y) -> Figure:
    """The softmax Jacobian ``dy_j/dx_i = y_j (delta_ij - y_i)`` of the probabilities ``y``
    beside its diagonal only (the classic wrong backward), on one colour scale."""
    y = np.asarray(y, dtype=float)
    full = np.diag(y) - np.outer(y, y)  # (N, N)
    diagonal = np.diag(y * (1 - y))  # (N, N)
    lim = float(np.abs(full).max())
    fig = Figure(figsize=(8.4, 3.7), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, (label, jac) in zip(axes, (("full: y_j (delta_ij - y_i)", full),
                                       ("diagonal only: y_i (1 - y_i)", diagonal))):
        im = ax.imshow(jac, cmap="RdBu_r", vmin=-lim, vmax=lim)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("j (input)")
        ax.set_ylabel("i (output)")
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="dy_i / dx_j")
    fig.suptitle("the softmax Jacobian: every output depends on every input")
    return fig


def rope_scores_by_offset(d=64, max_offset=128, base=10000.0, pairs=256, seed=0) -> Figure:
    """RoPE makes a score depend on the positions only through their offset: for one random
    (q, k) pair, and on average over ``pairs`` pairs with ``k = q``, the score of q at
    position m and k at position m + offset, against the offset."""
    rng = np.random.default_rng(seed)
    offsets = np.arange(max_offset + 1)
    q, k = rng.standard_normal((2, 1, d))
    qs, _ = rope_forward(np.repeat(q, len(offsets), axis=0), np.zeros(len(offsets)), base)  # (T, d), position 0
    ks, _ = rope_forward(np.repeat(k, len(offsets), axis=0), offsets, base)  # (T, d)
    one = np.sum(qs * ks, axis=-1) / np.sqrt(d)
    x = rng.standard_normal((pairs, 1, d))
    same = []
    for t in offsets:  # q = k: the score of a token with itself, t positions apart
        a, _ = rope_forward(x, np.zeros((pairs, 1)), base)
        b, _ = rope_forward(x, np.full((pairs, 1), float(t)), base)
        same.append(float(np.mean(np.sum(a * b, axis=-1))) / d)
    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.subplots()
    ax.plot(offsets, one, label="one random pair q, k: q.k / sqrt(d)")
    ax.plot(offsets, same, label=f"k = q, mean of {pairs} pairs: q.k / d")
    ax.axhline(0, color="gray", lw=0.5)
    ax.set_xlabel("offset between the positions of k and q")
    ax.set_ylabel("score")
    ax.set_title(f"RoPE (d = {d}, base {base:g}): scores depend on the offset only", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def printed_vs_computed(labels, printed, computed, *, title="printed by the document vs computed") -> Figure:
    """Grouped bars: each number as the document prints it and as we compute it."""
    printed, computed = np.asarray(printed, dtype=float), np.asarray(computed, dtype=float)
    if not len(labels) == len(printed) == len(computed):
        raise ValueError(f"{len(labels)} labels for {len(printed)} printed and {len(computed)} computed values")
    x = np.arange(len(labels))
    fig = Figure(figsize=(max(5.0, 0.55 * len(labels) + 1.5), 3.6), layout="constrained")
    ax = fig.subplots()
    ax.bar(x - 0.2, printed, 0.4, label="printed", color="C3")
    ax.bar(x + 0.2, computed, 0.4, label="computed", color="C0")
    ax.set_xticks(x, labels, rotation=45, ha="right")
    ax.set_ylabel("value")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return fig
