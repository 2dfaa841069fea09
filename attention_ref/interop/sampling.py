"""Sampling as transformers samples: the same torch generator and the same draw, so that
:func:`attention_ref.generate` with ``draw=torch_draw(seed)`` gives the tokens of transformers'
``model.generate(..., do_sample=True)`` run after ``torch.manual_seed(seed)``.

transformers' sampled generate (``_sample``, 4.57 and 5.x alike) casts each step's last logits to
float32, runs its logits processors, takes ``softmax`` and draws one token per row with
``torch.multinomial(probs, num_samples=1)`` from torch's global generator. :func:`torch_draw` does
the same on our processed logits with its own ``torch.Generator`` seeded as ``torch.manual_seed``
seeds the global one. NumPy's generator and torch's give different streams: the default draw
(``seed=``, NumPy) is a correct sample from the same distribution, never transformers' tokens.
Needs torch (imported when :func:`torch_draw` is called, never at import).
"""
from __future__ import annotations

import numpy as np

from .._checks import check_nonnegative_int

__all__ = ["torch_draw"]


def torch_draw(seed):
    """A ``draw`` for :func:`attention_ref.generate` that samples as transformers does.

    Parameters
    ----------
    seed : integer >= 0, the torch seed (``torch.manual_seed(seed)`` before transformers'
        ``generate`` gives the same tokens)

    Returns
    -------
    draw : callable ``draw(processed_logits (B, V)) -> (B,) int64``: ``softmax`` of the logits in
        float32, then ``torch.multinomial(probs, 1)`` on a ``torch.Generator`` seeded with ``seed``
        (its state advances with each call: make a new draw for each ``generate``)

    Example: ``ar.generate(ids, params, config, 20, do_sample=True, top_k=50, draw=torch_draw(0))``
    equals ``torch.manual_seed(0); model.generate(ids, do_sample=True, top_k=50, max_new_tokens=20)``.
    """
    seed = check_nonnegative_int(seed, "seed")
    try:
        import torch
    except ImportError:
        raise ImportError("torch_draw needs torch: pip install -e \".[interop]\" (or draw with seed= in NumPy)") \
            from None
    generator = torch.Generator().manual_seed(seed)

    def draw(processed):
        scores = torch.from_numpy(np.ascontiguousarray(processed, dtype=np.float32))  # (B, V), as transformers'
        probs = torch.softmax(scores, dim=-1)  # (B, V)
        return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0].numpy().astype(np.int64)  # (B,)

    return draw
