"""Figures: attention heatmaps, saturation curves, the convex hull, singular value spectra.

With :mod:`.training`, the only modules that import matplotlib (the core imports NumPy
only; import the package explicitly: ``from attention_ref import plot``). Every function builds a
:class:`matplotlib.figure.Figure` without pyplot and returns it: nothing is shown and no
global figure state is kept, so the functions work under any backend (tests use Agg)
and in notebooks (``%matplotlib inline`` displays a returned figure). Save one with
``fig.savefig(path)``; :func:`save_all` writes every figure of the project to a folder.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from .._checks import as_generator
from .. import documents
from .._atomic import atomic_path
from ..documents import experiments as ex

__all__ = [
    "attention_heatmaps", "saturation_curves", "convex_hull", "singular_value_spectra",
    "example_attention_weights", "save_all", "FIGURES",
]


def attention_heatmaps(weights, query_tokens=None, key_tokens=None, *, title="attention weights",
                       annotate=None, panel_titles=None) -> Figure:
    """One heatmap per head: row ``i`` is how query token ``i`` spreads its attention.

    Parameters
    ----------
    weights : array (H, n_q, n_k) (or (n_q, n_k) for one head), rows summing to 1 (or 0)
    query_tokens : n_q labels, or None for position numbers; key_tokens : n_k labels
        (default: the query labels when n_q == n_k, else position numbers)
    annotate : write each weight in its cell (default: when n_q, n_k <= 8)
    panel_titles : one title per panel (default: "head 1", "head 2", ...)
    """
    w = np.asarray(weights, dtype=float)
    if w.ndim == 2:
        w = w[None]  # (1, Nq, Nk)
    if w.ndim != 3:
        raise ValueError(f"weights must have shape (H, n_q, n_k) or (n_q, n_k), got {np.shape(weights)}")
    h, n_q, n_k = w.shape
    if key_tokens is None and query_tokens is not None and n_q == n_k:
        key_tokens = query_tokens
    labels = [list(t) if t is not None else None for t in (query_tokens, key_tokens)]
    for tokens, n, what in ((labels[0], n_q, "query"), (labels[1], n_k, "key")):
        if tokens is not None and len(tokens) != n:
            raise ValueError(f"{len(tokens)} {what} labels for weights of shape {w.shape}")
    panel_titles = [f"head {i + 1}" for i in range(h)] if panel_titles is None else list(panel_titles)
    if len(panel_titles) != h:
        raise ValueError(f"{len(panel_titles)} panel titles for {h} panels")
    annotate = max(n_q, n_k) <= 8 if annotate is None else annotate
    longest = max((len(str(t)) for t in labels[1] or ()), default=0)  # rotated key labels need height
    cols = min(h, 4)  # at most four panels a row
    rows = -(-h // cols)
    fig = Figure(figsize=(3.2 * cols + 1.6, (3.4 + 0.07 * longest) * rows), layout="constrained")
    grid = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in grid[h:]:
        ax.set_visible(False)
    axes = grid[:h]
    for i, ax in enumerate(axes):
        im = ax.imshow(w[i], vmin=0.0, vmax=1.0, cmap="viridis")
        if labels[1] is not None:
            ax.set_xticks(range(n_k), labels[1], rotation=60, ha="right")
        if labels[0] is not None:
            ax.set_yticks(range(n_q), labels[0])
        ax.set_title(panel_titles[i], fontsize=10)
        ax.set_xlabel("key")
        if i % cols == 0:
            ax.set_ylabel("query")
        if annotate:
            for a in range(n_q):
                for b in range(n_k):
                    ax.text(b, a, f"{w[i, a, b]:.2f}", ha="center", va="center", fontsize=7,
                            color="black" if w[i, a, b] > 0.6 else "white")
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="weight")
    fig.suptitle(title)
    return fig


def example_attention_weights(seed: int = 0):
    """A small causal self-attention example with readable labels: (tokens, weights (H, N, N)).

    Six tokens with random embeddings, two heads, d_model = 8 and a causal mask, computed
    with :class:`attention_ref.MultiHeadAttention`.
    """
    from ..core.masks import causal_mask
    from ..nn.multi_head_attention import MultiHeadAttention
    tokens = ["the", "tired", "mechanic", "fixed", "the", "engine"]
    rng = as_generator(seed)
    x = rng.standard_normal((len(tokens), 8))  # (N, D)
    layer = MultiHeadAttention(8, 2, seed=seed)
    layer.params["W_q"] = layer.params["W_q"] * 3.0  # sharper scores, more readable maps
    layer.forward(x, mask=causal_mask(len(tokens)))
    return tokens, layer.cache.weights  # (H, N, N)


def saturation_curves(d_ks=ex.DEFAULT_D_KS, n_keys: int = 8) -> Figure:
    """Three panels against d_k, with and without the 1/sqrt(d_k) scale: the variance of
    the scores, the largest softmax weight, and the norm of the softmax Jacobian."""
    d_ks = list(d_ks)
    var = [ex.score_variance(d, samples=4000) for d in d_ks]
    sat = {s: [ex.saturation(d, s, n_keys=n_keys) for d in d_ks] for s in (False, True)}
    fig = Figure(figsize=(11, 3.4), layout="constrained")
    a, b, c = fig.subplots(1, 3)
    a.loglog(d_ks, [v[0] for v in var], "o-", label="q.k")
    a.loglog(d_ks, [v[1] for v in var], "s-", label="q.k / sqrt(d_k)")
    a.loglog(d_ks, d_ks, ":", color="gray", label="d_k")
    a.set_title("variance of the scores")
    b.semilogx(d_ks, [s.max_weight for s in sat[False]], "o-", label="unscaled")
    b.semilogx(d_ks, [s.max_weight for s in sat[True]], "s-", label="scaled")
    b.axhline(1 / n_keys, color="gray", ls=":", label=f"uniform 1/{n_keys}")
    b.set_ylim(0, 1.05)
    b.set_title(f"largest weight ({n_keys} keys)")
    c.loglog(d_ks, [s.grad_norm for s in sat[False]], "o-", label="unscaled")
    c.loglog(d_ks, [s.grad_norm for s in sat[True]], "s-", label="scaled")
    c.set_title("softmax Jacobian norm (median)")
    for ax in (a, b, c):
        ax.set_xlabel("d_k")
        ax.legend(fontsize=8)
    fig.suptitle("Why divide by sqrt(d_k): unscaled scores grow, the softmax saturates,"
                 " its gradient vanishes")
    return fig


def convex_hull(show_heads: bool = True) -> Figure:
    """The four keys of 002, their convex hull, and the score lines of a few queries.

    A query ``q`` ranks keys by ``q . k``: the key furthest along ``q``. k_3 sits halfway
    between k_1 and k_2, on the hull's edge, so it can tie with them but never beat both.
    """
    keys = np.array(documents.HULL["keys"])
    fig = Figure(figsize=(9.5, 4.2), layout="constrained")
    a, b = fig.subplots(1, 2)
    hull = keys[[0, 1, 3, 0]]  # vertices k_1, k_2, k_4 (see experiments.hull_vertices)
    a.fill(hull[:, 0], hull[:, 1], alpha=0.15, color="C0", label="convex hull")
    a.plot(hull[:, 0], hull[:, 1], color="C0")
    for j, (kx, ky) in enumerate(keys):
        a.plot(kx, ky, "o", color="C3" if j == 2 else "k")
        a.annotate(f"k{j + 1} = ({kx:g}, {ky:g})", (kx, ky), textcoords="offset points",
                   xytext=(6, 4))
    if show_heads:
        for i, q in enumerate(documents.HULL["head_queries"]):
            a.annotate("", xy=(4 * q[0], 4 * q[1]), xytext=(0, 0),
                       arrowprops={"arrowstyle": "->", "color": f"C{i + 1}", "lw": 2})
            a.text(4 * q[0] + 0.2, 4 * q[1] + 0.2, f"q(head {i + 1})", color=f"C{i + 1}")
    a.set_aspect("equal")
    a.set_xlim(-1.5, 12.5)
    a.set_ylim(-1.5, 12)
    a.set_title("keys of the thought experiment")
    a.legend(loc="upper right", fontsize=8)
    angles = np.linspace(0, 2 * np.pi, 721)
    s = ex.hull_scores(np.stack([np.cos(angles), np.sin(angles)], axis=1))  # (T, 4)
    for j in range(4):
        b.plot(np.degrees(angles), s[:, j], lw=2.5 if j == 2 else 1.2, label=f"q . k{j + 1}",
               color="C3" if j == 2 else None)
    b.set_xlabel("direction of the unit query (degrees)")
    b.set_ylabel("score")
    b.set_title("k3's score is always the mean of k1's and k2's")
    b.legend(fontsize=8)
    return fig


def singular_value_spectra(scales=(0.1, 1.0, 10.0), n: int = 64, d_k: int = 16) -> Figure:
    """Singular values of ``softmax(t Q K^T / sqrt(d_k))`` for random Q, K at several
    score scales ``t``; the dashed line is ``Q K^T``'s rank ``d_k``."""
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    for t in scales:
        sv = ex.softmax_spectrum(n=n, d_k=d_k, scale=t)
        ax.semilogy(np.arange(1, n + 1), sv, "o-", ms=3,
                    label=f"score scale {t:g}: 90% energy in {ex.energy_rank(sv)}")
    ax.axvline(d_k, color="gray", ls="--", label=f"rank of Q K^T = d_k = {d_k}")
    ax.set_xlabel("index")
    ax.set_ylabel("singular value")
    ax.set_title(f"Spectrum of the {n} x {n} attention matrix (full rank, decaying)")
    ax.legend(fontsize=8)
    return fig


def _example_heatmaps() -> Figure:
    tokens, weights = example_attention_weights()
    return attention_heatmaps(weights, tokens, title="causal self-attention, two heads (random weights)")


#: File name -> function building the figure, for :func:`save_all`.
FIGURES = {
    "attention_heads.png": _example_heatmaps,
    "saturation.png": saturation_curves,
    "convex_hull.png": convex_hull,
    "singular_values.png": singular_value_spectra,
}


def save_all(directory, names=None) -> list[Path]:
    """Write the figures (all, or those in ``names``) as PNGs into ``directory``, each atomically
    (a temporary file beside it, renamed over it): a killed run leaves the old figure whole."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in FIGURES if names is None else names:
        fig = FIGURES[name]()
        path = directory / name
        with atomic_path(path) as tmp:  # a killed or starved run leaves the old figure, never half of one
            fig.savefig(tmp, dpi=110)
        paths.append(path)
    return paths
