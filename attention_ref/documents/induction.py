"""An induction head, for what it is: a two-layer attention-only model on repeated random tokens.

**Task.** Each row is a random block of L distinct tokens repeated until the row is full:
``ids[t] = block[t mod L]``, with L drawn anew for every row (``min_period..max_period``).
In the first block nothing can be predicted; after it, the next token is the one that followed
the current token the last time it appeared. The period changes from row to row, so no fixed
offset finds it: a head must look for the earlier copy of the *current token* and read what
came after it.

**Model.** Attention only, as in Elhage et al. (2021) and Olsson et al. (2022): token and
position embeddings, ``num_layers`` causal multi-head attention layers each added to the
residual stream, no norm, no MLP, and an untied unembedding::

    x = W_E[ids] + W_P[0..T-1]                          (B, T, D)
    x = x + MHA_l(x)   for l = 0..num_layers-1          causal, H heads, no biases
    logits = x W_U                                      (B, T, V)

Every step is one of the package's pairs (``embedding``, ``multi_head_attention``, ``linear``,
``cross_entropy``), and :func:`attention_only_backward` walks them back; training is Adam on
these hand-derived gradients.

**Why two layers.** One head can match a token to an earlier copy of itself (query and key
from the same token), but its value then carries that copy, not its successor. An induction
head needs a key that says "my previous token was X": a previous-token head in layer 0 writes
the previous token into each position, and a layer-1 head's key reads it (K-composition). A
one-layer model has no earlier layer to write it. :func:`induction_scores` (in
:mod:`attention_ref.documents.head_scores`) measures the pattern; a ``head_masks`` entry of 0
ablates a head, which is how the circuit is shown.

Symbols: B batch, T positions, D width, H heads, V vocabulary, L period.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import check_positive_int
from ..core.masks import causal_mask
from ..fast.dispatch import linear_backward, linear_forward
from ..nn.cross_entropy import cross_entropy_backward, cross_entropy_forward, next_token_targets
from ..nn.embedding import embedding_backward, embedding_forward
from ..nn.optim import Adam
from ..variants.grouped_heads import multi_head_attention_backward, multi_head_attention_forward

__all__ = ["repeated_sequences", "init_attention_only_params", "AttentionOnlyCache", "attention_only_forward",
           "attention_only_backward", "attention_only_loss", "train_attention_only", "predictable_loss"]

_ATTN = ("W_q", "W_k", "W_v", "W_o")


def repeated_sequences(rng, batch_size, length=24, vocab_size=32, min_period=4, max_period=10):
    """``(ids, periods)``: ``ids`` (B, length), each row a block of ``periods[b]`` distinct random tokens
    repeated to the row's end."""
    batch_size, length = check_positive_int(batch_size, "batch_size"), check_positive_int(length, "length")
    vocab_size = check_positive_int(vocab_size, "vocab_size")
    if not 2 <= min_period <= max_period <= min(vocab_size, length - 1):
        raise ValueError(f"periods must satisfy 2 <= min_period <= max_period <= min(vocab_size, length - 1);"
                         f" got min_period={min_period}, max_period={max_period}, vocab_size={vocab_size},"
                         f" length={length}")
    periods = rng.integers(min_period, max_period + 1, batch_size)  # (B,)
    blocks = np.argsort(rng.random((batch_size, vocab_size)), axis=1)  # (B, V): a random order of the tokens
    t = np.arange(length)
    return blocks[np.arange(batch_size)[:, None], t[None, :] % periods[:, None]], periods  # (B, T), (B,)


def init_attention_only_params(vocab_size=32, d_model=32, num_layers=2, num_heads=2, max_positions=24, *, seed=0):
    """``W_E`` (V, D), ``W_P`` (T, D), ``layers.{l}.W_q/W_k/W_v/W_o`` (D, D), ``W_U`` (D, V); normal,
    with standard deviation 1/sqrt(D) for the square matrices and the unembedding, 1 for the embeddings."""
    rng = np.random.default_rng(seed)
    D = check_positive_int(d_model, "d_model")
    if D % check_positive_int(num_heads, "num_heads"):
        raise ValueError(f"d_model = {D} must be a multiple of num_heads = {num_heads}")
    params = {"W_E": rng.standard_normal((vocab_size, D)), "W_P": rng.standard_normal((max_positions, D))}
    for layer in range(check_positive_int(num_layers, "num_layers")):
        params.update({f"layers.{layer}.{w}": rng.standard_normal((D, D)) / np.sqrt(D) for w in _ATTN})
    params["W_U"] = rng.standard_normal((D, vocab_size)) / np.sqrt(D)
    return params


class AttentionOnlyCache(NamedTuple):
    """Caches of the embeddings, each attention layer, and the unembedding."""

    tok: object
    pos: object
    layers: list  # one multi-head cache per layer
    unembed: object

    @property
    def weights(self) -> list:
        """Each layer's attention probabilities, (B, H, T, T)."""
        return [c.weights for c in self.layers]


def _num_layers(params) -> int:
    return sum(1 for name in params if name.startswith("layers.") and name.endswith(".W_q"))


