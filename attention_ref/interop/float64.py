"""transformers' float32 steps inside a float64 model, and how to run them in float64.

A model built with ``.double()`` still computes a few steps in float32 (transformers 4.57
and 5.x), so its outputs agree with a float64 computation only to about 1e-7:

===============================  =================================================  ========================================
step                             what transformers does                             how to compare exactly
===============================  =================================================  ========================================
Llama's RMSNorm                  ``hidden_states.to(torch.float32)``                :func:`llama_in_float64` (same formula)
Llama's RoPE angles              ``inv_freq[...].float() @ position_ids.float()``   :func:`llama_in_float64` (same formula)
eager attention's softmax        ``softmax(..., dtype=torch.float32)`` (Llama)      ``attn_implementation="sdpa"``
the ``labels=`` loss             ``ForCausalLMLoss``: ``logits.float()``            ``cross_entropy`` on the float64 logits
``generate``'s next-token logits cast to float32 before the choice               compare tokens; logits via ``past_key_values``
===============================  =================================================  ========================================

:func:`llama_in_float64` is what this package's tests use; it needs torch and transformers,
which this package never imports otherwise.
"""
from __future__ import annotations

import contextlib

__all__ = ["llama_in_float64"]


def _rope_theta(config) -> float:
    """transformers 4.x: ``config.rope_theta``; 5.x: ``config.rope_parameters["rope_theta"]``."""
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = config.rope_parameters["rope_theta"]
    return float(theta)


@contextlib.contextmanager
def llama_in_float64():
    """Inside the ``with`` block, transformers' ``LlamaRMSNorm`` and ``LlamaRotaryEmbedding``
    compute their float32 steps in the model's dtype with the same formulas; both are restored
    on exit, whatever happens. Default RoPE only: a model with scaled RoPE (``rope_type``
    "llama3", "linear", ...) raises ``ValueError`` in its forward rather than being changed."""
    import torch
    from transformers.models.llama import modeling_llama as m

    def rms_norm(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def rotary(self, x, position_ids):
        rope_type = getattr(self, "rope_type", None) or "default"
        if rope_type != "default":  # its inv_freq is scaled: the default formula would change the model
            raise ValueError(f"llama_in_float64() computes the default RoPE only; this model's rope_type is"
                             f" {rope_type!r} (leave the float32 steps as they are for it)")
        half = self.inv_freq.shape[0]
        inv_freq = 1.0 / _rope_theta(self.config) ** (torch.arange(0, 2 * half, 2, dtype=torch.float64) / (2 * half))
        freqs = position_ids[:, :, None].to(torch.float64) * inv_freq[None, None, :]  # (B, N, Dh/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, N, Dh): rotate-half layout
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    originals = m.LlamaRMSNorm.forward, m.LlamaRotaryEmbedding.forward
    m.LlamaRMSNorm.forward, m.LlamaRotaryEmbedding.forward = rms_norm, rotary
    try:
        yield
    finally:
        m.LlamaRMSNorm.forward, m.LlamaRotaryEmbedding.forward = originals
