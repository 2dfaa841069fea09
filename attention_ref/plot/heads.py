"""Figures of what trained heads do: every head's attention on a real line of text, the per-head
scores, one query's walk through Q, K and V, and the induction-head circuit.

Like :mod:`.figures`, every function builds a :class:`matplotlib.figure.Figure` without pyplot
and returns it. The numbers come from :mod:`attention_ref.documents.head_scores` and
:mod:`attention_ref.documents.induction`; these functions only draw them.
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

__all__ = ["byte_labels", "plot_attention_heads", "plot_head_scores", "plot_qkv", "plot_induction"]

_SHOWN = {ord("\n"): "\\n", ord(" "): "␣", ord("\t"): "\\t"}


def byte_labels(text: bytes) -> list:
    """One tick label per byte: the character, with a newline shown as ``\\n`` and a space as ``␣``."""
    return [_SHOWN.get(b, chr(b) if 32 < b < 127 else f"x{b:02x}") for b in bytes(text)]


def _ticks(ax, labels, n, size):
    ax.set_xticks(range(n), labels, rotation=90, fontsize=size, family="monospace")
    ax.set_yticks(range(n), labels, fontsize=size, family="monospace")


def plot_attention_heads(weights, labels, *, heads=None, scores=None, score_name="score", title=None) -> Figure:
    """Heatmaps of heads' attention on one sequence, one row per layer and one column per head (or one row of
    the ``heads`` asked for): row t of a panel is how the query at token t spreads its attention over the keys
    (causal: nothing right of the diagonal).

    Parameters
    ----------
    weights : list (one per layer) of arrays (H, T, T), the attention of one sequence
    labels : T tick labels (e.g. :func:`byte_labels` of the text)
    heads : optional list of ``(layer, head)`` pairs to show, in one row (default: every head)
    scores : optional (layers, H) numbers written in each panel's title (e.g. previous-token scores)
    """
    layers = [np.asarray(w, float) for w in weights]
    if not layers or any(w.ndim != 3 or w.shape != layers[0].shape for w in layers):
        raise ValueError("weights must be a non-empty list of arrays (H, T, T) of one shape")
    H, T, _ = layers[0].shape
    if len(labels) != T:
        raise ValueError(f"{len(labels)} labels for {T} positions")
    if heads is None:
        grid = [[(layer, head) for head in range(H)] for layer in range(len(layers))]
    else:
        grid = [[(int(layer), int(head)) for layer, head in heads]]
        if not grid[0] or any(not (0 <= l < len(layers) and 0 <= h < H) for l, h in grid[0]):
            raise ValueError(f"heads must be (layer, head) pairs within {len(layers)} layers of {H} heads, got {heads}")
    rows, cols = len(grid), len(grid[0])
    side = max(3.3, 0.12 * T) if cols <= 2 else 3.3  # one or two panels: room for every tick label
    size = 7 if side / T >= 0.1 else 5
    fig = Figure(figsize=((side + 0.1) * cols + 1.2, (side + 0.4) * rows + 0.8), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for r, row in enumerate(grid):
        for c, (layer, head) in enumerate(row):
            ax = axes[r, c]
            im = ax.imshow(layers[layer][head], cmap="viridis", vmin=0.0, vmax=1.0)
            _ticks(ax, labels, T, size)
            extra = "" if scores is None else f"\n{score_name} {np.asarray(scores)[layer, head]:.2f}"
            ax.set_title(f"layer {layer}, head {head}{extra}", fontsize=9)
            ax.set_xlabel("key: the token attended to", fontsize=8)
            ax.set_ylabel("query: the token attending", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.6, label="attention weight")
    if title:
        fig.suptitle(title)
    return fig


def plot_head_scores(scores: dict, *, baselines: dict | None = None, title=None) -> Figure:
    """Bars per head (``layer.head`` on the x axis), one group per measure: ``scores`` maps a measure's name
    to an array (layers, H); ``baselines`` maps the same names to the score of evenly spread attention."""
    names = list(scores)
    arrays = [np.asarray(scores[n], float) for n in names]
    L, H = arrays[0].shape
    fig = Figure(figsize=(1.5 + 0.3 * L * H * len(names), 4.0), layout="constrained")
    ax = fig.subplots()
    x = np.arange(L * H)
    width = 0.8 / len(names)
    for i, (name, a) in enumerate(zip(names, arrays)):
        bars = ax.bar(x + (i - (len(names) - 1) / 2) * width, a.ravel(), width, label=name)
        if baselines and name in baselines:
            ax.hlines(baselines[name], -0.5, L * H - 0.5, colors=bars.patches[0].get_facecolor(), linestyles=":",
                      label=f"{name}: evenly spread attention")
    ax.set_xticks(x, [f"{layer}.{head}" for layer in range(L) for head in range(H)])
    ax.set_xlabel("head (layer.head)")
    ax.set_ylabel("mean weight on the rule's key")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title)
    return fig


def plot_qkv(q, k, v, labels, *, scale=None, title=None) -> Figure:
    """One query of one head, step by step: what it asks (q against each key k_j), the scores and the
    weights they give, and what the values carry (each w_j v_j and their sum, the head's output).

    Parameters
    ----------
    q : array (d_k,), the query; k : array (n, d_k), the keys it sees; v : array (n, d_v), their values
    labels : n tick labels of the keys
    scale : the factor on ``q . k_j`` (default ``1 / sqrt(d_k)``)
    """
    q, k, v = (np.asarray(a, float) for a in (q, k, v))
    if q.ndim != 1 or k.ndim != 2 or v.ndim != 2 or k.shape[1] != q.shape[0] or v.shape[0] != k.shape[0]:
        raise ValueError(f"q (d_k,), k (n, d_k), v (n, d_v) expected, got {q.shape}, {k.shape}, {v.shape}")
    n = k.shape[0]
    if len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} keys")
    scale = 1.0 / np.sqrt(q.shape[0]) if scale is None else scale
    s = scale * (k @ q)  # (n,)
    w = np.exp(s - s.max())
    w /= w.sum()
    fig = Figure(figsize=(13, 0.15 * n + 2.4), layout="constrained")
    a, b, c, d = fig.subplots(1, 4, gridspec_kw={"width_ratios": [3, 1.2, 1.2, 3]})
    qk = np.vstack([q, k])
    lim = np.abs(qk).max()
    a.imshow(qk, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    a.set_yticks(range(n + 1), ["query q"] + [f"key of {t}" for t in labels], fontsize=7, family="monospace")
    a.set_xlabel("component of q and k (head width d_k)")
    a.set_title("what the query asks, what each key offers", fontsize=9)
    for ax, values, what in ((b, s, "score q·k_j / √d_k"), (c, w, "weight w_j = softmax")):
        ax.barh(range(n), values, color="tab:blue")
        ax.set_ylim(n - 0.5, -0.5)
        ax.set_yticks(range(n), labels, fontsize=7, family="monospace")
        ax.set_xlabel(what)
        ax.axvline(0, color="k", lw=0.5)
    b.set_title("how well each key matches", fontsize=9)
    c.set_title("the share each key gets", fontsize=9)
    wv = np.vstack([w[:, None] * v, (w[:, None] * v).sum(axis=0)])
    lim = np.abs(wv).max()
    d.imshow(wv, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    d.set_yticks(range(n + 1), [f"w·value of {t}" for t in labels] + ["output Σ w_j v_j"], fontsize=7,
                 family="monospace")
    d.set_xlabel("component of the value (head width d_v)")
    d.set_title("what the values carry into the output", fontsize=9)
    if title:
        fig.suptitle(title)
    return fig


def plot_induction(result: dict, weights: dict, ids) -> Figure:
    """The induction experiment of ``examples/induction_heads.py``: the best induction score while training
    (two layers against one), the two heads of the circuit on one row ``ids`` (T,), and layer 1's induction
    score with each layer-0 head ablated. ``result``: the script's JSON; ``weights``: ``{"two_layer": params}``."""
    from ..documents.head_scores import previous_token_scores
    from ..documents.induction import attention_only_forward

    ids = np.asarray(ids)
    heads = result["settings"]["num_heads"]
    _, cache = attention_only_forward(ids[None], weights["two_layer"], heads)
    w0, w1 = cache.weights[0][0], cache.weights[1][0]  # (H, T, T)
    prev = int(np.argmax(previous_token_scores(cache.weights[0])))
    induction = int(np.argmax(result["two_layer"]["induction"][1]))
    fig = Figure(figsize=(16, 4.2), layout="constrained")
    a, b, c, d = fig.subplots(1, 4, gridspec_kw={"width_ratios": [1.2, 1, 1, 1]})
    for name, label in (("two_layer", "two layers"), ("one_layer", "one layer")):
        curve = result[name]["curve"]
        a.plot(curve["step"], curve["best_induction"], label=label)
    a.set_xlabel("Adam step")
    a.set_ylabel("induction score of the best head")
    a.set_ylim(0, 1)
    a.set_title("Induction score while training", fontsize=9)
    a.legend()
    labels = [str(t) for t in ids]
    for ax, w, what in ((b, w0[prev], f"layer 0, head {prev}: previous token"),
                        (c, w1[induction], f"layer 1, head {induction}: induction")):
        ax.imshow(w, cmap="viridis", vmin=0, vmax=1)
        ax.set_xticks(range(len(ids)), labels, rotation=90, fontsize=6)
        ax.set_yticks(range(len(ids)), labels, fontsize=6)
        ax.set_xlabel("key (token id)")
        ax.set_ylabel("query (token id)")
        ax.set_title(what, fontsize=9)
    ablation = result["ablation"]
    names = list(ablation)
    values = [ablation[n]["induction"][1][induction] for n in names]
    d.bar(range(len(names)), values, color=["tab:green"] + ["tab:red"] * (len(names) - 1))
    d.set_xticks(range(len(names)), ["nothing"] + [n.replace("layer 0 ", "") for n in names[1:]])
    d.set_xlabel("layer-0 head ablated")
    d.set_ylabel(f"induction score of layer 1, head {induction}")
    d.set_ylim(0, 1)
    d.set_title("The circuit: remove its first half", fontsize=9)
    return fig