def attention_only_forward(ids, params, num_heads, head_masks=None):
    """Logits (B, T, V) of the attention-only model on ``ids`` (B, T); returns ``(logits, cache)``.
    ``head_masks``: None, or one entry per layer, None or an array (H,) multiplying each head's output
    (0 ablates the head)."""
    ids = np.asarray(ids)
    T = ids.shape[-1]
    n_layers = _num_layers(params)
    head_masks = [None] * n_layers if head_masks is None else list(head_masks)
    if len(head_masks) != n_layers:
        raise ValueError(f"head_masks has {len(head_masks)} entries; the model has {n_layers} layers")
    tok, tok_cache = embedding_forward(ids, params["W_E"])  # (B, T, D)
    pos, pos_cache = embedding_forward(np.arange(T), params["W_P"])  # (T, D)
    x = tok + pos  # 1. (B, T, D)
    mask, caches = causal_mask(T), []
    for layer in range(n_layers):  # 2. x <- x + MHA_l(x)
        p = {w: params[f"layers.{layer}.{w}"] for w in _ATTN}
        a, c = multi_head_attention_forward(x, x, x, p, num_heads, mask, head_mask=head_masks[layer])
        x = x + a  # (B, T, D)
        caches.append(c)
    logits, unembed_cache = linear_forward(x, params["W_U"])  # 3. (B, T, V)
    return logits, AttentionOnlyCache(tok_cache, pos_cache, caches, unembed_cache)


def attention_only_backward(dlogits, cache: AttentionOnlyCache) -> dict:
    """Gradients of :func:`attention_only_forward`, a dict with the keys of ``params``; the steps in reverse."""
    grads = {}
    dx, grads["W_U"], _ = linear_backward(dlogits, cache.unembed)  # 3. (B, T, D)
    for layer in reversed(range(len(cache.layers))):  # 2. the residual passes dx on; the layer adds its three paths
        dq, dk, dv, g = multi_head_attention_backward(dx, cache.layers[layer])
        grads.update({f"layers.{layer}.{w}": g[w] for w in _ATTN})
        dx = dx + dq + dk + dv
    grads["W_P"] = embedding_backward(dx.reshape(-1, *dx.shape[-2:]).sum(axis=0), cache.pos)  # 1. summed over rows
    grads["W_E"] = embedding_backward(dx, cache.tok)
    return grads


def attention_only_loss(ids, params, num_heads, head_masks=None):
    """``(loss, grads, logits)``: the mean next-token cross-entropy on ``ids`` and its gradients."""
    logits, cache = attention_only_forward(ids, params, num_heads, head_masks)
    loss, ce_cache = cross_entropy_forward(logits, next_token_targets(ids))
    grads = attention_only_backward(cross_entropy_backward(1.0, ce_cache), cache)
    return float(loss), grads, logits


def predictable_loss(logits, ids, periods) -> float:
    """Mean next-token loss over the positions t >= L - 1 whose next token is a repeat (t + 1 >= L)."""
    T, V = ids.shape[-1], logits.shape[-1]
    z = logits[:, :-1] - logits[:, :-1].max(axis=-1, keepdims=True)  # (B, T-1, V)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    nll = -np.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]  # (B, T-1)
    keep = np.arange(1, T)[None, :] >= np.asarray(periods)[:, None]  # the next token repeats an earlier one
    if V < 1 or not keep.any():
        raise ValueError("no position has a repeated next token")
    return float(nll[keep].mean())


class AttentionOnlyRun(NamedTuple):
    """What :func:`train_attention_only` returns."""

    params: dict
    steps: np.ndarray  # the steps at which the curves were measured
    losses: np.ndarray  # mean training loss since the previous point
    induction: np.ndarray  # (points, num_layers, H): induction scores on the fixed evaluation batch


def train_attention_only(num_layers=2, *, steps=1500, batch_size=32, lr=3e-3, num_heads=2, d_model=32,
                         vocab_size=32, length=24, min_period=4, max_period=10, eval_every=100, seed=0,
                         progress=None):
    """Train the attention-only model on :func:`repeated_sequences` with Adam; returns an ``AttentionOnlyRun``.
    ``progress(step, steps, loss)``, when given, is called at each evaluation."""
    from .head_scores import induction_scores

    rng = np.random.default_rng(seed)
    eval_ids, _ = repeated_sequences(np.random.default_rng(seed + 1000), 256, length, vocab_size, min_period,
                                     max_period)
    adam = Adam(init_attention_only_params(vocab_size, d_model, num_layers, num_heads, length, seed=seed), lr=lr)
    points, losses, scores, recent = [], [], [], []
    for step in range(1, check_positive_int(steps, "steps") + 1):
        ids, _ = repeated_sequences(rng, batch_size, length, vocab_size, min_period, max_period)
        loss, grads, _ = attention_only_loss(ids, adam.params, num_heads)
        adam.step(grads)
        recent.append(loss)
        if step % eval_every == 0 or step == steps:
            _, cache = attention_only_forward(eval_ids, adam.params, num_heads)
            points.append(step)
            losses.append(float(np.mean(recent)))
            scores.append([induction_scores(w, eval_ids) for w in cache.weights])
            recent = []
            if progress is not None:
                progress(step, steps, losses[-1])
    return AttentionOnlyRun(dict(adam.params), np.array(points), np.array(losses), np.array(scores))
