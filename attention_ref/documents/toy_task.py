"""A toy task that one attention head cannot solve and two can, and a tiny model for it.

**Task.** A sequence of N tokens, each with three features ``(a_j, b_j, value_j)``. The
``a`` and ``b`` features are each a random shuffle of N evenly spaced levels in [0, 1]
(so each has one clear largest entry) and ``value_j ~ N(0, 1)``. The target is the pair

``(value at argmax_j a_j, value at argmax_j b_j)``.

**Model.** Embed each token (``e_j = x_j W_e + b_e``), put a learned summary token
``cls`` in front, run one Transformer encoder block (:mod:`attention_ref.nn.encoder_block`,
post-norm) and read the two outputs off the summary token: ``pred = z_0 W_r + b_r``.
Loss: mean squared error.

**Why one head cannot do it.** The summary token gathers information from the other
tokens only through its attention row. With one head that row is a single weighted
average ``sum_j w_j v_j`` of linear projections of the tokens: it can put its weight on
the token with the largest ``a`` or on the one with the largest ``b``, but any mixture
of the two mixes their values into the same numbers, and no later position-wise layer
can take them apart again. Two heads can each look at one of the two tokens. The two
models compared have the same widths (``d_model``, ``d_ff``) and so exactly the same
number of parameters: the heads split ``d_model`` between them (``d_k = d_model / h``).

Symbols: B batch, N tokens, F = 3 features, D model width, H heads.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._checks import as_generator
from .._checks import as_upstream, check_positive_int
from ..core.linear import linear_backward, linear_forward
from ..nn.encoder_block import encoder_block_backward, encoder_block_forward, init_encoder_block_params
from ..nn.optim import Adam

__all__ = [
    "NUM_FEATURES",
    "ToyModelCache",
    "TrainingResult",
    "make_batch",
    "init_toy_model",
    "toy_model_forward",
    "toy_model_backward",
    "mse_loss",
    "train_toy_model",
    "head_pruning_losses",
    "summary_attention",
    "attention_on_targets",
]

NUM_FEATURES = 3  # a, b, value


def make_batch(rng, batch_size, n_positions=8):
    """A batch of the task: ``x`` (B, N, 3) with features ``(a, b, value)``, targets (B, 2).

    ``targets[:, 0]`` is the value at the position with the largest ``a``, ``targets[:, 1]``
    the value at the position with the largest ``b``.
    """
    batch_size = check_positive_int(batch_size, "batch_size")
    n = check_positive_int(n_positions, "n_positions")
    if n < 2:
        raise ValueError(f"n_positions must be at least 2, got {n}")
    levels = np.linspace(0.0, 1.0, n)  # (N,)
    a = rng.permuted(np.broadcast_to(levels, (batch_size, n)), axis=1)  # (B, N)
    b = rng.permuted(np.broadcast_to(levels, (batch_size, n)), axis=1)  # (B, N)
    value = rng.standard_normal((batch_size, n))  # (B, N)
    x = np.stack([a, b, value], axis=-1)  # (B, N, 3)
    rows = np.arange(batch_size)
    targets = np.stack([value[rows, a.argmax(axis=1)], value[rows, b.argmax(axis=1)]], axis=-1)  # (B, 2)
    return x, targets


def init_toy_model(d_model=16, num_heads=2, d_ff=32, *, seed=0):
    """Parameters of the toy model, one flat dict: ``embed.W/b``, ``cls``, ``block.*``
    (an encoder block's parameters), ``readout.W/b``."""
    rng = as_generator(seed)
    p = {"embed.W": rng.standard_normal((NUM_FEATURES, d_model)),
         "embed.b": np.zeros(d_model),
         "cls": rng.standard_normal(d_model)}
    block = init_encoder_block_params(d_model, num_heads, d_ff, seed=rng.integers(2**32))
    p.update({f"block.{k}": v for k, v in block.items()})
    p["readout.W"] = rng.standard_normal((d_model, 2)) / np.sqrt(d_model)
    p["readout.b"] = np.zeros(2)
    return p


class ToyModelCache(NamedTuple):
    """Caches of the embedding, the block and the read-out."""

    embed: object
    block: object
    readout: object
    n_batch: int

    @property
    def weights(self):
        """The block's attention probabilities, (B, H, N+1, N+1); row 0 is the summary token's."""
        return self.block.weights


def toy_model_forward(x, params, num_heads, head_mask=None):
    """Predictions (B, 2) for inputs ``x`` (B, N, 3); returns ``(pred, cache)``."""
    e, embed_cache = linear_forward(x, params["embed.W"], params["embed.b"])  # (B, N, D)
    cls = np.broadcast_to(params["cls"], (e.shape[0], 1, e.shape[-1]))  # (B, 1, D)
    seq = np.concatenate([cls, e], axis=1)  # (B, N+1, D)
    block = {k[len("block."):]: v for k, v in params.items() if k.startswith("block.")}
    z, block_cache = encoder_block_forward(seq, block, num_heads, head_mask=head_mask)  # (B, N+1, D)
    pred, readout_cache = linear_forward(z[:, 0], params["readout.W"], params["readout.b"])  # (B, 2)
    return pred, ToyModelCache(embed_cache, block_cache, readout_cache, e.shape[0])


def toy_model_backward(dpred, cache: ToyModelCache):
    """Gradients of :func:`toy_model_forward`: ``(dx, grads)`` with the keys of ``params``."""
    readout = cache.readout
    dpred = as_upstream(dpred, readout.x.shape[:-1] + (readout.W.shape[1],), readout.x.dtype, "dpred")  # (B, 2)
    grads = {}
    dz0, grads["readout.W"], grads["readout.b"] = linear_backward(dpred, readout)  # (B, D)
    seq_shape = cache.block.attn.norm.x_hat.shape  # (B, N+1, D)
    dz = np.zeros(seq_shape, dz0.dtype)
    dz[:, 0] = dz0  # only the summary token is read out
    dseq, block_grads = encoder_block_backward(dz, cache.block)  # (B, N+1, D)
    grads["cls"] = dseq[:, 0].sum(axis=0)  # (D,), the token was broadcast over the batch
    dx, grads["embed.W"], grads["embed.b"] = linear_backward(dseq[:, 1:], cache.embed)  # (B, N, 3)
    grads.update({f"block.{k}": v for k, v in block_grads.items()})
    return dx, grads


def mse_loss(pred, targets):
    """Mean squared error and its gradient: ``L = mean((pred - t)^2)``, ``dL/dpred = 2 (pred - t) / size``."""
    diff = pred - targets
    return float(np.mean(diff * diff)), 2.0 * diff / diff.size


class TrainingResult(NamedTuple):
    """What :func:`train_toy_model` returns."""

    params: dict
    losses: np.ndarray  # (epochs,), mean training loss of each epoch
    final_loss: float  # loss on the held-out evaluation batch


def train_toy_model(num_heads, *, seed=0, epochs=20, steps_per_epoch=20, batch_size=64,
                    n_positions=8, d_model=16, d_ff=32, lr=0.01, eval_size=1024, progress=None):
    """Train the toy model with Adam and the hand-derived gradients.

    The data, the initial weights and the evaluation batch all come from ``seed`` (None, an int
    or a ``numpy.random.Generator``), so a run with an int seed is deterministic. ``progress(epoch, loss)`` (if given) is called after every epoch.
    The evaluation batch depends only on ``seed`` (not on ``num_heads``), so the single-
    and multi-head models trained with one seed are compared on the same examples.
    """
    rng = as_generator(seed)  # None, an int or a Generator (checked here)
    if isinstance(seed, (int, np.integer)):  # each stream from the seed alone, as the recorded runs
        params = init_toy_model(d_model, num_heads, d_ff, seed=seed)
        data_rng, eval_rng = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 2])
    else:  # a Generator (or None): the evaluation and data streams drawn from it first, then the weights
        eval_rng, data_rng = (np.random.default_rng(int(rng.integers(2**63))) for _ in range(2))
        params = init_toy_model(d_model, num_heads, d_ff, seed=rng)
    x_eval, t_eval = make_batch(eval_rng, eval_size, n_positions)
    opt = Adam(params, lr=lr)
    losses = np.empty(epochs)
    for epoch in range(epochs):  # training is inherently sequential
        total = 0.0
        for _ in range(steps_per_epoch):
            x, t = make_batch(data_rng, batch_size, n_positions)
            pred, cache = toy_model_forward(x, params, num_heads)
            loss, dpred = mse_loss(pred, t)
            _, grads = toy_model_backward(dpred, cache)
            opt.step(grads)
            total += loss
        losses[epoch] = total / steps_per_epoch
        if progress is not None:
            progress(epoch, losses[epoch])
    final = mse_loss(toy_model_forward(x_eval, params, num_heads)[0], t_eval)[0]
    return TrainingResult(params, losses, final)


