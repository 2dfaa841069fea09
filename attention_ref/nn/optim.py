"""Optimisers in a few lines each (SGD with momentum, Adam, AdamW), global-norm gradient
clipping, and the cosine learning-rate schedule with linear warm-up.

The optimisers work on a dict of parameter arrays (such as a block's ``params``) and a dict of
gradients with the same keys; ``step(grads)`` replaces each ``params[name]`` by a new
array (the old arrays are never modified in place, so a caller holding one keeps its
values). Gradients that have no parameter (``"self_attn.head_mask"``) are ignored, and
so are parameters whose gradient is None. Every other gradient is checked before any
parameter moves: it must have its parameter's shape and a real floating dtype with finite
entries; the update is computed in the parameter's dtype (a float64 gradient does not turn
a float32 parameter into float64; the hyperparameters are Python floats). ``lr`` is an
attribute a schedule may set between steps (``opt.lr = cosine_lr_schedule(it, ...)``); it is
checked when set, and 0 is allowed (a warm-up starts there), as in torch.

* SGD with momentum (PyTorch's form): ``v <- mu v + g``, ``theta <- theta - lr v``.
* Adam (Kingma and Ba, 2015): ``m <- b1 m + (1 - b1) g``, ``s <- b2 s + (1 - b2) g^2``,
  ``theta <- theta - lr m_hat / (sqrt(s_hat) + eps)`` with the bias corrections
  ``m_hat = m / (1 - b1^t)``, ``s_hat = s / (1 - b2^t)``.
* AdamW (Loshchilov and Hutter, 2019; ``torch.optim.AdamW``): Adam with the weight decay
  decoupled from the gradient, ``theta <- theta (1 - lr lambda)`` and then Adam's step.
* :func:`clip_grad_norm`: every gradient times ``min(1, max_norm / (||g|| + eps))``, with
  ``||g||`` the L2 norm of all gradients together (``torch.nn.utils.clip_grad_norm_``).
* :func:`cosine_lr_schedule`: linear warm-up to ``max_learning_rate``, a half cosine down to
  ``min_learning_rate``, then constant (Stanford CS336's ``get_lr_cosine_schedule``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping

import numpy as np

from .._checks import check_nonnegative_int

__all__ = ["SGD", "Adam", "AdamW", "clip_grad_norm", "cosine_lr_schedule"]


def _check_params(params):
    """The parameters must be a mutable dict (updated entry by entry)."""
    if not isinstance(params, MutableMapping):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    return params


def _checked_gradient(g, name):
    """``g`` as a real floating array with finite entries, or raise naming ``grads[name]``."""
    g = np.asarray(g)
    if g.dtype.kind != "f":
        raise TypeError(f"grads['{name}'] must be a real floating array, got dtype {g.dtype}")
    if not np.isfinite(g).all():
        raise ValueError(f"grads['{name}'] contains NaN or infinity")
    return g


def _check_grads_dict(grads):
    if not isinstance(grads, Mapping):
        raise TypeError(f"grads must be a dict of arrays keyed like params, got {type(grads).__name__}")
    return grads


def _checked_pairs(params, grads):
    """``[(name, theta, g)]`` for every parameter with a gradient, ``g`` in ``theta``'s dtype.

    Raises ``TypeError`` for a non-floating parameter or gradient and ``ValueError`` for a
    gradient whose shape differs from its parameter's or that holds NaN or infinity.
    """
    grads = _check_grads_dict(grads)
    pairs = []
    for name, theta in params.items():
        g = grads.get(name)
        if g is None or theta is None:
            continue
        theta = np.asarray(theta)
        if theta.dtype.kind != "f":
            raise TypeError(f"params['{name}'] must be a floating array, got dtype {theta.dtype}")
        g = np.asarray(g)
        if g.dtype.kind == "f" and g.shape != theta.shape:
            raise ValueError(f"grads['{name}'] must have the shape {theta.shape} of params['{name}'],"
                             f" got {g.shape}")
        g = _checked_gradient(g, name)
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


class _LearningRate:
    """``lr``, checked whenever it is set (at construction and by a schedule between steps)."""

    @property
    def lr(self) -> float:
        return self._lr

    @lr.setter
    def lr(self, value):
        self._lr = _check_rate(value, "lr", strict_low=False)


class SGD(_LearningRate):
    """Stochastic gradient descent with (heavy-ball) momentum ``mu`` (0 for plain SGD)."""

    def __init__(self, params, lr=0.01, momentum=0.0):
        self.params = _check_params(params)
        self.lr = lr
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


class Adam(_LearningRate):
    """Adam with bias-corrected first and second moment estimates (``torch.optim.Adam``)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        self.params = _check_params(params)
        self.lr = lr
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
        for name, theta, g in pairs:
            m_hat, denominator = self._moments(name, g)
            self.params[name] = theta - self.lr * m_hat / denominator

    def _moments(self, name, g):
        """Move the moments of ``name`` by ``g``; return ``m_hat`` and ``sqrt(s_hat) + eps``."""
        b1, b2 = self.beta1, self.beta2
        m = b1 * self.m.get(name, 0.0) + (1.0 - b1) * g
        s = b2 * self.s.get(name, 0.0) + (1.0 - b2) * (g * g)
        self.m[name], self.s[name] = m, s
        m_hat, s_hat = m / (1.0 - b1 ** self.t), s / (1.0 - b2 ** self.t)
        return m_hat, np.sqrt(s_hat) + self.eps


