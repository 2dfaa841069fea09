"""Generation: a prefill, then one token at a time, with one key/value cache per layer.

Symbols: B prompts, T the prompt length (left-padded to one length), V vocabulary.

:class:`LMDecoder` holds the caches and gives the logits of each step; :func:`generate`
passes them through transformers' logits processors (:func:`.logits_processing.process_logits`:
repetition penalty, min_new_tokens, then when sampling temperature, top-k, top-p) and picks
the next tokens from them (greedy: the largest; sampled: from their softmax), stopping a row
at an end-of-text token as transformers does.

Prompts of different lengths go as one batch, left-padded (the padding first, as
transformers expects for generation) with an ``attention_mask`` of 0 on the padding: no
query attends to a padding key, and each row's positions count its real tokens only
(``cumsum(attention_mask) - 1``), so a row's tokens do not depend on how much it was padded.
"""
from __future__ import annotations

import numpy as np

from .._checks import as_generator, check_nonnegative_int, check_positive_int, signals_land_here
from .._token_checks import as_attention_mask, as_token_ids
from ..variants.kv_cache import KVCache
from .config import LMConfig, family_of
from .lm import prepared_blocks, run_steps
from .logits_processing import check_logits_settings, processed_logits
from .params import check_lm_params, head_weight

__all__ = ["LMDecoder", "generate"]

#: :func:`generate` copies a tied LM head into the faster layout (``LMDecoder(copy_head=True)``) when it
#: makes at least this many tokens: the copy took about as long as 15-20 decoding steps save
#: (SmolLM-135M's and Gemma-3-270M's sizes, one thread; docs/performance.md, "Decoding at batch 1")
COPY_HEAD_TOKENS = 32


class LMDecoder:
    """A language model with one :class:`KVCache` per layer: :meth:`prefill` the prompts,
    then :meth:`step` one token per row at a time; each returns the new positions' logits.

    Attributes
    ----------
    caches : list of KVCache, one per layer (a family's own decoding state where its ``new_cache`` says)
    keys_mask : bool (B, T_seen), which of the tokens seen so far are real (not padding)
    positions : int (B,), the position of each row's last token

    ``copy_head`` (default True): keep the LM head as a row-contiguous (D, V) array, which a tied
    head's token table is not, by copying its transpose once (V x D more numbers while the decoder
    lives; a step's ``x @ W`` then reads the faster of BLAS's matrix-vector layouts). The copy costs
    about 15-20 steps' saving, so :func:`generate` asks for it only for :data:`COPY_HEAD_TOKENS`
    new tokens or more; an untied head laid out row-contiguous is never copied. Either way the
    same products (the logits agree to rounding).
    """

    def __init__(self, params, config: LMConfig, *, copy_head=True):
        self.params = check_lm_params(params, config)  # checked once: the steps compute on these
        self.config = config
        self.blocks = prepared_blocks(self.params, config)  # fused weights split once, not at every step
        self.layers = family_of(config).layers(config)  # each layer's RoPE frequencies, window, scale: once
        # the LM head (D, V) with its rows contiguous: a tied token table's transpose is copied once (V x D more
        # numbers held), since a step's x @ W reads a (D, V) row-major matrix faster than the table's transpose
        # (BLAS's two matrix-vector kernels; measured in docs/performance.md, "Decoding at batch 1")
        head = head_weight(self.params, config)
        self.head = _rows_contiguous(head) if copy_head else head
        new_cache = family_of(config).new_cache  # a family's own decoding state (None: keys and values)
        self.caches = [KVCache() if new_cache is None else new_cache(config, i) for i in range(config.num_layers)]
        self.keys_mask = None
        self.positions = None

    def prefill(self, ids, attention_mask=None, *, last_only=False):
        """Run the prompts ``ids`` (B, T), left-padded where ``attention_mask`` (B, T) is 0.
        Returns the logits (B, T, V) (rows of padding give whatever, they are never read), or with
        ``last_only`` those of the last position only (B, V): the final norm and the LM head then
        see one position per row, so the logits take B x V numbers, not B x T x V."""
        if self.keys_mask is not None:
            raise RuntimeError("this decoder has been prefilled already: make a new LMDecoder for new prompts")
        ids, keep = check_prompts(ids, attention_mask, self.config.vocab_size)  # (B, T) each
        positions = np.where(keep, np.cumsum(keep, axis=-1) - 1, 1)  # (B, T): real tokens counted (pads at 1)
        self.keys_mask, self.positions = keep, positions[:, -1]
        if last_only:
            return self._run(ids, positions, last_only=True)[:, 0]  # (B, V)
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

    def _run(self, ids, positions, last_only=False):
        """The new tokens ``ids`` (B, t) at ``positions`` (B, t), both checked, through the model's
        steps (:func:`attention_ref.models.lm.run_steps`, the forward's own, each block with its
        KVCache): logits (B, t, V), or (B, 1, V) of the last position with ``last_only``. Every
        array here was checked by :meth:`__init__` or :meth:`prefill`, so each step calls the
        formulas directly."""
        mask = self.keys_mask[:, None, :]  # (B, 1, T_seen): real keys only, causal added by the blocks
        if mask.all():
            mask = None
        logits, _ = run_steps(ids, positions, self.params, self.config, mask, blocks=self.blocks, layers=self.layers,
                              kv=self.caches, last_only=last_only, head=self.head)
        return logits  # (B, t, V)