def head_pruning_losses(params, num_heads, x, targets):
    """Loss with all heads, then with each head masked out in turn (document 000's pruning).

    Returns an array (num_heads + 1,): entry 0 is the full model's loss, entry ``i + 1`` the
    loss with head ``i``'s output multiplied by 0.
    """
    out = [mse_loss(toy_model_forward(x, params, num_heads)[0], targets)[0]]
    for i in range(num_heads):  # one experiment per head
        head_mask = np.ones(num_heads)
        head_mask[i] = 0.0
        out.append(mse_loss(toy_model_forward(x, params, num_heads, head_mask)[0], targets)[0])
    return np.array(out)


def summary_attention(params, num_heads, x):
    """The summary token's attention over the N input tokens, per head: (B, H, N).

    Row 0 of each head's (N+1, N+1) attention matrix, without its first entry (the
    summary token attending to itself).
    """
    _, cache = toy_model_forward(x, params, num_heads)
    return cache.weights[:, :, 0, 1:]  # (B, H, N)


def attention_on_targets(params, num_heads, x):
    """Mean attention each head puts on the two tokens that hold the answers: (H, 2).

    Column 0: the weight on the token with the largest ``a``; column 1: on the token with
    the largest ``b`` (averaged over the batch ``x``).
    """
    w = summary_attention(params, num_heads, x)  # (B, H, N)
    rows = np.arange(x.shape[0])
    on_a = w[rows, :, x[..., 0].argmax(axis=1)]  # (B, H)
    on_b = w[rows, :, x[..., 1].argmax(axis=1)]  # (B, H)
    return np.stack([on_a.mean(axis=0), on_b.mean(axis=0)], axis=-1)  # (H, 2)
