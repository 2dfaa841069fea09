"""Two optimisers in a few lines each: SGD with momentum, and Adam.

Both work on a dict of parameter arrays (such as a block's ``params``) and a dict of
gradients with the same keys; ``step(grads)`` replaces each ``params[name]`` by a new
array (the old arrays are never modified in place, so a caller holding one keeps its
values). Gradients that have no parameter (``"self_attn.head_mask"``) are ignored, and
so are parameters whose gradient is None. Every other gradient is checked before any
parameter moves: it must have its parameter's shape and a real floating dtype with finite
entries; the update is computed in the parameter's dtype (a float64 gradient does not turn
a float32 parameter into float64; the hyperparameters are Python floats).

* SGD with momentum (PyTorch's form): ``v <- mu v + g``, ``theta <- theta - lr v``.
* Adam (Kingma and Ba, 2015): ``m <- b1 m + (1 - b1) g``, ``s <- b2 s + (1 - b2) g^2``,
  ``theta <- theta - lr m_hat / (sqrt(s_hat) + eps)`` with the bias corrections
  ``m_hat = m / (1 - b1^t)``, ``s_hat = s / (1 - b2^t)``.
"""
from __future__ import annotations

from collections.abc import Mapping, MutableMapping

import numpy as np

__all__ = ["SGD", "Adam"]


def _check_params(params):
    """The parameters must be a mutable dict (updated entry by entry)."""
    if not isinstance(params, MutableMapping):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    return params


def _checked_pairs(params, grads):
    """``[(name, theta, g)]`` for every parameter with a gradient, ``g`` in ``theta``'s dtype.

    Raises ``TypeError`` for a non-floating parameter or gradient and ``ValueError`` for a
    gradient whose shape differs from its parameter's or that holds NaN or infinity.
    """
    if not isinstance(grads, Mapping):
        raise TypeError(f"grads must be a dict of arrays keyed like params, got {type(grads).__name__}")
    pairs = []
    for name, theta in params.items():
        g = grads.get(name)
        if g is None or theta is None:
            continue
        theta = np.asarray(theta)
        if theta.dtype.kind != "f":
            raise TypeError(f"params['{name}'] must be a floating array, got dtype {theta.dtype}")
        g = np.asarray(g)
        if g.dtype.kind != "f":
            raise TypeError(f"grads['{name}'] must be a real floating array, got dtype {g.dtype}")
        if g.shape != theta.shape:
            raise ValueError(f"grads['{name}'] must have the shape {theta.shape} of params['{name}'],"
                             f" got {g.shape}")
        if not np.isfinite(g).all():
            raise ValueError(f"grads['{name}'] contains NaN or infinity")
        pairs.append((name, theta, g.astype(theta.dtype, copy=False)))
    return pairs


def _check_rate(value, name, low=0.0, high=None, *, strict_low=True):
    """A real number in (low, high) (``[low, high)`` when not ``strict_low``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    too_low = value <= low if strict_low else value < low
    if not np.isfinite(value) or too_low or (high is not None and value >= high):
        interval = f"{'(' if strict_low else '['}{low}, {high if high is not None else 'inf'})"
        raise ValueError(f"{name} must lie in {interval}, got {value}")
    return value


class SGD:
    """Stochastic gradient descent with (heavy-ball) momentum ``mu`` (0 for plain SGD)."""

    def __init__(self, params, lr=0.01, momentum=0.0):
        self.params = _check_params(params)
        self.lr = _check_rate(lr, "lr")
        self.momentum = _check_rate(momentum, "momentum", 0.0, 1.0, strict_low=False)
        self.velocity = {}

    def __repr__(self):
        return f"SGD(lr={self.lr}, momentum={self.momentum})"

    def step(self, grads):
        """``v <- mu v + g``, ``theta <- theta - lr v`` for every parameter with a gradient."""
        for name, theta, g in _checked_pairs(self.params, grads):  # all checked before any update
            v = self.momentum * self.velocity.get(name, 0.0) + g
            self.velocity[name] = v
            self.params[name] = theta - self.lr * v


class Adam:
    """Adam with bias-corrected first and second moment estimates."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        self.params = _check_params(params)
        self.lr = _check_rate(lr, "lr")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        self.beta1 = _check_rate(betas[0], "betas[0]", 0.0, 1.0, strict_low=False)
        self.beta2 = _check_rate(betas[1], "betas[1]", 0.0, 1.0, strict_low=False)
        self.eps = _check_rate(eps, "eps")
        self.t = 0
        self.m, self.s = {}, {}

    def __repr__(self):
        return f"Adam(lr={self.lr}, betas=({self.beta1}, {self.beta2}), eps={self.eps})"

    def step(self, grads):
        """One Adam update of every parameter with a gradient."""
        pairs = _checked_pairs(self.params, grads)  # all checked before any update
        self.t += 1
        b1, b2 = self.beta1, self.beta2
        correction1, correction2 = 1.0 - b1 ** self.t, 1.0 - b2 ** self.t
        for name, theta, g in pairs:
            m = b1 * self.m.get(name, 0.0) + (1.0 - b1) * g
            s = b2 * self.s.get(name, 0.0) + (1.0 - b2) * (g * g)
            self.m[name], self.s[name] = m, s
            m_hat, s_hat = m / correction1, s / correction2
            self.params[name] = theta - self.lr * m_hat / (np.sqrt(s_hat) + self.eps)