def _rows_contiguous(W, block=64):
    """``W`` (D, V) with its rows contiguous (C order): ``W`` itself when it is, else a copy made ``block``
    columns at a time (a tied head is the token table's transpose: each block of table rows is read
    contiguously and written as a narrow column block; about 5x faster than one strided copy)."""
    if W.flags.c_contiguous:
        return W
    out = np.empty(W.shape, W.dtype)  # (D, V)
    for start in range(0, W.shape[1], block):
        out[:, start:start + block] = W[:, start:start + block]
    return out


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


def _next_tokens(processed, do_sample, rng, draw=None):
    """The next token of each row from its processed logits (B, V): the largest (the first of
    equal maxima, as torch's argmax) or, when sampling, a draw from their softmax (``draw``'s, if given)."""
    if not do_sample:
        return processed.argmax(axis=-1)  # (B,)
    z = processed.astype(np.float64)  # (B, V), -inf where a processor removed a token
    if not (z.max(axis=-1) > -np.inf).all():  # nothing to draw from (transformers' multinomial raises too)
        rows = np.flatnonzero(~(z.max(axis=-1) > -np.inf)).tolist()
        raise ValueError(f"no token can be drawn for rows {rows}: the logits processors (repetition_penalty, top_k,"
                         " top_p, min_new_tokens) left every logit at -inf")
    if draw is not None:
        return _drawn(draw(processed), len(z), z.shape[-1])
    with np.errstate(under="ignore"):  # exp of a very negative score is 0, as meant (the user's seterr aside)
        p = np.exp(z - z.max(axis=-1, keepdims=True))  # (B, V)
        p /= p.sum(axis=-1, keepdims=True)  # (B, V)
        signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    u = rng.random((len(p), 1))  # (B, 1)
    return np.minimum((np.cumsum(p, axis=-1) < u).sum(axis=-1), p.shape[-1] - 1)  # (B,): inverse CDF


def _drawn(tokens, rows, vocab_size):
    """The tokens a user's ``draw`` returned, checked: (B,) integers in [0, V)."""
    tokens = np.asarray(tokens)
    if tokens.shape != (rows,) or not np.issubdtype(tokens.dtype, np.integer) or not (
            (tokens >= 0) & (tokens < vocab_size)).all():
        raise ValueError(f"draw must return one token id in [0, {vocab_size}) per row, shape ({rows},), got"
                         f" {tokens.dtype} of shape {tokens.shape}")
    return tokens.astype(np.int64)


