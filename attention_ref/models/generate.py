"""Generation: a prefill, then one token at a time, with one key/value cache per layer.

Symbols: B prompts, T the prompt length (left-padded to one length), V vocabulary.

:class:`LMDecoder` holds the caches and gives the logits of each step; :func:`generate`
picks the tokens from them (greedy at temperature 0, else sampled from the softmax of
``logits / temperature``, optionally over the ``top_k`` largest only).

Prompts of different lengths go as one batch, left-padded (the padding first, as
transformers expects for generation) with an ``attention_mask`` of 0 on the padding: no
query attends to a padding key, and each row's positions count its real tokens only
(``cumsum(attention_mask) - 1``), so a row's tokens do not depend on how much it was padded.
"""
from __future__ import annotations

import numpy as np

from .._checks import check_nonnegative_int, signals_land_here
from .._token_checks import as_attention_mask, as_token_ids
from ..fast.dispatch import linear_formula
from ..nn.encoder_block import ENCODER_GROUPS
from ..nn.gpt2_block import gpt2_decode_formula
from ..nn.layer_norm import layer_norm_formula
from ..nn.llama_block import RotaryHalf, llama_decode_formula
from ..nn.residual import split_params
from ..nn.rms_norm import rms_norm_formula
from ..variants.kv_cache import KVCache
from .config import LMConfig
from .params import TOKEN_TABLE, block_params, check_lm_params, head_weight

__all__ = ["LMDecoder", "generate"]


class LMDecoder:
    """A language model with one :class:`KVCache` per layer: :meth:`prefill` the prompts,
    then :meth:`step` one token per row at a time; each returns the new positions' logits.

    Attributes
    ----------
    caches : list of KVCache, one per layer
    keys_mask : bool (B, T_seen), which of the tokens seen so far are real (not padding)
    positions : int (B,), the position of each row's last token
    """

    def __init__(self, params, config: LMConfig):
        self.params = check_lm_params(params, config)  # checked once: the steps compute on these
        self.config = config
        self.blocks = [block_params(self.params, config, layer) for layer in range(config.num_layers)]
        if config.family == "gpt2":  # the block's groups (ln1, self_attn, ln2, ffn), as its formula takes them
            self.blocks = [split_params(block, ENCODER_GROUPS) for block in self.blocks]
        self.caches = [KVCache() for _ in range(config.num_layers)]
        self.keys_mask = None
        self.positions = None

    def prefill(self, ids, attention_mask=None):
        """Run the prompts ``ids`` (B, T), left-padded where ``attention_mask`` (B, T) is 0.
        Returns the logits (B, T, V) (rows of padding give whatever, they are never read)."""
        if self.keys_mask is not None:
            raise RuntimeError("this decoder has been prefilled already: make a new LMDecoder for new prompts")
        ids, keep = check_prompts(ids, attention_mask, self.config.vocab_size)  # (B, T) each
        positions = np.where(keep, np.cumsum(keep, axis=-1) - 1, 1)  # (B, T): real tokens counted (pads at 1)
        self.keys_mask, self.positions = keep, positions[:, -1]
        return self._run(ids, positions)

    def step(self, next_ids):
        """One new token per row, ``next_ids`` (B,); returns its logits (B, V)."""
        if self.keys_mask is None:
            raise RuntimeError("prefill the prompts first")
        next_ids = as_token_ids(next_ids, "next_ids", self.config.vocab_size)
        if next_ids.shape != self.positions.shape:
            raise ValueError(f"next_ids must have shape {self.positions.shape} (one token per prompt),"
                             f" got {next_ids.shape}")
        self.keys_mask = np.concatenate([self.keys_mask, np.ones((len(next_ids), 1), bool)], axis=1)  # (B, T+1)
        self.positions = self.positions + 1  # (B,)
        return self._run(next_ids[:, None], self.positions[:, None])[:, 0]  # (B, V)

    def _run(self, ids, positions):
        """The new tokens ``ids`` (B, t) at ``positions`` (B, t), both checked, through the model:
        logits (B, t, V). Every array here was checked by :meth:`__init__` or :meth:`prefill`, so
        each step calls the formulas directly."""
        config, params = self.config, self.params
        mask = self.keys_mask[:, None, :]  # (B, 1, T_seen): real keys only, causal added by the blocks
        if mask.all():
            mask = None
        x = params[TOKEN_TABLE[config.family]][ids]  # (B, t, D): the embedding lookup
        if config.family == "gpt2":
            if positions.max() >= config.max_positions:
                raise ValueError(f"position {int(positions.max())} is past GPT-2's max_positions ="
                                 f" {config.max_positions}")
            x = x + params["wpe"][positions]  # (B, t, D)
            for block, cache, scale in zip(self.blocks, self.caches, config.head_scale):
                x = gpt2_decode_formula(x, block, config.num_heads, cache, eps=config.eps, scale=scale,
                                        mask=mask)  # (B, t, D)
            h, _ = layer_norm_formula(x, params["ln_f.gamma"], params["ln_f.beta"], config.eps)  # (B, t, D)
        else:
            at = positions[:, None, :]  # (B, 1, t): the same positions for every head
            rotary = RotaryHalf(at, at, float(config.rope_theta), config.rope_frequencies())
            for block, cache in zip(self.blocks, self.caches):
                x = llama_decode_formula(x, block, config.num_heads, config.num_kv_heads, cache, eps=config.eps,
                                         scale=None, mask=mask, rotary=rotary,
                                         window=config.sliding_window)  # (B, t, D)
            h, _ = rms_norm_formula(x, params["norm.weight"], config.eps)  # (B, t, D)
        return linear_formula(h, head_weight(params, config), None)  # (B, t, V)


