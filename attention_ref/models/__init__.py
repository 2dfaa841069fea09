"""Whole language models above the blocks of ``nn``: every family of :data:`FAMILIES` from token
ids to the logits and back, their loss, and generation with one key/value cache per layer.

``config`` (:class:`LMConfig`, read from transformers' ``config.json``), ``family`` (what a family
is: :class:`Family`, its parameter table and features), ``families`` (one module per family: its
reader, parameter table, block steps and hooks; the registry), ``params`` (one flat dict named
like transformers' modules, random initialisation, derived from the families' tables), ``lm``
(the whole model's steps written once: :func:`lm_forward`, :func:`lm_backward`,
:func:`lm_loss`), ``trace`` (:func:`lm_trace`, every module's output by transformers' name;
``trace_steps`` the pieces it reads from the caches),
``gpt2``, ``llama``, ``gpt_neox``, ``phi3``, ``gemma`` (0.3's per-family names,
deprecated aliases), ``logits_processing`` (transformers' logits
processors as pure functions, :func:`left_pad`), ``generate`` (:class:`LMDecoder`, :func:`generate`). May import from ``core``, ``fast``, ``variants`` and ``nn``.
"""
from .families import FAMILIES  # the registry: each family module registers itself with LMConfig
from .config import LMConfig
from .params import block_params, init_lm_params, param_names
from .gpt2 import GPT2LMCache, gpt2_lm_backward, gpt2_lm_forward
from .llama import LlamaLMCache, llama_lm_backward, llama_lm_forward
from .gpt_neox import GPTNeoXLMCache, gpt_neox_lm_backward, gpt_neox_lm_forward
from .phi3 import Phi3LMCache, phi3_lm_backward, phi3_lm_forward
from .gemma import GemmaLMCache, gemma_lm_backward, gemma_lm_forward
from .lm import lm_backward, lm_forward, lm_loss
from .trace import lm_trace, trace_names_4x
from .logits_processing import (apply_min_new_tokens, apply_repetition_penalty, apply_temperature, apply_top_k,
                                apply_top_p, left_pad, process_logits)
from .generate import LMDecoder, generate

__all__ = ["FAMILIES", "LMConfig", "block_params", "init_lm_params", "param_names",
           "GPT2LMCache", "gpt2_lm_backward", "gpt2_lm_forward",
           "LlamaLMCache", "llama_lm_backward", "llama_lm_forward",
           "GPTNeoXLMCache", "gpt_neox_lm_backward", "gpt_neox_lm_forward",
           "Phi3LMCache", "phi3_lm_backward", "phi3_lm_forward",
           "GemmaLMCache", "gemma_lm_backward", "gemma_lm_forward",
           "lm_backward", "lm_forward", "lm_loss", "lm_trace", "trace_names_4x",
           "apply_repetition_penalty", "apply_min_new_tokens", "apply_temperature", "apply_top_k", "apply_top_p",
           "process_logits", "left_pad", "LMDecoder", "generate"]