def _check_sampling(do_sample, temperature):
    """``(do_sample, temperature)`` resolved: ``do_sample=None`` samples when a temperature > 0
    is given (this package's older calls); ``do_sample=True`` defaults the temperature to 1."""
    if temperature is not None and (isinstance(temperature, (bool, np.bool_))
                                    or not isinstance(temperature, (int, float, np.floating, np.integer))
                                    or not temperature >= 0 or not np.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if do_sample is not None and not isinstance(do_sample, (bool, np.bool_)):
        raise TypeError(f"do_sample must be None, True or False, got {do_sample!r}")
    if do_sample is None:
        do_sample = temperature is not None and temperature > 0
    if do_sample and temperature is not None and temperature == 0:
        raise ValueError("temperature must be > 0 when do_sample=True (temperature 0 is greedy: do_sample=False)")
    return bool(do_sample), 1.0 if temperature is None or not do_sample else float(temperature)


def _check_pad(pad_token_id, eos, vocab_size):
    """The id put after a finished row: ``pad_token_id`` in [0, V), else the first eos id (as
    transformers), else None (no row ever finishes without an eos)."""
    if pad_token_id is None:
        return None if eos is None else int(eos[0])
    pad = check_nonnegative_int(pad_token_id, "pad_token_id")
    if pad >= vocab_size:
        raise ValueError(f"pad_token_id = {pad} is not a token id in [0, {vocab_size})")
    return pad


def generate(ids, params, config: LMConfig, max_new_tokens, attention_mask=None, temperature=None, top_k=None,
             seed=None, *, do_sample=None, top_p=1.0, repetition_penalty=1.0, min_new_tokens=0, eos_token_id=None,
             pad_token_id=None, num_return_sequences=1, draw=None):
    """Continue the prompts ``ids`` (B, T) by up to ``max_new_tokens`` tokens each, as
    transformers' ``model.generate`` does with the same arguments.

    At every step the last position's logits go through transformers' logits processors in
    transformers' order (:func:`attention_ref.models.logits_processing.process_logits`):
    repetition penalty, min_new_tokens, then only when sampling temperature, top-k and top-p;
    the next token is their argmax (greedy) or a draw from their softmax (sampled; each row's
    maximum is subtracted before the temperature, which changes no probability and makes a
    vanishing temperature greedy rather than an overflow). A row that
    has produced one of the ``eos_token_id`` continues with ``pad_token_id``; generation stops
    when every row has finished.

    Parameters
    ----------
    ids : integer array (B, T) (or (T,) for one prompt), left-padded when the prompts differ
        in length (:func:`attention_ref.left_pad`)
    params, config : the model (:func:`attention_ref.models.init_lm_params`, or
        :func:`attention_ref.interop.load_pretrained`)
    max_new_tokens : the most tokens to add to every row
    attention_mask : optional (B, T) of 0/1, 0 on the left padding
    temperature : None or a number >= 0; with ``do_sample=None`` (the default), a temperature
        above 0 samples from ``softmax(logits / temperature)`` and None or 0 is greedy
    top_k : sample among the ``top_k`` largest logits only (None or 0: all; transformers'
        ``generate`` defaults to 50, pass ``top_k=50`` to sample as it does)
    seed : what samples: None (fresh entropy), an integer >= 0 or a ``numpy.random.Generator``
        (used as it is: its state advances)
    do_sample : True samples (temperature 1 unless given), False is greedy whatever the
        temperature, None decides from the temperature (above)
    top_p : nucleus sampling, in [0, 1] (1: off)
    repetition_penalty : > 0 (1: off); every token already in the row (its padding aside) has
        its logit divided by it where positive, multiplied where negative
    min_new_tokens : no eos token before this many new tokens (needs ``eos_token_id``)
    eos_token_id : None, one token id or a list of them: the ends of text
    pad_token_id : the token a finished row continues with (default: the first eos id)
    num_return_sequences : continuations per prompt (> 1 only when sampling), the rows of
        prompt b at ``b * num_return_sequences + j``, as transformers orders them
    draw : optional, when sampling: a callable ``draw(processed_logits (B, V)) -> (B,) token ids``
        used instead of the draw from ``seed``; :func:`attention_ref.interop.torch_draw` draws as
        transformers' ``generate(do_sample=True)`` does (torch's generator and ``torch.multinomial``),
        giving its tokens for the same torch seed

    Returns
    -------
    ids : int64 array (B * num_return_sequences, T + n) ((T + n,) for one prompt and one
        sequence): the prompts followed by the new tokens, n <= max_new_tokens (fewer when
        every row has finished early)
    """
    # every argument checked here, before any work; the loop below trusts them
    if not isinstance(config, LMConfig):
        raise TypeError(f"config must be an LMConfig (attention_ref.LMConfig.from_dict(config.json)),"
                        f" got {type(config).__name__}")
    ids = as_token_ids(ids, "ids", config.vocab_size)
    one = ids.ndim == 1  # one prompt (T,)
    if attention_mask is not None and one:
        attention_mask = np.atleast_2d(attention_mask)
    ids, keep = check_prompts(np.atleast_2d(ids) if one else ids, attention_mask, config.vocab_size)  # (B, T)
    max_new_tokens = check_nonnegative_int(max_new_tokens, "max_new_tokens")
    do_sample, temperature = _check_sampling(do_sample, temperature)
    rng = as_generator(seed)
    if draw is not None and (not callable(draw) or not do_sample or seed is not None):
        raise ValueError("draw must be a callable, given only when sampling (do_sample=True) and without seed (the"
                         f" draw holds its own generator), got draw={draw!r}, do_sample={do_sample}, seed={seed!r}")
    settings = check_logits_settings(config.vocab_size, do_sample=do_sample, temperature=temperature,
                                     top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty,
                                     min_new_tokens=min_new_tokens, eos_token_id=eos_token_id)
    pad = _check_pad(pad_token_id, settings.eos, config.vocab_size)
    if settings.min_new_tokens and settings.eos is not None and np.unique(settings.eos).size == config.vocab_size:
        raise ValueError(f"eos_token_id names all {config.vocab_size} tokens: with min_new_tokens ="
                         f" {settings.min_new_tokens} no token would be left to choose")
    copies = check_positive_int(num_return_sequences, "num_return_sequences")
    if copies > 1 and not do_sample:
        raise ValueError(f"num_return_sequences = {copies} needs sampling (do_sample=True): greedy decoding gives the"
                         " same sequence every time (transformers refuses it too)")
    if not config.features.rotary:  # a position table (GPT-2): positions count real tokens only, padding none
        real = int(keep.sum(axis=-1).max())
        if real + max_new_tokens > config.max_positions:
            raise ValueError(f"{real} prompt tokens + max_new_tokens = {max_new_tokens} is more than GPT-2's"
                             f" max_positions = {config.max_positions} (its position table has no row past it)")
    decoder = LMDecoder(params, config, copy_head=max_new_tokens >= COPY_HEAD_TOKENS)  # checks the params, once
    if copies > 1:  # each prompt `copies` times in a row, as transformers' repeat_interleave
        ids, keep = np.repeat(ids, copies, axis=0), np.repeat(keep, copies, axis=0)  # (B copies, T)
    new = []  # one (B,) column per new token: memory for the tokens made, not those asked for
    if max_new_tokens:
        logits = decoder.prefill(ids, keep, last_only=True)  # (B, V): the last prompt token's
        seen, seen_keep = ids, keep  # (B, T + i): the prompt and the new tokens, for the penalty
        unfinished = np.ones(len(ids), bool)  # (B,)
        for i in range(max_new_tokens):
            processed = processed_logits(logits, seen, seen_keep, i, settings, shift=True)  # (B, V)
            token = _next_tokens(processed, do_sample, rng, draw)  # (B,)
            if settings.eos is not None:  # a finished row continues with the pad token
                token = np.where(unfinished, token, pad)  # (B,)
                unfinished &= ~np.isin(token, settings.eos)
            new.append(token)
            if i + 1 == max_new_tokens or not unfinished.any():
                break
            if settings.penalty != 1.0:  # only the penalty reads the tokens so far
                seen = np.concatenate([seen, token[:, None]], axis=1)  # (B, T + i + 1)
                seen_keep = np.concatenate([seen_keep, np.ones((len(ids), 1), bool)], axis=1)
            logits = decoder.step(token)  # (B, V)
    out = np.concatenate([ids] + [column[:, None] for column in new], axis=1)  # (B, T + len(new))
    return out[0] if one and copies == 1 else out