def check_prompts(ids, attention_mask, vocab_size):
    """Prompts ``ids`` (B, T), B >= 1 and T >= 1, in the vocabulary, and their ``attention_mask``
    (B, T) of 0/1 with the padding on the left; returns ``(ids, keep)``, ``keep`` boolean."""
    ids = as_token_ids(ids, "ids", vocab_size)
    if ids.ndim != 2 or 0 in ids.shape:
        raise ValueError(f"ids must be prompts (B, T) with B >= 1 and T >= 1, got shape {ids.shape}")
    keep = as_attention_mask(attention_mask, ids.shape)  # (B, T)
    if not keep[:, -1].all():
        rows = np.flatnonzero(~keep[:, -1]).tolist()
        raise ValueError(f"prompts must be left-padded (padding first): the last token of rows {rows} is"
                         " padding in attention_mask")
    return ids, keep


def _pick(logits, temperature, top_k, rng):
    """The next token of each row from its logits (B, V)."""
    if temperature == 0.0:
        return logits.argmax(axis=-1)  # (B,): greedy, the first of equal maxima
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)  # (B, V), max 0
    with np.errstate(over="ignore", under="ignore"):  # a tiny temperature sends the rest to -inf: greedy
        z = shifted / temperature  # (B, V)
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.sort(z, axis=-1)[:, -top_k][:, None]  # (B, 1): the k-th largest
        z = np.where(z >= kth, z, -np.inf)
    with np.errstate(under="ignore"):  # exp of a very negative score is 0, as meant (the user's seterr aside)
        p = np.exp(z - z.max(axis=-1, keepdims=True))  # (B, V)
        p /= p.sum(axis=-1, keepdims=True)  # (B, V)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    u = rng.random((len(p), 1))  # (B, 1)
    return np.minimum((np.cumsum(p, axis=-1) < u).sum(axis=-1), p.shape[-1] - 1)  # (B,): inverse CDF


def generate(ids, params, config: LMConfig, max_new_tokens, attention_mask=None, temperature=0.0, top_k=None,
             seed=None):
    """Continue the prompts ``ids`` (B, T) by ``max_new_tokens`` tokens each.

    Parameters
    ----------
    ids : integer array (B, T) (or (T,) for one prompt), left-padded when the prompts differ
        in length
    params, config : the model (:func:`attention_ref.models.init_lm_params`, or
        :func:`attention_ref.interop.load_pretrained`)
    max_new_tokens : tokens to add to every row (no early stop at an end-of-text token)
    attention_mask : optional (B, T) of 0/1, 0 on the left padding
    temperature : 0 (default) is greedy, the largest logit; above 0, sample from
        ``softmax(logits / temperature)``
    top_k : sample among the ``top_k`` largest logits only (None: all)
    seed : seed of the ``numpy.random.Generator`` that samples (temperature > 0)

    Returns
    -------
    ids : int64 array (B, T + max_new_tokens) ((T + max_new_tokens,) for one prompt): the
        prompts followed by the new tokens
    """
    if not isinstance(config, LMConfig):
        raise TypeError(f"config must be an LMConfig (attention_ref.LMConfig.from_dict(config.json)),"
                        f" got {type(config).__name__}")
    ids = as_token_ids(ids, "ids", config.vocab_size)
    one = ids.ndim == 1  # one prompt (T,)
    if attention_mask is not None and one:
        attention_mask = np.atleast_2d(attention_mask)
    ids, keep = check_prompts(np.atleast_2d(ids) if one else ids, attention_mask, config.vocab_size)  # (B, T)
    max_new_tokens = check_nonnegative_int(max_new_tokens, "max_new_tokens")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.floating, np.integer)) \
            or not temperature >= 0 or not np.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1):
        raise ValueError(f"top_k must be None or a positive integer, got {top_k!r}")
    seed = None if seed is None else check_nonnegative_int(seed, "seed")
    if config.family == "gpt2":  # positions count real tokens only: padding takes none
        real = int(keep.sum(axis=-1).max())
        if real + max_new_tokens > config.max_positions:
            raise ValueError(f"{real} prompt tokens + max_new_tokens = {max_new_tokens} is more than GPT-2's"
                             f" max_positions = {config.max_positions} (its position table has no row past it)")
    decoder = LMDecoder(params, config)  # checks the params, once
    new = []  # one (B,) column per new token: memory for the tokens made, not those asked for
    if max_new_tokens:
        rng = np.random.default_rng(seed)
        logits = decoder.prefill(ids, keep)[:, -1]  # (B, V): the last prompt token's
        for i in range(max_new_tokens):
            new.append(_pick(logits, float(temperature), top_k, rng))  # (B,)
            if i + 1 < max_new_tokens:
                logits = decoder.step(new[-1])  # (B, V)
    out = np.concatenate([ids] + [column[:, None] for column in new], axis=1)  # (B, T + max_new_tokens)
    return out[0] if one else out