class AdamW(Adam):
    """Adam with decoupled weight decay ``lambda`` (``weight_decay``), as ``torch.optim.AdamW``:

        ``theta <- theta (1 - lr lambda)``, then ``theta <- theta - lr m_hat / (sqrt(s_hat) + eps)``

    The decay shrinks every parameter that has a gradient (biases and norm weights too, as
    torch does for one parameter group; leave a parameter's gradient out, or None, to spare
    it). Defaults are torch's: ``lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2``.
    (CS336's handout writes the algorithm with the bias corrections folded into the step size,
    ``lr sqrt(1 - b2^t) / (1 - b1^t)``, which amounts to ``eps / sqrt(1 - b2^t)`` in place of
    ``eps`` here, and decays the parameter after the step rather than before; its test accepts
    torch's numbers, which these are.)
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, lr, betas, eps)
        self.weight_decay = _check_rate(weight_decay, "weight_decay", strict_low=False)

    def __repr__(self):
        return (f"AdamW(lr={self.lr}, betas=({self.beta1}, {self.beta2}), eps={self.eps},"
                f" weight_decay={self.weight_decay})")

    def step(self, grads):
        """One AdamW update: the decay, then Adam's step, for every parameter with a gradient."""
        pairs = _checked_pairs(self.params, grads)  # all checked before any update
        self.t += 1
        for name, theta, g in pairs:
            m_hat, denominator = self._moments(name, g)
            decayed = theta * (1.0 - self.lr * self.weight_decay)
            self.params[name] = decayed - self.lr * m_hat / denominator


