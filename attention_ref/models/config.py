"""What a whole language model is: its family and sizes, read from transformers' ``config.json``.

:class:`LMConfig` holds what the forward needs and nothing of training or serving; it is built
from the dict transformers writes (``LMConfig.from_dict``), from a transformers config object
(``LMConfig.from_transformers``) or by hand. A setting that would change the maths and that
this package does not implement (a RoPE scaling other than ``llama3`` and ``linear``, biases in
Llama's projections, an activation other than GPT-2's tanh GELU or Llama's SiLU) is refused with
an error that names it, rather than ignored.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from ..nn.rope_scaling import ROPE_TYPES, rope_frequencies

__all__ = ["LMConfig", "FAMILIES", "LLAMA_LIKE", "GEMMA", "GPT_NEOX_ACTIVATIONS"]

#: The families built as Llama is (RMSNorm, RoPE, grouped heads, SwiGLU), each adding its own piece:
#: ``qwen2`` biases on the q, k, v projections, ``qwen3`` an RMSNorm over each head's q and k,
#: ``mistral`` sliding-window attention.
LLAMA_LIKE = ("llama", "qwen2", "qwen3", "mistral")
#: Gemma 2 and Gemma 3 (text; transformers' ``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``): (1 + w)
#: RMSNorms before and after each sub-layer, GeGLU, embeddings times sqrt(D), sliding and global
#: layers; Gemma 2 soft-caps its attention scores and final logits, Gemma 3 normalises each head's q and k.
GEMMA = ("gemma2", "gemma3_text")
#: The model families this package runs whole: transformers' ``model_type``.
FAMILIES = ("gpt2",) + LLAMA_LIKE + ("gpt_neox", "phi3") + GEMMA
#: GPT-NeoX's ``hidden_act`` values computed here: the exact (erf) GELU
GPT_NEOX_ACTIVATIONS = ("gelu",)
#: Gemma 3's two kinds of layer (``layer_types``)
GEMMA_LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class LMConfig:
    """A GPT-2 or Llama-like language model's shape and constants.

    Attributes
    ----------
    family : ``"gpt2"`` or one of :data:`LLAMA_LIKE` (transformers' ``model_type``)
    vocab_size, d_model, num_layers, num_heads : V, D, the blocks, H
    num_kv_heads : Hkv, the key/value heads (GPT-2: H)
    d_ff : the MLP's hidden width F
    max_positions : the longest sequence (GPT-2's position table has this many rows)
    eps : the norms' epsilon (GPT-2's ``layer_norm_epsilon``, Llama's ``rms_norm_eps``)
    rope_theta : Llama's RoPE base
    rope_scaling : Llama 3.x's RoPE scaling, the ``rope_type`` (``"llama3"`` or ``"linear"``) and
        its parameters as sorted ``(key, value)`` pairs (a mapping given here is stored so);
        None is plain RoPE. :meth:`rope_frequencies` turns it into the rotation's frequencies.
    head_dim : the head width Dh when it is not ``d_model / num_heads`` (Qwen3-0.6B: 1024 / 16 = 64,
        its heads 128 wide; W_q is then (D, H Dh) and W_o (H Dh, D)); None: ``d_model / num_heads``
    sliding_window : Mistral's window W (query ``i`` sees keys ``i - W < j <= i``); None: all
    tie_word_embeddings : the LM head is the token table transposed (GPT-2: True)
    pad_token_id : Llama's embedding row that gets no gradient (transformers' ``padding_idx``)
    scale_attn_weights, scale_attn_by_inverse_layer_idx : GPT-2's attention scaling
        (scores times ``1/sqrt(d_head)``, then times ``1/(layer + 1)``)
    rotary_pct : GPT-NeoX's rotated fraction of each head (``int(d_head * rotary_pct)`` features,
        even); 1.0 for the other families
    use_parallel_residual : GPT-NeoX's ``y = x + attn(LN_1(x)) + mlp(LN_2(x))`` (False: sequential)
    layer_types : Gemma 3's kind of each layer, ``"sliding_attention"`` (keys within
        :attr:`sliding_window`, RoPE base :attr:`rope_local_theta`, no scaling) or
        ``"full_attention"`` (every earlier key, :attr:`rope_theta` and :attr:`rope_scaling`)
    rope_local_theta : Gemma 3's RoPE base of the sliding layers (``rope_local_base_freq``)
    query_pre_attn_scalar : Gemma's scores are scaled by ``query_pre_attn_scalar ** -0.5``
    attn_softcap, final_softcap : Gemma 2's ``attn_logit_softcapping`` (the scaled scores become
        ``cap * tanh(S / cap)`` before the mask) and ``final_logit_softcapping`` (the same on the
        logits); None: no cap
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

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff", "max_positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads = {self.num_kv_heads} must divide num_heads = {self.num_heads}")
        if self.family == "gpt2" and self.num_kv_heads != self.num_heads:
            raise ValueError("GPT-2 has as many key/value heads as query heads:"
                             f" num_kv_heads = {self.num_kv_heads}, num_heads = {self.num_heads}")
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps!r}")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id = {self.pad_token_id} is not a token id in [0, {self.vocab_size})")
        if self.family == "gpt_neox":
            self._check_gpt_neox()
        elif self.rotary_pct != 1.0 or self.use_parallel_residual is not True:
            raise ValueError(f"rotary_pct and use_parallel_residual are GPT-NeoX's; a {self.family} model keeps"
                             f" 1.0 and True, got {self.rotary_pct!r} and {self.use_parallel_residual!r}")
        if self.head_dim is not None:
            if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) or self.head_dim < 1:
                raise ValueError(f"head_dim must be None or a positive integer, got {self.head_dim!r}")
            if self.family == "gpt2":
                raise ValueError("head_dim is for the Llama-like families; GPT-2's heads are d_model / num_heads wide")
        if self.sliding_window is not None:
            if self.family not in ("mistral", "phi3") + GEMMA:
                raise ValueError(f"sliding_window is Mistral's; a {self.family} model has none here")
            value = self.sliding_window
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"sliding_window must be None or a positive integer, got {value!r}")
        if self.rope_scaling is not None:
            if self.family == "gpt2":
                raise ValueError("rope_scaling is for RoPE; a gpt2 model has none")
            scaling = self.rope_scaling
            if isinstance(scaling, Mapping):
                scaling = tuple(sorted(scaling.items()))
            object.__setattr__(self, "rope_scaling", tuple(tuple(pair) for pair in scaling))
            if "rope_theta" in dict(self.rope_scaling) or "partial_rotary_factor" in dict(self.rope_scaling):
                raise ValueError("rope_scaling holds the scaling's type and parameters only: rope_theta is the"
                                 " config's own field, and a partial_rotary_factor is not Llama's")
            self.rope_frequencies()  # refuses an unknown type or a missing parameter, by name
        self._check_gemma()

    def _check_gemma(self):
        """Gemma 3's fields: all present for ``gemma3_text``, none for another family."""
        fields = ("layer_types", "rope_local_theta", "query_pre_attn_scalar", "attn_softcap", "final_softcap")
        if self.family not in GEMMA:
            given = [name for name in fields if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{given} are Gemma's; a {self.family} model has none here")
            return
        caps = [name for name in fields[3:] if getattr(self, name) is not None]
        if caps and self.family != "gemma2":
            raise ValueError(f"{caps} are Gemma 2's soft caps; a {self.family} model has none here")
        for name in caps:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be None or a positive number, got {value!r}")
        if self.sliding_window is None:
            raise ValueError("a gemma3_text model needs its sliding_window")
        for name in ("rope_local_theta", "query_pre_attn_scalar"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        kinds = self.layer_types
        if not isinstance(kinds, (tuple, list)) or len(kinds) != self.num_layers or any(
                kind not in GEMMA_LAYER_TYPES for kind in kinds):
            raise ValueError(f"layer_types must list one of {GEMMA_LAYER_TYPES} for each of the {self.num_layers}"
                             f" layers, got {kinds!r}")
        object.__setattr__(self, "layer_types", tuple(kinds))

    def gemma_layers(self):
        """Gemma 3: each layer's ``(theta, window)``: RoPE's frequencies (Dh/2,), float64 (sliding
        layers: base :attr:`rope_local_theta`, unscaled; global layers: :meth:`rope_frequencies`)
        and its sliding window (None on global layers)."""
        local = rope_frequencies(self.d_head, self.rope_local_theta, None)
        full = self.rope_frequencies()
        return [(local, self.sliding_window) if kind == "sliding_attention" else (full, None)
                for kind in self.layer_types]

    def _check_gpt_neox(self):
        """GPT-NeoX's own fields: as many key/value heads as heads, D a multiple of H, an even
        rotated width from 2 to d_head, no RoPE scaling, head_dim or window."""
        if self.num_kv_heads != self.num_heads or self.d_model % self.num_heads:
            raise ValueError(f"gpt_neox: num_kv_heads = {self.num_kv_heads} must equal num_heads = {self.num_heads}"
                             f" and d_model = {self.d_model} be a multiple of it")
        for name in ("head_dim", "rope_scaling", "sliding_window"):
            if getattr(self, name) is not None:
                raise ValueError(f"gpt_neox: {name} = {getattr(self, name)!r} is not supported (a gpt_neox model"
                                 " has none here)")
        pct = self.rotary_pct
        if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not 0 < pct <= 1:
            raise ValueError(f"gpt_neox: rotary_pct must be a number in (0, 1], got {pct!r}")
        r = self.rotary_dim
        if r < 2 or r % 2:
            raise ValueError(f"gpt_neox: rotary_pct = {pct} rotates int({self.d_head} * {pct}) = {r} features of"
                             " each head; an even number of at least 2 is needed (RoPE rotates pairs)")
        if not isinstance(self.use_parallel_residual, bool):
            raise ValueError(f"use_parallel_residual must be True or False, got {self.use_parallel_residual!r}")

    @property
    def rotary_dim(self) -> int:
        """The rotated features of each head: ``int(d_head * rotary_pct)`` (all of them but for GPT-NeoX)."""
        return int(self.d_head * self.rotary_pct)

    def rope_frequencies(self):
        """RoPE's frequencies ``theta_i`` (Dh/2,), float64, scaled by :attr:`rope_scaling`
        (:func:`attention_ref.nn.rope_scaling.rope_frequencies`); None for GPT-2. GPT-NeoX:
        (r/2,), ``base^(-2i/r)`` over the :attr:`rotary_dim` rotated features."""
        if self.family == "gpt2":
            return None
        if self.family == "gpt_neox":
            return rope_frequencies(self.rotary_dim, self.rope_theta, None)
        scaling = None if self.rope_scaling is None else dict(self.rope_scaling)
        return rope_frequencies(self.d_head, self.rope_theta, scaling)

    @property
    def d_head(self) -> int:
        """The head width Dh: :attr:`head_dim`, or ``d_model // num_heads``."""
        return self.head_dim or self.d_model // self.num_heads

    @property
    def head_scale(self):
        """The attention scores' factor of each layer (None: ``1/sqrt(d_head)``)."""
        scales = []
        for layer in range(self.num_layers):
            if self.family in GEMMA:
                scales.append(float(self.query_pre_attn_scalar) ** -0.5)
            elif self.family != "gpt2" or (self.scale_attn_weights and not self.scale_attn_by_inverse_layer_idx):
                scales.append(None)
            else:
                d_head = self.d_model // self.num_heads
                base = d_head ** -0.5 if self.scale_attn_weights else 1.0
                scales.append(base / (layer + 1) if self.scale_attn_by_inverse_layer_idx else base)
        return tuple(scales)

    @property
    def fused_projections(self) -> bool:
        """The q, k, v projections and the MLP's gate and up are each one fused weight (Phi-3)."""
        return self.family == "phi3"

    @property
    def qkv_bias(self) -> bool:
        """The q, k and v projections have biases (Qwen2)."""
        return self.family == "qwen2"

    @property
    def qk_norm(self) -> bool:
        """Each head's query and key are RMS-normalised before RoPE (Qwen3; Gemma 3 with (1 + w))."""
        return self.family in ("qwen3", "gemma3_text")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_transformers(cls, config) -> "LMConfig":
        """From a transformers config object (``GPT2Config``, ``LlamaConfig``)."""
        return cls.from_dict(config.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "LMConfig":
        """From transformers' ``config.json`` as a dict (4.x and 5.x spellings)."""
        family = d.get("model_type")
        if family == "gpt2":
            return _gpt2(d)
        if family in LLAMA_LIKE:
            return _llama(d, family)
        if family == "gpt_neox":
            return _gpt_neox(d)
        if family == "phi3":
            return _phi3(d)
        if family == "gemma2":
            return _gemma2(d)
        if family in GEMMA:
            return _gemma3(d, family)
        raise ValueError(f"model_type {family!r} is not supported: this package runs {FAMILIES} whole")


def _refuse(what: str, value, family: str):
    raise ValueError(f"{family}: {what} = {value!r} is not supported by attention_ref (it changes the maths"
                     " this package implements); the model cannot be run here")


def _gpt2(d):
    act = d.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        _refuse("activation_function", act, "gpt2")  # the blocks use the tanh GELU
    if d.get("add_cross_attention"):
        _refuse("add_cross_attention", True, "gpt2")
    D, H = d["n_embd"], d["n_head"]
    return LMConfig(family="gpt2", vocab_size=d["vocab_size"], d_model=D, num_layers=d["n_layer"], num_heads=H,
                    num_kv_heads=H, d_ff=d.get("n_inner") or 4 * D, max_positions=d["n_positions"],
                    eps=d.get("layer_norm_epsilon", 1e-5), tie_word_embeddings=d.get("tie_word_embeddings", True),
                    scale_attn_weights=d.get("scale_attn_weights", True),
                    scale_attn_by_inverse_layer_idx=d.get("scale_attn_by_inverse_layer_idx", False))


def _llama(d, family="llama"):
    if d.get("hidden_act", "silu") != "silu":
        _refuse("hidden_act", d["hidden_act"], family)
    for flag in ("attention_bias", "mlp_bias", "use_sliding_window"):  # Qwen2's sliding window: not here
        if d.get(flag):
            _refuse(flag, True, family)
    layer_types = d.get("layer_types") or []
    if any(kind != "full_attention" for kind in layer_types):
        _refuse("layer_types", sorted(set(layer_types)), family)  # e.g. "sliding_attention" layers
    # RoPE: transformers 4.x writes rope_theta and rope_scaling; 5.x writes rope_parameters
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        _refuse("the RoPE scaling rope_type", rope_type, family)  # e.g. "dynamic", "yarn", "longrope"
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        _refuse("the RoPE partial_rotary_factor", rope["partial_rotary_factor"], family)
    theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
    scaling = None
    if rope_type != "default":  # Llama 3.x: the type and its parameters (any other key is refused by name)
        scaling = {k: v for k, v in rope.items() if k not in ("type", "rope_theta", "partial_rotary_factor")}
        scaling["rope_type"] = rope_type
    D, H = d["hidden_size"], d["num_attention_heads"]
    head_dim = d.get("head_dim") or D // H
    if head_dim * H == D:
        head_dim = None  # the usual width: not stored
    elif head_dim % 2:
        _refuse("head_dim", head_dim, family)  # RoPE rotates pairs
    pad = d.get("pad_token_id")
    if isinstance(pad, int) and -d["vocab_size"] <= pad < 0:
        pad += d["vocab_size"]  # as nn.Embedding's padding_idx: -1 is the last row
    return LMConfig(family=family, vocab_size=d["vocab_size"], d_model=D, num_layers=d["num_hidden_layers"],
                    num_heads=H, num_kv_heads=d.get("num_key_value_heads") or H, d_ff=d["intermediate_size"],
                    max_positions=d.get("max_position_embeddings", 2048), eps=d.get("rms_norm_eps", 1e-6),
                    rope_theta=float(theta), rope_scaling=scaling,
                    sliding_window=d.get("sliding_window") if family in ("mistral", "phi3") else None, head_dim=head_dim,
                    tie_word_embeddings=d.get("tie_word_embeddings", False),
                    pad_token_id=pad if isinstance(pad, int) and 0 <= pad < d["vocab_size"] else None)


def _gpt_neox(d):
    """GPT-NeoX / Pythia: 4.x writes ``rotary_pct``, ``rotary_emb_base`` and ``rope_scaling``; 5.x
    writes ``rope_parameters`` (``rope_theta``, ``partial_rotary_factor``, ``rope_type``)."""
    family = "gpt_neox"
    act = d.get("hidden_act", "gelu")
    if act not in GPT_NEOX_ACTIVATIONS:
        _refuse("hidden_act", act, family)  # e.g. "gelu_new", "gelu_fast", "relu": only the exact GELU here
    if d.get("attention_bias", True) is not True:
        _refuse("attention_bias", d["attention_bias"], family)  # the fused QKV and dense have biases here
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        _refuse("the RoPE scaling rope_type", rope_type, family)  # e.g. "linear", "dynamic"
    extra = sorted(set(rope) - {"rope_type", "type", "rope_theta", "partial_rotary_factor"})
    if extra:
        _refuse("rope parameters", extra, family)
    pct = rope.get("partial_rotary_factor", d.get("rotary_pct", 0.25))
    theta = rope.get("rope_theta", d.get("rotary_emb_base", d.get("rope_theta", 10000.0)))
    D, H = d["hidden_size"], d["num_attention_heads"]
    return LMConfig(family=family, vocab_size=d["vocab_size"], d_model=D, num_layers=d["num_hidden_layers"],
                    num_heads=H, num_kv_heads=H, d_ff=d["intermediate_size"],
                    max_positions=d.get("max_position_embeddings", 2048), eps=d.get("layer_norm_eps", 1e-5),
                    rope_theta=float(theta), tie_word_embeddings=d.get("tie_word_embeddings", False),
                    rotary_pct=float(pct), use_parallel_residual=d.get("use_parallel_residual", True))


def _phi3(d):
    """Phi-3: Llama with fused ``qkv_proj`` and ``gate_up_proj`` (the params keep them fused) and
    Mistral's sliding window (``sliding_window``, Phi-3-mini-4k: 2047). Its 128k models' ``longrope``
    (4.x: ``su``, ``yarn``) and a ``partial_rotary_factor`` other than 1 are refused by name."""
    family = "phi3"
    pct = d.get("partial_rotary_factor", 1.0)  # 4.x: a field of its own; 5.x: in rope_parameters
    if pct != 1.0:
        _refuse("partial_rotary_factor", pct, family)
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        _refuse("the RoPE scaling rope_type", rope_type, family)  # "longrope" (128k models), "su", "yarn"
    return _llama(d, family)
def _gemma3_rope(d, family):
    """``(rope_theta, scaling of the global layers, rope_local_base_freq)`` from transformers 5.x's
    ``rope_parameters`` per layer type or 4.x's ``rope_theta``, ``rope_scaling`` and
    ``rope_local_base_freq``; a type this package does not compute is refused by name."""
    per_type = d.get("rope_parameters") or {}
    if "full_attention" in per_type or "sliding_attention" in per_type:
        full, local = per_type.get("full_attention") or {}, per_type.get("sliding_attention") or {}
        theta, local_theta = full.get("rope_theta", 1_000_000.0), local.get("rope_theta", 10_000.0)
    else:  # 4.x: rope_scaling applies to the global layers, the local ones are plain
        full = d.get("rope_scaling") or per_type or {}
        local = {}
        theta = d.get("rope_theta", full.get("rope_theta", 1_000_000.0))
        local_theta = d.get("rope_local_base_freq", 10_000.0)
    for name, part in (("the global layers' RoPE parameters", full), ("the sliding layers' RoPE parameters", local)):
        if not isinstance(part, Mapping):
            raise ValueError(f"{family}: {name} must be an object, got {part!r}")
    local_type = local.get("rope_type", local.get("type", "default"))
    if local_type != "default":
        _refuse("the sliding layers' RoPE rope_type", local_type, family)
    full_type = full.get("rope_type", full.get("type", "default"))
    if full_type not in ROPE_TYPES:
        _refuse("the RoPE scaling rope_type", full_type, family)  # e.g. "dynamic", "yarn"
    for part in (full, local):
        if part.get("partial_rotary_factor", 1.0) != 1.0:
            _refuse("the RoPE partial_rotary_factor", part["partial_rotary_factor"], family)
    scaling = None
    if full_type != "default":
        scaling = {k: v for k, v in full.items() if k not in ("type", "rope_theta", "partial_rotary_factor")}
        scaling["rope_type"] = full_type
    for name, value in (("rope_theta", theta), ("rope_local_base_freq", local_theta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ValueError(f"{family}: {name} must be a positive number, got {value!r}")
    return float(theta), scaling, float(local_theta)


def _gemma3(d, family="gemma3_text"):
    act = d.get("hidden_activation") or "gelu_pytorch_tanh"  # transformers reads no hidden_act for Gemma 2/3
    if act != "gelu_pytorch_tanh":
        _refuse("hidden_activation", act, family)  # GeGLU's tanh GELU only
    for flag in ("attention_bias", "use_bidirectional_attention"):
        if d.get(flag):
            _refuse(flag, True, family)
    for cap in ("attn_logit_softcapping", "final_logit_softcapping"):  # Gemma 2's soft caps: not Gemma 3's
        if d.get(cap) is not None:
            _refuse(cap, d[cap], family)
    layers = d["num_hidden_layers"]
    kinds = d.get("layer_types")
    if kinds is None:  # as transformers builds them: every pattern-th layer global
        pattern = d.get("sliding_window_pattern", d.get("_sliding_window_pattern", 6))
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise ValueError(f"{family}: sliding_window_pattern must be a positive integer, got {pattern!r}")
        kinds = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    unknown = sorted({str(kind) for kind in kinds} - set(GEMMA_LAYER_TYPES))
    if unknown:
        _refuse("layer_types", unknown, family)
    theta, scaling, local_theta = _gemma3_rope(d, family)
    D, H = d["hidden_size"], d["num_attention_heads"]
    head_dim = d.get("head_dim") or D // H
    if head_dim * H == D:
        head_dim = None
    elif head_dim % 2:
        _refuse("head_dim", head_dim, family)  # RoPE rotates pairs
    scalar = d.get("query_pre_attn_scalar", 256)
    pad = d.get("pad_token_id")
    if isinstance(pad, int) and -d["vocab_size"] <= pad < 0:
        pad += d["vocab_size"]
    return LMConfig(family=family, vocab_size=d["vocab_size"], d_model=D, num_layers=layers, num_heads=H,
                    num_kv_heads=d.get("num_key_value_heads") or H, d_ff=d["intermediate_size"],
                    max_positions=d.get("max_position_embeddings", 131072), eps=d.get("rms_norm_eps", 1e-6),
                    rope_theta=theta, rope_scaling=scaling, sliding_window=d.get("sliding_window", 4096),
                    head_dim=head_dim, tie_word_embeddings=d.get("tie_word_embeddings", True),
                    pad_token_id=pad if isinstance(pad, int) and 0 <= pad < d["vocab_size"] else None,
                    layer_types=tuple(kinds), rope_local_theta=local_theta, query_pre_attn_scalar=scalar)


def _gemma2(d):
    """Gemma 2: Gemma 3's reading (layer types, head_dim, query_pre_attn_scalar) with one RoPE base
    for every layer (no scaling) and the two soft caps."""
    family = "gemma2"
    for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = d.get(cap)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value < float("inf")):
            raise ValueError(f"{family}: {cap} must be null or a positive number, got {value!r}")
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        raise ValueError(f"{family}: rope_parameters must be an object, got {rope!r}")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        _refuse("the RoPE scaling rope_type", rope_type, family)
    theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
    as_gemma3 = {k: v for k, v in d.items() if k not in ("attn_logit_softcapping", "final_logit_softcapping",
                                                          "rope_parameters", "rope_scaling", "rope_theta")}
    as_gemma3.update(rope_theta=theta, rope_local_base_freq=theta)  # one base for both kinds of layer
    if "layer_types" not in d:  # transformers' Gemma 2 alternates, sliding first
        as_gemma3["layer_types"] = ["sliding_attention" if not i % 2 else "full_attention"
                                    for i in range(d["num_hidden_layers"])]
    config = _gemma3(as_gemma3, family)
    return LMConfig(**{**config.to_dict(), "max_positions": d.get("max_position_embeddings", 8192),
                       "attn_softcap": d.get("attn_logit_softcapping"),
                       "final_softcap": d.get("final_logit_softcapping")})
