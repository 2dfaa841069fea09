"""What a whole language model is: its family and sizes, read from transformers' ``config.json``.

:class:`LMConfig` holds what the forward needs and nothing of training or serving; it is built
from the dict transformers writes (``LMConfig.from_dict``, which hands it to the reader of its
``model_type``'s family module in :mod:`attention_ref.models.families`), from a transformers
config object (``LMConfig.from_transformers``) or by hand. A setting that would change the maths
and that this package does not implement (a RoPE scaling other than ``llama3`` and ``linear``,
biases in Llama's projections, an activation other than the family's own) is refused with an
error that names it, rather than ignored.

This module knows no family by name: the registry :mod:`attention_ref.models.families` hands
its :class:`attention_ref.models.family.Family` specs to :func:`register_families`, and a
config reads its family's features and rules from there.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

from ..nn.rope_scaling import rope_frequencies, rope_parameters
from .family import check_keys

__all__ = ["LMConfig", "FAMILIES", "LAYER_TYPES", "ROPE_LAYOUTS", "register_families", "family_of", "refuse",
           "check_config_fields"]

#: The model families this package runs whole (transformers' ``model_type``), in the registry's
#: order (:mod:`attention_ref.models.families` fills it).
FAMILIES: tuple = ()
_REGISTRY: dict = {}
#: Gemma's and SmolLM3's two kinds of layer (``layer_types``)
LAYER_TYPES = ("sliding_attention", "full_attention")
GEMMA_LAYER_TYPES = LAYER_TYPES  # its 0.3 name
#: RoPE's two layouts of each head's features: ``"half"`` pairs i and i + Dh/2 (transformers'
#: ``rotate_half``), ``"interleaved"`` pairs 2i and 2i + 1 (Meta's original Llama, GPT-J)
ROPE_LAYOUTS = ("half", "interleaved")
#: The fields a family sets away from their defaults only when its :attr:`Family.allowed` says so
_FAMILY_FIELDS = ("head_dim", "sliding_window", "rope_scaling", "rotary_pct", "use_parallel_residual", "layer_types",
                  "rope_local_theta", "query_pre_attn_scalar", "attn_softcap", "final_softcap", "rope_layers",
                  "rope_layout", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "num_experts",
                  "experts_per_token", "settings")


def register_families(families) -> tuple:
    """Make ``families`` (:class:`attention_ref.models.family.Family` specs) the ones
    :class:`LMConfig` accepts; returns their ``model_type`` s (called once, by the registry)."""
    global FAMILIES
    _REGISTRY.clear()
    _REGISTRY.update({f.model_type: f for f in families})
    FAMILIES = tuple(_REGISTRY)
    return FAMILIES


def family_of(config):
    """The :class:`attention_ref.models.family.Family` of ``config`` (an LMConfig or a ``model_type``)."""
    return _REGISTRY[config if isinstance(config, str) else config.family]


def refuse(what: str, value, family: str):
    """Raise the error of a setting this package does not compute, naming it."""
    raise ValueError(f"{family}: {what} = {value!r} is not supported by attention_ref (it changes the maths"
                     " this package implements); the model cannot be run here")


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


def check_config_fields(d: dict) -> None:
    """The fields ``config.json`` (``d``) gives that its family's reader reads, by type and range (a
    count a positive JSON integer, a flag a JSON boolean, an epsilon a positive number), before the
    reader sees them; one error naming the field (:meth:`LMConfig.from_dict` and the loader call it)."""
    family = _REGISTRY.get(d.get("model_type"))
    if family is None:
        return  # from_dict names an unsupported model_type
    fields = family.fields  # the fields its reader reads, by kind
    for name in fields.positive:
        if name not in d:
            raise ValueError(f"field {name!r} is missing (a positive integer is expected)")
    for name in fields.positive + fields.optional_positive:
        value = d.get(name)
        if (name in d and value is not None or name in fields.positive) and not (
                isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise ValueError(f"field {name!r} must be a positive integer, found {value!r} ({_kind(value)})")
    for name in fields.flags:
        if name in d and not isinstance(d[name], bool):
            raise ValueError(f"field {name!r} must be a JSON boolean (true or false), found {d[name]!r}"
                             f" ({_kind(d[name])})")
    for name in fields.numbers:
        value = d.get(name)
        if name in d and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                              and math.isfinite(value) and value > 0):
            raise ValueError(f"field {name!r} must be a positive number, found {value!r} ({_kind(value)})")
    for name in fields.strings:
        if name in d and not isinstance(d[name], str):
            raise ValueError(f"field {name!r} must be a string, found {d[name]!r} ({_kind(d[name])})")
    for name in ("rope_parameters", "rope_scaling"):
        if d.get(name) is not None and not isinstance(d[name], dict):
            raise ValueError(f"field {name!r} must be an object or null, found {d[name]!r}")
        theta = (d.get(name) or {}).get("rope_theta", 1.0)
        if not (isinstance(theta, (int, float)) and not isinstance(theta, bool) and math.isfinite(theta) and theta > 0):
            raise ValueError(f"field '{name}.rope_theta' must be a positive number, found {theta!r}"
                             f" ({_kind(theta)})")
        factor = (d.get(name) or {}).get("partial_rotary_factor", 1.0)  # GPT-NeoX's rotary_pct in 5.x
        if not (isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0 < factor <= 1):
            raise ValueError(f"field '{name}.partial_rotary_factor' must be a number in (0, 1], found"
                             f" {factor!r} ({_kind(factor)})")
    pad = d.get("pad_token_id")
    if pad is not None and not (isinstance(pad, int) and not isinstance(pad, bool)):
        raise ValueError(f"field 'pad_token_id' must be an integer or null, found {pad!r} ({_kind(pad)})")
    layer_types = d.get("layer_types")
    if layer_types is not None and not (isinstance(layer_types, list) and all(isinstance(t, str) for t in layer_types)):
        raise ValueError(f"field 'layer_types' must be a list of strings or null, found {layer_types!r}")
    if fields.width_heads is not None:
        width, heads = fields.width_heads
        if d[width] % d[heads]:
            raise ValueError(f"field {width!r} = {d[width]} must be a multiple of {heads!r} = {d[heads]}")


@dataclass(frozen=True)
class LMConfig:
    """A language model's family, shape and constants (every family of :data:`FAMILIES`).

    Attributes
    ----------
    family : transformers' ``model_type``, one of :data:`FAMILIES`
    vocab_size, d_model, num_layers, num_heads : V, D, the blocks, H
    num_kv_heads : Hkv, the key/value heads (GPT-2: H)
    d_ff : the MLP's hidden width F
    max_positions : the longest sequence (GPT-2's position table has this many rows)
    eps : the norms' epsilon (GPT-2's ``layer_norm_epsilon``, Llama's ``rms_norm_eps``)
    rope_theta : RoPE's base
    rope_scaling : Llama 3.x's RoPE scaling, the ``rope_type`` (``"llama3"`` or ``"linear"``) and
        its parameters as sorted ``(key, value)`` pairs (a mapping given here is stored so);
        None is plain RoPE. :meth:`rope_frequencies` turns it into the rotation's frequencies.
    head_dim : the head width Dh when it is not ``d_model / num_heads`` (Qwen3-0.6B: 1024 / 16 = 64,
        its heads 128 wide; W_q is then (D, H Dh) and W_o (H Dh, D)); None: ``d_model / num_heads``
    sliding_window : the window W (query ``i`` sees keys ``i - W < j <= i``); None: all
    tie_word_embeddings : the LM head is the token table transposed (GPT-2: True)
    pad_token_id : the embedding row that gets no gradient (transformers' ``padding_idx``)
    scale_attn_weights, scale_attn_by_inverse_layer_idx : GPT-2's attention scaling
        (scores times ``1/sqrt(d_head)``, then times ``1/(layer + 1)``)
    rotary_pct : the rotated fraction of each head (``int(d_head * rotary_pct)`` features, even;
        GPT-NeoX's ``rotary_pct``); 1.0 for the other families
    use_parallel_residual : GPT-NeoX's ``y = x + attn(LN_1(x)) + mlp(LN_2(x))`` (False: sequential)
    layer_types : each layer's kind, ``"sliding_attention"`` (keys within :attr:`sliding_window`;
        Gemma: RoPE base :attr:`rope_local_theta`, no scaling) or ``"full_attention"`` (every
        earlier key, :attr:`rope_theta` and :attr:`rope_scaling`)
    rope_local_theta : Gemma 3's RoPE base of the sliding layers (``rope_local_base_freq``)
    query_pre_attn_scalar : Gemma's scores are scaled by ``query_pre_attn_scalar ** -0.5``
    attn_softcap, final_softcap : Gemma 2's ``attn_logit_softcapping`` (the scaled scores become
        ``cap * tanh(S / cap)`` before the mask) and ``final_logit_softcapping`` (the same on the
        logits); None: no cap
    rope_layers : whether each layer rotates q and k (SmolLM3's ``no_rope_layers``: 1 rotates);
        None: every layer
    rope_layout : ``"half"`` (transformers' ``rotate_half``, the default) or ``"interleaved"``
        (pairs 2i, 2i + 1: Meta's original Llama weights), honoured by the Llama-style block
    num_experts, experts_per_token : a mixture of experts in each block's MLP (gpt-oss's
        ``num_local_experts`` and ``num_experts_per_tok``); None: a dense MLP
    settings : a family's own constants that no other family has, as sorted ``(name, value)``
        pairs (a mapping given here is stored so; a list value as a tuple), read by that family's
        module only (:meth:`setting`) and checked by its ``check``: MLA's ranks, a mixture of
        experts' per-layer plan, a linear-attention layer's sizes
    """

    family: str
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    d_ff: int
    max_positions: int
    eps: float
    rope_theta: float = 10000.0
    rope_scaling: tuple | None = None
    sliding_window: int | None = None
    head_dim: int | None = None
    tie_word_embeddings: bool = True
    pad_token_id: int | None = None
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    rotary_pct: float = 1.0
    use_parallel_residual: bool = True
    layer_types: tuple | None = None
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    rope_layers: tuple | None = None
    rope_layout: str = "half"
    num_experts: int | None = None
    experts_per_token: int | None = None
    settings: tuple = ()

    def __post_init__(self):
        if self.family not in _REGISTRY:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff", "max_positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads = {self.num_kv_heads} must divide num_heads = {self.num_heads}")
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps!r}")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id = {self.pad_token_id} is not a token id in [0, {self.vocab_size})")
        family = _REGISTRY[self.family]
        defaults = {f.name: f.default for f in fields(self)}
        given = [name for name in _FAMILY_FIELDS if name not in family.allowed and getattr(self, name) != defaults[name]]
        if given:
            owners = {name: [m for m, f in _REGISTRY.items() if name in f.allowed] for name in given}
            raise ValueError(f"{self.family}: {', '.join(f'{n} = {getattr(self, n)!r}' for n in given)} is not"
                             f" supported (a {self.family} model has none here; read by {owners})")
        self._check_fields()
        if family.check is not None:
            family.check(self)

    def _check_fields(self):
        """Each optional field's type and range, whatever the family (errors name the field)."""
        for name in ("head_dim", "sliding_window", "num_experts", "experts_per_token"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be None or a positive integer, got {value!r}")
        for name in ("attn_softcap", "final_softcap"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value < float("inf")):
                raise ValueError(f"{name} must be None or a positive number, got {value!r}")
        for name in ("rope_local_theta", "query_pre_attn_scalar"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not value > 0 or value == float("inf")):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if self.layer_types is not None:
            kinds = self.layer_types
            if not isinstance(kinds, (tuple, list)) or len(kinds) != self.num_layers or any(
                    kind not in LAYER_TYPES for kind in kinds):
                raise ValueError(f"layer_types must list one of {LAYER_TYPES} for each of the {self.num_layers}"
                                 f" layers, got {kinds!r}")
            object.__setattr__(self, "layer_types", tuple(kinds))
        if self.rope_layers is not None:
            flags = self.rope_layers
            if not isinstance(flags, (tuple, list)) or len(flags) != self.num_layers or any(
                    not isinstance(f, bool) for f in flags):
                raise ValueError(f"rope_layers must be True or False for each of the {self.num_layers} layers,"
                                 f" got {flags!r}")
            object.__setattr__(self, "rope_layers", tuple(flags))
        if (self.num_experts is None) != (self.experts_per_token is None) or (
                self.num_experts is not None and self.experts_per_token > self.num_experts):
            raise ValueError(f"experts_per_token = {self.experts_per_token!r} must be given with num_experts ="
                             f" {self.num_experts!r} and be at most that many")
        settings = self.settings
        if isinstance(settings, Mapping):
            settings = sorted(settings.items())
        if not isinstance(settings, (tuple, list)) or any(
                not isinstance(pair, (tuple, list)) or len(pair) != 2 or not isinstance(pair[0], str) for pair in settings):
            raise ValueError(f"settings must be a mapping of names to values (or its (name, value) pairs), got {settings!r}")
        object.__setattr__(self, "settings", tuple(sorted((name, tuple(v) if isinstance(v, list) else v)
                                                          for name, v in settings)))
        if self.rope_layout not in ROPE_LAYOUTS:
            raise ValueError(f"rope_layout must be one of {ROPE_LAYOUTS}, got {self.rope_layout!r}")
        if self.rope_scaling is not None:
            scaling = self.rope_scaling
            if isinstance(scaling, Mapping):
                scaling = tuple(sorted(scaling.items()))
            object.__setattr__(self, "rope_scaling", tuple(tuple(pair) for pair in scaling))
            if "rope_theta" in dict(self.rope_scaling) or "partial_rotary_factor" in dict(self.rope_scaling):
                raise ValueError("rope_scaling holds the scaling's type and parameters only: rope_theta is the"
                                 " config's own field, and a partial_rotary_factor is not Llama's")
            self.rope_frequencies()  # refuses an unknown type or a missing parameter, by name

    def setting(self, name: str, default=None):
        """The family's own constant ``name`` (:attr:`settings`), or ``default``."""
        return dict(self.settings).get(name, default)

    @property
    def features(self):
        """What this family's blocks compute (:class:`attention_ref.models.family.Features`)."""
        return _REGISTRY[self.family].features

    def gemma_layers(self):
        """Each layer's ``(theta, window)``: RoPE's frequencies (Dh/2,), float64 (sliding layers:
        base :attr:`rope_local_theta` (or :attr:`rope_theta`), unscaled; global layers:
        :meth:`rope_frequencies`) and its sliding window (None on global layers)."""
        local = rope_frequencies(self.d_head, self.rope_local_theta or self.rope_theta, None)
        full = self.rope_frequencies()
        kinds = self.layer_types or ("full_attention",) * self.num_layers
        return [(local, self.sliding_window) if kind == "sliding_attention" else (full, None) for kind in kinds]

    @property
    def rotary_dim(self) -> int:
        """The rotated features of each head: ``int(d_head * rotary_pct)`` (all of them but for GPT-NeoX)."""
        return int(self.d_head * self.rotary_pct)

    def rope_frequencies(self):
        """RoPE's frequencies ``theta_i`` (r/2,), float64, over the :attr:`rotary_dim` rotated
        features, scaled by :attr:`rope_scaling`
        (:func:`attention_ref.nn.rope_scaling.rope_frequencies`); None for a family without RoPE."""
        if not _REGISTRY[self.family].features.rotary:
            return None
        scaling = None if self.rope_scaling is None else dict(self.rope_scaling)
        if _REGISTRY[self.family].features.rope_attention_factor:  # YaRN's too (its factor: rope_attention_factor)
            return rope_parameters(self.rotary_dim, self.rope_theta, scaling)[0]
        return rope_frequencies(self.rotary_dim, self.rope_theta, scaling)

    def rope_attention_factor(self) -> float:
        """What RoPE's ``cos`` and ``sin`` are multiplied by (YaRN's attention factor; 1.0 for every
        other RoPE, :func:`attention_ref.nn.rope_scaling.rope_parameters`)."""
        scaling = None if self.rope_scaling is None else dict(self.rope_scaling)
        return rope_parameters(self.rotary_dim, self.rope_theta, scaling)[1]

    @property
    def d_head(self) -> int:
        """The head width Dh: :attr:`head_dim`, or ``d_model // num_heads``."""
        return self.head_dim or self.d_model // self.num_heads

    @property
    def head_scale(self):
        """The attention scores' factor of each layer (None: ``1/sqrt(d_head)``)."""
        if self.query_pre_attn_scalar is not None:
            return (float(self.query_pre_attn_scalar) ** -0.5,) * self.num_layers
        if self.scale_attn_weights and not self.scale_attn_by_inverse_layer_idx:
            return (None,) * self.num_layers
        base = (self.d_model // self.num_heads) ** -0.5 if self.scale_attn_weights else 1.0
        return tuple(base / (layer + 1) if self.scale_attn_by_inverse_layer_idx else base
                     for layer in range(self.num_layers))

    @property
    def fused_projections(self) -> bool:
        """The q, k, v projections and the MLP's gate and up are each one fused weight (Phi-3)."""
        return self.features.fused_projections

    @property
    def qkv_bias(self) -> bool:
        """The q, k and v projections have biases (Qwen2)."""
        return self.features.qkv_bias

    @property
    def qk_norm(self):
        """None, or where q and k are RMS-normalised before RoPE: ``"head"`` (each head's, Qwen3;
        Gemma 3 with (1 + w)) or ``"projection"`` (the whole projection, OLMo 2)."""
        return self.features.qk_norm

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_transformers(cls, config) -> "LMConfig":
        """From a transformers config object (``GPT2Config``, ``LlamaConfig``)."""
        return cls.from_dict(config.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "LMConfig":
        """From transformers' ``config.json`` as a dict (4.x and 5.x spellings), read by the
        reader of its ``model_type``'s family module."""
        family = d.get("model_type")
        if family not in _REGISTRY:
            raise ValueError(f"model_type {family!r} is not supported: this package runs {FAMILIES} whole")
        check_config_fields(d)  # each field's type and range, as load_pretrained checks them
        check_keys(d, _REGISTRY[family])  # every key computed, neutral, or refused by name
        return _REGISTRY[family].read(d)
