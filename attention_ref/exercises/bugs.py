"""Spot the bug: backwards with one realistic mistake each, to find and fix.

Each :class:`Bug` is the source of a whole backward, written as people write it (loops,
einsum, reshapes), with one line wrong: a mistake from the exercises' catalogue or one
seen in public code (the softmax summed over the wrong axis, the wrong triangle of a causal
mask, ``s * (1 - s)`` for the softmax's Jacobian, ...). ``python -m attention_ref exercise bug
start NAME`` writes it to a file; the student finds the line, fixes it, and ``bug check FILE``
runs the exercise's checker on it: it passes once the bug is fixed, and then names the bug
that was there. ``fix`` is the one replacement that mends it (the tests apply it). The
backwards live as ordinary files in ``bug_files/``, so a linter and a formatter see them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Bug", "BUGS"]


@dataclass(frozen=True)
class Bug:
    """One backward with one bug: its exercise, the source, the fix, and what the bug was."""

    name: str
    exercise: str
    story: str  # what the student is told: where the code comes from, what it should do
    source: str  # the whole function, with the bug
    fix: tuple  # (the wrong text, the right text): one replacement mends it
    sentence: str  # what the bug was, said once it is fixed


_FILES = Path(__file__).with_name("bug_files")
_HEADER = "import numpy as np\n\n\n"


def _source(name: str) -> str:
    """A bug's backward: its file in ``bug_files/`` after the docstring and the import."""
    text = (_FILES / f"{name.replace('-', '_')}.py").read_text(encoding="utf-8")
    return text.split(_HEADER, 1)[1]


BUGS = {b.name: b for b in [
    Bug("softmax-axis", "softmax_backward",
        "A softmax backward from a tutorial, right for a single vector. Look at dx when the input has"
        " more than one axis.",
        _source("softmax-axis"), ("axis=0, keepdims=True", "axis=axis, keepdims=True"),
        "the sum_j y_j dy_j ran along axis 0, not along the softmax's axis (cache.axis): right for a 1-d"
        " input only"),
    Bug("softmax-s-times-one-minus-s", "softmax_backward",
        "A softmax backward seen in many answers online. dx is wrong for every input: compare each line"
        " with the softmax's Jacobian.",
        _source("softmax-s-times-one-minus-s"), ("return dy * grad", "return s * (dy - np.sum(dy * s, axis=cache.axis, keepdims=True))"),
        "s (1 - s) is the sigmoid's derivative, only the diagonal of the softmax's Jacobian: every y_i"
        " depends on every x_j, so dx_i = y_i (dy_i - sum_j y_j dy_j)"),
    Bug("linear-dW-transposed", "linear_backward",
        "A linear layer's backward with the leading axes folded into rows. dW is wrong; dx and db are right.",
        _source("linear-dW-transposed"), ("dW = dy2.T @ x2", "dW = x2.T @ dy2"),
        "dW was dy^T x, the transpose (d_out, d_in); for y = x W it is x^T dy, shaped like W"),
    Bug("linear-db-first-axis", "linear_backward",
        "A linear layer's backward in einsum. db is wrong when x has two leading axes or more.",
        _source("linear-db-first-axis"), ("db = dy.sum(axis=0)", "db = dy.reshape(-1, dy.shape[-1]).sum(axis=0)"),
        "db summed dy over the first axis only; the bias is added to every row of every batch item, so"
        " db sums over every axis but the last"),
    Bug("attention-D-axis", "scaled_dot_product_attention_backward",
        "An attention backward. dq and dk are wrong, dv is right.",
        _source("attention-D-axis"), ("axis=-2, keepdims=True", "axis=-1, keepdims=True"),
        "D was summed over the queries (axis -2); D_i = sum_j P_ij dP_ij sums over the keys of row i"
        " (axis -1)"),
    Bug("attention-dq-unscaled", "scaled_dot_product_attention_backward",
        "An attention backward in einsum. dq is wrong; dk and dv are right.",
        _source("attention-dq-unscaled"), ('dq = np.einsum("...qk,...kd->...qd", dS, k)',
                           'dq = np.einsum("...qk,...kd->...qd", dS, k) * scale'),
        "dq missed the factor 1/sqrt(d_k) that dk had: S = q k^T / sqrt(d_k) scales both"),
    Bug("attention-dk-einsum", "scaled_dot_product_attention_backward",
        "An attention backward in einsum. dk is wrong; dq and dv are right.",
        _source("attention-dk-einsum"), ('dk = np.einsum("...qk,...kd->...qd", dS, q) * scale',
                        'dk = np.einsum("...qk,...qd->...kd", dS, q) * scale'),
        "dk's einsum was dq's subscripts with q for k: it computed dS q (query by query); dk = dS^T q"
        " pairs each key with the queries that scored it"),
    Bug("layer-norm-mean-axis", "layer_norm_backward",
        "A layer norm backward. dx is wrong; dgamma and dbeta are right.",
        _source("layer-norm-mean-axis"), ("mean_g = g.mean(axis=0, keepdims=True)", "mean_g = g.mean(axis=-1, keepdims=True)"),
        "mean(g) was taken over the rows (axis 0); the mean and the variance of layer norm are over"
        " each row's features (axis -1), so mean(g) is too"),
    Bug("split-heads-reshape", "split_heads_backward",
        "A split-heads backward. dx is wrong whenever there are two heads or more.",
        _source("split-heads-reshape"), ("return dheads.reshape(*batch, n, h * d_head)",
                         "return np.moveaxis(dheads, -3, -2).reshape(*batch, n, h * d_head)"),
        "the reshape mixed heads and positions: the heads axis must be moved back next to Dh first"),
    Bug("merge-heads-order", "merge_heads_backward",
        "A merge-heads backward. dheads is wrong whenever there are two heads or more.",
        _source("merge-heads-order"), ("split = dmerged.reshape(*batch, n, d_head, num_heads)\n    return np.moveaxis(split, -1, -3)",
                       "split = dmerged.reshape(*batch, n, num_heads, d_head)\n    return np.moveaxis(split, -2, -3)"),
        "the features were split as (Dh, H); the merge concatenates whole heads, so they split as (H, Dh)"),
    Bug("flash-causal-triangle", "flash_attention_backward",
        "A blockwise backward that applies the masks itself, tile by tile. Without the causal rule dq,"
        " dk and dv are right; with it they are wrong.",
        _source("flash-causal-triangle"), ("keep &= key >= pos  # no peeking ahead", "keep &= key <= pos  # no peeking ahead"),
        "the causal mask kept the wrong triangle (key >= position): a query sees the keys at or before it,"
        " key <= position"),
]}
