"""Figures for the mechanism notebooks: the blockwise path's tiles, the softmax Jacobian,
RoPE's scores against the offset, and the documents' printed numbers beside ours.

Like :mod:`.figures`, every function builds a :class:`matplotlib.figure.Figure` without
pyplot and returns it.
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .._checks import as_generator
from ..core.masks import causal_mask
from ..variants.blockwise import visited_tiles
from ..variants.local import local_window_mask
from ..variants.rope import rope_forward

__all__ = ["tile_maps", "softmax_jacobians", "rope_scores_by_offset", "printed_vs_computed"]


def _allowed(n_q, n_k, causal, window):
    """The scores the causal / window rules allow, (Nq, Nk), from the library's own masks."""
    allowed = causal_mask(n_q, n_k) if causal else np.ones((n_q, n_k), bool)
    return allowed if window is None else allowed & local_window_mask(n_q, window, n_k)


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
    """The softmax Jacobian ``J_ij = dy_i/dx_j = y_i (delta_ij - y_j)`` of the probabilities
    ``y`` (row i: output, column j: input) beside its diagonal only (the classic wrong
    backward), on one colour scale."""
    y = np.asarray(y, dtype=float)
    full = np.diag(y) - np.outer(y, y)  # (N, N), J_ij = y_i (delta_ij - y_j)
    diagonal = np.diag(y * (1 - y))  # (N, N)
    lim = float(np.abs(full).max())
    fig = Figure(figsize=(8.4, 3.7), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, (label, jac) in zip(axes, (("full: y_i (delta_ij - y_j)", full),
                                       ("diagonal only: y_i (1 - y_i)", diagonal))):
        im = ax.imshow(jac, cmap="RdBu_r", vmin=-lim, vmax=lim)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("j (input x_j)")
        ax.set_ylabel("i (output y_i)")
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="dy_i / dx_j")
    fig.suptitle("the softmax Jacobian: every output depends on every input")
    return fig


def rope_scores_by_offset(d=64, max_offset=128, base=10000.0, pairs=256, seed=0, starts=(0, 50)) -> Figure:
    """RoPE makes a score depend on the positions only through their offset. Left: one random
    (q, k), q at position m and k at m + offset, for each m in ``starts`` (the curves coincide).
    Right: the score of a vector with itself ``offset`` positions apart, averaged over
    ``pairs`` random vectors (it decays). Both are ``q.k / sqrt(d)``."""
    rng = as_generator(seed)
    offsets = np.arange(max_offset + 1)
    q, k = rng.standard_normal((2, 1, d))
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    for i, m in enumerate(starts):
        qm, _ = rope_forward(np.repeat(q, len(offsets), axis=0), np.full(len(offsets), float(m)), base,
                             layout="interleaved")  # (T, d)
        kn, _ = rope_forward(np.repeat(k, len(offsets), axis=0), m + offsets, base, layout="interleaved")  # (T, d)
        left.plot(offsets, np.sum(qm * kn, axis=-1) / np.sqrt(d), ls="-" if i == 0 else "--", label=f"q at {m}")
    x = rng.standard_normal((pairs, 1, d))
    at_zero, _ = rope_forward(x, np.zeros((pairs, 1)), base, layout="interleaved")  # (P, 1, d)
    same = [float(np.mean(np.sum(at_zero * rope_forward(x, np.full((pairs, 1), float(t)), base,
                                                        layout="interleaved")[0], axis=-1))) / np.sqrt(d)
            for t in offsets]
    right.plot(offsets, same, color="C2")
    for ax, title in ((left, "one (q, k): the same curve from every start"),
                      (right, f"a vector with itself, mean of {pairs}")):
        ax.axhline(0, color="gray", lw=0.5)
        ax.set_xlabel("offset between the positions of k and q")
        ax.set_ylabel("q.k / sqrt(d)")
        ax.set_title(title, fontsize=10)
    left.legend(fontsize=8)
    fig.suptitle(f"RoPE (d = {d}, base {base:g}): scores depend on the offset only")
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
