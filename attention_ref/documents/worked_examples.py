"""The documents' two worked examples (004 sections 4.1 and 4.2), computed step by step.

Symbols: D = d_model = 3, H = 2 heads, Dk = Dv = 2. One token, so every softmax is over
a single key and every attention weight is exactly 1.

Every intermediate is computed with the library's own forward functions (``linear_forward``,
``scaled_dot_product_attention_forward``, ``merge_heads``) and the whole layer once more
with ``multi_head_attention_forward``; :func:`two_head_example` checks that the two agree.

The printed ``W^O`` (3 x 4) cannot multiply the 1 x 4 concatenation. We read it as its
transpose, the 4 x 3 matrix the text declares (``W^O in R^{h d_v x d_model}``); this is
also what ``W^O concat`` (column-vector convention) computes. The alternative reading,
the twelve printed numbers refilled row by row into 4 x 3, is computed too.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..core.attention import scaled_dot_product_attention_forward
from ..core.heads import merge_heads
from ..core.linear import linear_forward
from ..core.multi_head import multi_head_attention_forward
from . import printed_values as documents

__all__ = ["SingleToken", "TwoHead", "single_token_example", "two_head_example", "two_head_params",
           "W_O_READINGS"]

#: How the printed 3 x 4 ``W^O`` can be read as the 4 x 3 matrix the product needs.
W_O_READINGS = {
    "transpose": "W^O = (printed)^T, the declared h d_v x d_model shape (chosen)",
    "row-major": "the 12 printed numbers refilled row by row into 4 x 3",
}


class SingleToken(NamedTuple):
    """004 section 4.1, recomputed."""

    products: np.ndarray  # q_l k_l, (3,)
    dot: float            # q . k
    score: float          # q . k / sqrt(3)
    alpha: float          # softmax over one score
    output: np.ndarray    # alpha v, (3,)


def single_token_example() -> SingleToken:
    """Score, weight and output of the single query/key/value of 004 section 4.1."""
    d = documents.SINGLE_TOKEN
    q = np.array(d["q"])[None, :]  # (1, 3): one query
    k = np.array(d["k"])[None, :]  # (1, 3): one key
    v = np.array(d["v"])[None, :]  # (1, 3)
    out, cache = scaled_dot_product_attention_forward(q, k, v)
    products = q[0] * k[0]
    dot = float(products.sum())
    return SingleToken(products, dot, dot / math.sqrt(d["d_k"]), float(cache.weights[0, 0]), out[0])


def two_head_params(reading: str = "transpose") -> dict:
    """The documents' weights as a params dict: ``W_q = [W_1^Q | W_2^Q]`` etc., no biases."""
    d = documents.TWO_HEAD
    printed = np.array(d["W_O_as_printed"])  # (3, 4)
    if reading == "transpose":
        W_o = printed.T  # (4, 3)
    elif reading == "row-major":
        W_o = printed.reshape(4, 3)  # (4, 3)
    else:
        raise ValueError(f"reading must be one of {sorted(W_O_READINGS)}, got {reading!r}")
    return {
        "W_q": np.hstack([np.array(w) for w in d["W_Q"]]),  # (3, 4)
        "W_k": np.hstack([np.array(w) for w in d["W_K"]]),  # (3, 4)
        "W_v": np.hstack([np.array(w) for w in d["W_V"]]),  # (3, 4)
        "W_o": W_o,
    }


class TwoHead(NamedTuple):
    """004 section 4.2, recomputed: per-head lists are indexed by head (0 = head_1)."""

    x: np.ndarray          # (1, 3)
    Q: list                # Q_i = x W_i^Q, each (1, 2)
    K: list                # K_i = x W_i^K
    V: list                # V_i = x W_i^V
    dots: list             # Q_i K_i^T, each (1, 1)
    scores: list           # Q_i K_i^T / sqrt(d_k)
    weights: list          # softmax(scores), each (1, 1)
    heads: list            # head_i = weights V_i, each (1, 2)
    concat: np.ndarray     # (1, 4)
    W_o: np.ndarray        # (4, 3), the chosen reading
    output: np.ndarray     # (1, 3)
    output_row_major: np.ndarray  # (1, 3), the other reading of W^O
    output_from_printed_concat: np.ndarray  # printed concat times the chosen W^O, (1, 3)
    output_from_printed_concat_row_major: np.ndarray  # printed concat times the row-major W^O, (1, 3)
    layer_output: np.ndarray  # the same through multi_head_attention_forward, (1, 3)


def two_head_example() -> TwoHead:
    """Every intermediate of the two-head example, one library call per formula."""
    d = documents.TWO_HEAD
    x = np.array(d["x"])[None, :]  # (1, 3): one token
    Q, K, V, dots, scores, weights, heads = [], [], [], [], [], [], []
    for i in range(d["h"]):  # the document's formula, head by head
        Q.append(linear_forward(x, np.array(d["W_Q"][i]))[0])  # (1, 2)
        K.append(linear_forward(x, np.array(d["W_K"][i]))[0])  # (1, 2)
        V.append(linear_forward(x, np.array(d["W_V"][i]))[0])  # (1, 2)
        dots.append(Q[i] @ K[i].T)  # (1, 1)
        scores.append(dots[i] / math.sqrt(d["d_k"]))
        head, cache = scaled_dot_product_attention_forward(Q[i], K[i], V[i])
        weights.append(cache.weights)
        heads.append(head)
    concat = merge_heads(np.stack(heads))  # (H, 1, Dv) -> (1, H*Dv)
    p = two_head_params("transpose")
    output = linear_forward(concat, p["W_o"])[0]  # (1, 3)
    output_rm = linear_forward(concat, two_head_params("row-major")["W_o"])[0]
    from_printed = linear_forward(np.array(d["printed_concat"])[None, :], p["W_o"])[0]
    from_printed_rm = linear_forward(np.array(d["printed_concat"])[None, :], two_head_params("row-major")["W_o"])[0]
    layer_output, _ = multi_head_attention_forward(x, x, x, p, d["h"])
    return TwoHead(x, Q, K, V, dots, scores, weights, heads, concat, p["W_o"], output,
                   output_rm, from_printed, from_printed_rm, layer_output)