def clip_grad_norm(grads, max_norm, eps=1e-6):
    """Scale all gradients by one factor so that their global L2 norm is at most ``max_norm``.

    As ``torch.nn.utils.clip_grad_norm_`` computes it, without modifying anything in place:

        ``total_norm = sqrt(sum over every gradient g of sum(g^2))``
        ``clipped[name] = grads[name] * min(1, max_norm / (total_norm + eps))``

    (``eps`` sits in the denominator, so a norm just above ``max_norm`` is left very slightly
    above it, exactly as in torch.) The norm is accumulated in float64, each gradient scaled by
    the largest entry first so no square overflows; each clipped gradient keeps its dtype.

    Parameters
    ----------
    grads : dict name -> array (any shape, real floating, finite) or None (kept as None).
        Every array counts towards the norm: pass the parameters' gradients only (the
        optimisers skip a gradient without a parameter; this function cannot know which).
    max_norm : float > 0
    eps : float >= 0, added to the norm in the denominator (torch's 1e-6)

    Returns
    -------
    clipped : dict with the keys of ``grads``, new arrays (the inputs are never written)
    total_norm : float, the global norm before clipping
    """
    grads = _check_grads_dict(grads)
    checked = {name: None if g is None else _checked_gradient(g, name) for name, g in grads.items()}
    max_norm = _check_rate(max_norm, "max_norm")
    eps = _check_rate(eps, "eps", strict_low=False)
    arrays = [g for g in checked.values() if g is not None and g.size]
    # 1. the global norm: scaled by the largest |entry| s, ||g|| = s sqrt(sum((g / s)^2))
    s = max((float(np.max(np.abs(g))) for g in arrays), default=0.0)
    squares = sum(float(np.sum(np.square(np.divide(g, s, dtype=np.float64)))) for g in arrays) if s else 0.0
    total_norm = s * math.sqrt(squares)
    # 2. one factor for every gradient, never above 1
    coef = min(1.0, max_norm / (total_norm + eps))
    clipped = {name: None if g is None else g * g.dtype.type(coef) for name, g in checked.items()}
    return clipped, total_norm


def cosine_lr_schedule(it, max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters):
    """The learning rate at iteration ``it``: linear warm-up, cosine decay, then constant.

    With ``T_w = warmup_iters`` and ``T_c = cosine_cycle_iters`` (the iteration where the
    decay ends, counted from 0 like ``it``, not the decay's length):

    * ``it < T_w``: ``it / T_w * max_learning_rate`` (0 at ``it = 0``);
    * ``T_w <= it <= T_c``: ``min + (1 + cos(pi (it - T_w) / (T_c - T_w))) / 2 * (max - min)``,
      ``max_learning_rate`` at ``T_w`` down to ``min_learning_rate`` at ``T_c``
      (when ``T_c = T_w`` this segment is the single iteration ``T_w``, at ``max``);
    * ``it > T_c``: ``min_learning_rate``.

    These are the semantics of Stanford CS336's ``get_lr_cosine_schedule(it, max_learning_rate,
    min_learning_rate, warmup_iters, cosine_cycle_iters)``, whose argument names this function
    keeps. Between ``T_w`` and ``T_c`` it is torch's ``CosineAnnealingLR(T_max=T_c - T_w,
    eta_min=min)`` started at ``T_w``. Use it with an optimiser by setting ``opt.lr`` before
    each ``opt.step(grads)``.

    Parameters
    ----------
    it : int >= 0
    max_learning_rate : float >= min_learning_rate
    min_learning_rate : float >= 0
    warmup_iters : int >= 0
    cosine_cycle_iters : int >= warmup_iters

    Returns
    -------
    lr : float
    """
    it = check_nonnegative_int(it, "it")
    warmup_iters = check_nonnegative_int(warmup_iters, "warmup_iters")
    cosine_cycle_iters = check_nonnegative_int(cosine_cycle_iters, "cosine_cycle_iters")
    if cosine_cycle_iters < warmup_iters:
        raise ValueError(f"cosine_cycle_iters must be >= warmup_iters = {warmup_iters} (the iteration where the"
                         f" decay ends, not its length), got {cosine_cycle_iters}")
    min_lr = _check_rate(min_learning_rate, "min_learning_rate", strict_low=False)
    max_lr = _check_rate(max_learning_rate, "max_learning_rate", strict_low=False)
    if max_lr < min_lr:
        raise ValueError(f"max_learning_rate must be >= min_learning_rate = {min_lr}, got {max_lr}")
    if it < warmup_iters:  # 1. linear warm-up from 0
        return it / warmup_iters * max_lr
    if it <= cosine_cycle_iters:  # 2. half a cosine from max down to min
        progress = (it - warmup_iters) / (cosine_cycle_iters - warmup_iters) if cosine_cycle_iters > warmup_iters else 0.0
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)
    return min_lr  # 3. constant after the decay
