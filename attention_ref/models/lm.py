"""One entry for both families: :func:`lm_forward` picks GPT-2 or Llama from the config,
:func:`lm_backward` from the cache, and :func:`lm_loss` adds transformers' ``labels=`` loss
(the next token's cross-entropy) on top."""
from __future__ import annotations

from ..nn.cross_entropy import cross_entropy_backward, cross_entropy_forward, next_token_targets
from .config import GEMMA, LLAMA_LIKE, LMConfig
from .gemma import GemmaLMCache, gemma_lm_backward, gemma_lm_forward
from .gpt2 import GPT2LMCache, gpt2_lm_backward, gpt2_lm_forward
from .llama import LlamaLMCache, llama_lm_backward, llama_lm_forward
from .gpt_neox import GPTNeoXLMCache, gpt_neox_lm_backward, gpt_neox_lm_forward
from .phi3 import Phi3LMCache, phi3_lm_backward, phi3_lm_forward

__all__ = ["lm_forward", "lm_backward", "lm_loss"]

_FORWARD = {"gpt2": gpt2_lm_forward, **dict.fromkeys(LLAMA_LIKE, llama_lm_forward), "gpt_neox": gpt_neox_lm_forward,
            "phi3": phi3_lm_forward, **dict.fromkeys(GEMMA, gemma_lm_forward)}


def lm_forward(ids, params, config: LMConfig, attention_mask=None):
    """Logits (..., T, V) of the config's model for the token ``ids`` (..., T), and the cache
    for :func:`lm_backward` (:func:`attention_ref.models.gpt2_lm_forward` or
    :func:`attention_ref.models.llama_lm_forward`)."""
    if not isinstance(config, LMConfig):
        raise TypeError(f"config must be an LMConfig (attention_ref.LMConfig.from_dict(config.json)),"
                        f" got {type(config).__name__}")
    return _FORWARD[config.family](ids, params, config, attention_mask)


def lm_backward(dlogits, cache):
    """Gradients of :func:`lm_forward`: a dict with the keys and shapes of the params."""
    if isinstance(cache, GPT2LMCache):
        return gpt2_lm_backward(dlogits, cache)
    if isinstance(cache, LlamaLMCache):
        return llama_lm_backward(dlogits, cache)
    if isinstance(cache, GPTNeoXLMCache):
        return gpt_neox_lm_backward(dlogits, cache)
    if isinstance(cache, Phi3LMCache):
        return phi3_lm_backward(dlogits, cache)
    if isinstance(cache, GemmaLMCache):
        return gemma_lm_backward(dlogits, cache)
    raise TypeError(f"cache must be what lm_forward returned, got {type(cache).__name__}")


def lm_loss(ids, params, config: LMConfig, attention_mask=None):
    """Next-token loss and every gradient: ``(loss, grads, logits)``.

    The loss of transformers' ``model(ids, labels=ids)`` (padding left out when an
    ``attention_mask`` is given): the mean cross-entropy of the logits at position n against
    the token at n + 1. ``grads`` is keyed like ``params``.
    """
    logits, cache = lm_forward(ids, params, config, attention_mask)  # (..., T, V)
    targets = next_token_targets(ids, attention_mask)  # (..., T): the next token, or ignored
    loss, loss_cache = cross_entropy_forward(logits, targets)  # ()
    dlogits = cross_entropy_backward(1.0, loss_cache)  # (..., T, V)
    return float(loss), lm_backward(dlogits, cache), logits
