"""transformers' float32 steps inside a float64 model, and how to run them in float64.

A model built with ``.double()`` still computes a few steps in float32 (transformers 4.57
and 5.x), so its outputs agree with a float64 computation only to about 1e-7:

===============================  =================================================  ========================================
step                             what transformers does                             how to compare exactly
===============================  =================================================  ========================================
Llama's RMSNorm                  ``hidden_states.to(torch.float32)``                :func:`llama_in_float64` (same formula)
Llama's RoPE angles              ``inv_freq[...].float() @ position_ids.float()``   :func:`llama_in_float64` (same formula)
GPT-NeoX's partial RoPE angles   ``inv_freq`` (r/2,) in float32, ``.float()``       :func:`llama_in_float64` (same formula)
Llama 3.x's scaled ``inv_freq``  ``ROPE_INIT_FUNCTIONS``' ``torch.float`` arange    :func:`llama_in_float64` (its own function,
                                                                                    ``torch.float`` read as float64)
eager attention's softmax        ``softmax(..., dtype=torch.float32)`` (Llama)      ``attn_implementation="sdpa"``
the ``labels=`` loss             ``ForCausalLMLoss``: ``logits.float()``            ``cross_entropy`` on the float64 logits
``generate``'s next-token logits cast to float32 before the choice               compare tokens; logits via ``past_key_values``
Gemma 3's (1 + w) RMSNorm        ``x.float()``, ``1.0 + weight.float()``            :func:`gemma3_in_float64` (same formula)
Gemma 3's RoPE (both kinds)      float32 ``inv_freq`` and angles                    :func:`gemma3_in_float64` (same formula,
                                                                                    default and linear types only)
Gemma 3's ``embed_scale``        a float32 buffer ``sqrt(D)``, cast to the          :func:`gemma3_in_float64`: ``sqrt(D)``
                                 weights' dtype (float32-rounded in float64)        rounded to the weights' dtype
Gemma 2's RMSNorm, RoPE and      as Gemma 3's (5.x: a float32 ``embed_scale``       :func:`gemma2_in_float64` (same formulas)
``embed_scale``                  buffer; 4.57: ``normalizer`` in the hidden dtype)
Gemma 2's eager attention        ``softmax(..., dtype=torch.float32)`` (sdpa has    :func:`gemma2_in_float64`: the same
                                 no soft cap: the tests run eager)                  steps with the softmax in the model's dtype
Qwen3-Next's gated delta rule     ``.to(torch.float32)`` of q, k, v, g, beta in      :func:`qwen3_next_in_float64`: its module's
(recurrent and chunked) and its  ``torch_recurrent_gated_delta_rule`` and            ``torch`` read with ``float32`` and ``float``
gated RMSNorm                    ``torch_chunk_gated_delta_rule``;                  meaning float64 (the formulas untouched)
                                 ``Qwen3NextRMSNormGated``'s ``.to(torch.float32)``
Qwen3-Next's decay ``g``,        ``-A_log.float().exp() * softplus(a.float() + ..)``  :func:`qwen3_next_in_float64`:
(1 + w) RMSNorm, the loss        ``x.float()``, ``1.0 + weight.float()``,           ``Tensor.float()`` of a float64 tensor
                                 ``logits.float()``                                 returns it unchanged (other dtypes as before)
Qwen3-Next's MoE router and      ``softmax(..., dtype=torch.float)``;               the module's ``torch`` as above
eager attention                  ``softmax(..., dtype=torch.float32)``
Qwen3-Next's partial RoPE        float32 ``inv_freq`` (r/2,) and angles             :func:`qwen3_next_in_float64` (same formula)
Qwen3-MoE's router               ``softmax(router_logits, dtype=torch.float)``,     :func:`moe_models_in_float64` (same
                                 the top-k weights cast back                        formula in the model's dtype)
DeepSeek-V3's router             ``F.linear(h.type(torch.float32), W.float())``,    :func:`moe_models_in_float64` (same
                                 its sigmoid and choice in float32                  formula in the model's dtype)
DeepSeek-V3's and Qwen3-MoE's    ``hidden_states.to(torch.float32)`` (as Llama's)   :func:`moe_models_in_float64` (same
RMSNorm                                                                             formula)
BLOOM's ALiBi slopes             ``build_alibi_tensor``: the bases and their powers  :func:`bloom_in_float64` (its own code,
                                 in ``torch.float32``                               ``torch.float32`` read as float64)
BLOOM's attention softmax        ``F.softmax(..., dtype=torch.float32)``            :func:`bloom_in_float64` (the same)
gpt-oss's RMSNorm                ``hidden_states.to(torch.float32)``                :func:`gpt_oss_in_float64` (same formula)
gpt-oss's RoPE angles            ``position_ids.float() * inv_freq.float()``        :func:`gpt_oss_in_float64` (same formula,
                                 (half-width cos and sin times the attention        cos and sin times the same factor)
                                 factor)
gpt-oss's YaRN ``inv_freq``      ``_compute_yarn_parameters``: ``torch.float``      :func:`gpt_oss_in_float64` (its own
                                 powers, a ``torch.float32`` ramp                   function, both read as float64)
DeepSeek-V3's RoPE angles and    as gpt-oss's, full-width cos and sin (each         :func:`deepseek_v3_in_float64` (same
YaRN ``inv_freq``                frequency twice) times the attention factor        formulas; with the router and norms
                                                                                    of :func:`moe_models_in_float64`)
===============================  =================================================  ========================================

gpt-oss's eager attention (the sink column, the softmax in the logits' dtype), its router's softmax
(in the logits' dtype) and its experts run in the model's dtype already: nothing to patch there.

:func:`llama_in_float64` is what this package's tests use; it needs torch and transformers,
which this package never imports otherwise.
"""
from __future__ import annotations

import contextlib

__all__ = ["llama_in_float64", "gemma3_in_float64", "gemma2_in_float64", "qwen3_next_in_float64", "moe_models_in_float64",
           "bloom_in_float64",
           "gpt_oss_in_float64", "deepseek_v3_in_float64"]


@contextlib.contextmanager
def _patched(patches):
    """Each ``(owner, name, new)``: ``owner.name`` is ``new`` inside the block and what it was
    again on exit, whatever happens (the three context managers below are lists of these)."""
    originals = [getattr(owner, name) for owner, name, _ in patches]
    for owner, name, new in patches:
        setattr(owner, name, new)
    try:
        yield
    finally:
        for (owner, name, _), old in zip(patches, originals):
            setattr(owner, name, old)


class _TorchReadingFloat64:
    """``torch`` with each of ``names`` (``"float32"``, ``"float"``) meaning ``torch.float64``: put in
    place of a transformers module's global ``torch``, its float32 steps run in float64 with its own
    code (everything else is ``torch``'s)."""

    def __init__(self, torch, *names):
        self._torch = torch
        for name in names:
            setattr(self, name, torch.float64)

    def __getattr__(self, name):  # only for names not set above
        return getattr(self._torch, name)


def _rope_theta(config) -> float:
    """transformers 4.x: ``config.rope_theta``; 5.x: ``config.rope_parameters["rope_theta"]``."""
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = config.rope_parameters["rope_theta"]
    return float(theta)


@contextlib.contextmanager
def llama_in_float64():
    """Inside the ``with`` block, transformers' ``LlamaRMSNorm`` and ``LlamaRotaryEmbedding`` (and
    the same classes of Qwen2, Qwen3 and Mistral, and ``GPTNeoXRotaryEmbedding``, whose ``inv_freq``
    has r/2 entries for its r rotated features: the same formula with ``2 * half = r``; and
    Phi-3's ``Phi3RMSNorm`` and ``Phi3RotaryEmbedding``)
    compute their float32 steps in the model's dtype with the same formulas; both are restored
    on exit, whatever happens. A scaled RoPE (``rope_type`` "llama3" or "linear") gets its
    ``inv_freq`` from transformers' own ``ROPE_INIT_FUNCTIONS`` run with ``torch.float`` read as
    float64; any other type raises ``ValueError`` in its forward rather than being changed."""
    import torch
    from transformers import modeling_rope_utils as rope_utils

    def scaled_inv_freq(self, rope_type):
        init = rope_utils.ROPE_INIT_FUNCTIONS[rope_type]
        original, rope_utils.torch = rope_utils.torch, _TorchReadingFloat64(torch, "float")
        try:
            inv_freq, attention_factor = init(self.config, None)
        finally:
            rope_utils.torch = original
        if attention_factor != 1.0:
            raise ValueError(f"llama_in_float64(): rope_type {rope_type!r} rescales cos and sin by"
                             f" {attention_factor}; only factor 1 is computed here")
        return inv_freq

    def rms_norm(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def rotary(self, x, position_ids):
        rope_type = getattr(self, "rope_type", None) or "default"
        if rope_type not in ("default", "llama3", "linear"):  # the default formula would change the model
            raise ValueError(f"llama_in_float64() computes the default, llama3 and linear RoPE only; this model's"
                             f" rope_type is {rope_type!r} (leave the float32 steps as they are for it)")
        half = self.inv_freq.shape[0]
        if rope_type == "default":
            inv_freq = 1.0 / _rope_theta(self.config) ** (torch.arange(0, 2 * half, 2, dtype=torch.float64) / (2 * half))
        else:
            inv_freq = scaled_inv_freq(self, rope_type)
        freqs = position_ids[:, :, None].to(torch.float64) * inv_freq[None, None, :]  # (B, N, Dh/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, N, Dh): rotate-half layout
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    import importlib

    from ..models.families import FAMILY

    classes = []  # each family's float32 RMSNorm and RoPE (its module's float32_steps): the same formulas
    for family in FAMILY.values():
        for module, prefix in family.float32_steps:
            found = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
            classes += [getattr(found, f"{prefix}{kind}") for kind in ("RMSNorm", "RotaryEmbedding")
                        if hasattr(found, f"{prefix}{kind}")]  # GPT-NeoX: its partial RoPE only
    with _patched([(cls, "forward", rms_norm if cls.__name__.endswith("RMSNorm") else rotary) for cls in classes]):
        yield


@contextlib.contextmanager
def gemma3_in_float64():
    """Inside the ``with`` block, transformers' ``Gemma3RMSNorm``, ``Gemma3RotaryEmbedding`` and
    ``Gemma3TextScaledWordEmbedding`` compute in the model's dtype with the same formulas
    (transformers 4.57: one rotary module per kind of layer, each with its own config; 5.x: one
    module reading ``rope_parameters[layer_type]``); all three are restored on exit. A RoPE type
    other than default and linear raises ``ValueError`` in its forward rather than being changed."""
    import torch
    from transformers.models.gemma3 import modeling_gemma3 as m

    def rms_norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)

    def rotary(self, x, position_ids, layer_type=None):
        config = self.config
        if layer_type is not None:  # 5.x
            params = config.rope_parameters[layer_type]
            base, rope = params["rope_theta"], params
        else:  # 4.57: this module's own config (the local one has the local base and no scaling)
            base, rope = config.rope_theta, config.rope_scaling or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "linear"):
            raise ValueError(f"gemma3_in_float64() computes the default and linear RoPE only; this model's"
                             f" rope_type is {rope_type!r}")
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        inv_freq = 1.0 / float(base) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        if rope_type == "linear":
            inv_freq = inv_freq / float(rope["factor"])
        freqs = position_ids[:, :, None].to(torch.float64) * inv_freq[None, None, :]  # (B, N, Dh/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, N, Dh): rotate-half layout
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def embed(self, input_ids):
        scale = torch.tensor(self.embedding_dim ** 0.5, dtype=self.weight.dtype)
        return torch.nn.functional.embedding(input_ids, self.weight, self.padding_idx) * scale

    with _patched([(m.Gemma3RMSNorm, "forward", rms_norm), (m.Gemma3RotaryEmbedding, "forward", rotary),
                   (m.Gemma3TextScaledWordEmbedding, "forward", embed)]):
        yield


@contextlib.contextmanager
def gemma2_in_float64():
    """Inside the ``with`` block, transformers' ``Gemma2RMSNorm``, ``Gemma2RotaryEmbedding`` (default
    RoPE only; another type raises), ``Gemma2TextScaledWordEmbedding`` (5.x) and Gemma 2's
    ``eager_attention_forward`` compute in the model's dtype with the same formulas (the
    attention: ``q k^T`` times the scaling, the soft cap ``cap * tanh(S / cap)``, the additive
    mask, the softmax in the model's dtype instead of float32, ``P v``); all restored on exit."""
    import torch
    from transformers.models.gemma2 import modeling_gemma2 as m

    def rms_norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)

    def rotary(self, x, position_ids):
        rope = getattr(self.config, "rope_parameters", None) or getattr(self.config, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"gemma2_in_float64() computes the default RoPE only; this model's rope_type is"
                             f" {rope_type!r}")
        dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
        inv_freq = 1.0 / _rope_theta(self.config) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        freqs = position_ids[:, :, None].to(torch.float64) * inv_freq[None, None, :]  # (B, N, Dh/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def embed(self, input_ids):
        scale = torch.tensor(self.embedding_dim ** 0.5, dtype=self.weight.dtype)
        return torch.nn.functional.embedding(input_ids, self.weight, self.padding_idx) * scale

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs):
        if scaling is None:
            scaling = module.head_dim ** -0.5
        key, value = m.repeat_kv(key, module.num_key_value_groups), m.repeat_kv(value, module.num_key_value_groups)
        weights = torch.matmul(query, key.transpose(2, 3)) * scaling
        if softcap is not None:
            weights = torch.tanh(weights / softcap) * softcap
        if attention_mask is not None:
            weights = weights + attention_mask[:, :, :, : key.shape[-2]]
        weights = torch.nn.functional.softmax(weights, dim=-1)  # in the model's dtype
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    patches = [(m.Gemma2RMSNorm, "forward", rms_norm), (m.Gemma2RotaryEmbedding, "forward", rotary),
               (m, "eager_attention_forward", attention)]
    if hasattr(m, "Gemma2TextScaledWordEmbedding"):  # 5.x; 4.57 casts its normaliser to the hidden dtype already
        patches.append((m.Gemma2TextScaledWordEmbedding, "forward", embed))
    with _patched(patches):
        yield


@contextlib.contextmanager
def moe_models_in_float64():
    """Inside the ``with`` block, the routers of transformers' Qwen3-MoE and DeepSeek-V3 compute in
    the model's dtype with the same formulas (4.57: ``Qwen3MoeSparseMoeBlock``'s router lines and
    ``DeepseekV3TopkRouter.forward``, whose ``get_topk_indices`` is kept; 5.x:
    ``Qwen3MoeTopKRouter.forward`` and ``DeepseekV3TopkRouter.forward``), and so do their RMSNorms
    (``Qwen3MoeRMSNorm``, ``DeepseekV3RMSNorm``); restored on exit. The choice of experts is
    unchanged (the draws of the tests keep it 1e-2 from any tie)."""
    import torch
    import torch.nn.functional as F
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek
    from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen

    def qwen_router(self, hidden_states):  # 5.x
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        logits = F.linear(hidden_states, self.weight)  # (T, E)
        top, idx = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, top, idx

    def qwen_block(self, hidden_states):  # 4.57: the router's lines, then its own loop over the experts
        B, N, D = hidden_states.shape
        flat = hidden_states.view(-1, D)
        logits = self.gate(flat)  # (T, E)
        top, idx = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e in range(self.num_experts):
            t, j = torch.where(idx == e)
            if t.numel():
                out.index_add_(0, t, self.experts[e](flat[t]) * top[t, j, None])
        return out.view(B, N, D), logits

    def deepseek_router_4x(self, hidden_states):
        hidden_states = hidden_states.view(-1, self.config.hidden_size)
        scores = F.linear(hidden_states, self.weight).sigmoid()  # (T, E)
        idx = self.get_topk_indices(scores)
        w = scores.gather(1, idx)
        if self.norm_topk_prob:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return idx, w * self.routed_scaling_factor

    def deepseek_router_5x(self, hidden_states):
        hidden_states = hidden_states.view(-1, self.hidden_dim)
        logits = F.linear(hidden_states, self.weight)  # (T, E)
        scores = logits.sigmoid()
        choice = scores + self.e_score_correction_bias
        E, G = self.num_experts, self.num_group
        groups = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)  # (T, G)
        kept = torch.zeros_like(groups).scatter_(1, torch.topk(groups, k=self.topk_group, dim=-1)[1], 1)
        keep = kept.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
        idx = torch.topk(choice.masked_fill(~keep, float("-inf")), k=self.top_k, dim=-1)[1]
        w = scores.gather(1, idx)
        if self.norm_topk_prob:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return logits, w * self.routed_scaling_factor, idx

    def rms_norm(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    norms = [(qwen.Qwen3MoeRMSNorm, "forward", rms_norm), (deepseek.DeepseekV3RMSNorm, "forward", rms_norm)]
    if hasattr(qwen, "Qwen3MoeTopKRouter"):
        patches = [(qwen.Qwen3MoeTopKRouter, "forward", qwen_router),
                   (deepseek.DeepseekV3TopkRouter, "forward", deepseek_router_5x)]
    else:
        patches = [(qwen.Qwen3MoeSparseMoeBlock, "forward", qwen_block),
                   (deepseek.DeepseekV3TopkRouter, "forward", deepseek_router_4x)]
    with _patched(patches + norms):
        yield


@contextlib.contextmanager
def qwen3_next_in_float64():
    """Inside the ``with`` block, transformers' ``qwen3_next`` module computes its float32 steps in float64
    with the same formulas (4.57.1 and 5.x); everything is restored on exit, whatever happens:

    * the module's global ``torch`` is a proxy whose ``float32`` and ``float`` are ``torch.float64`` (the
      gated delta rule's casts, the gated RMSNorm's, the router's and eager attention's softmax dtype);
    * ``torch.Tensor.float`` returns a float64 tensor unchanged (the decay ``g``'s ``A_log.float()`` and
      ``a.float()``, the (1 + w) RMSNorm, the loss's ``logits.float()``); on any other dtype it is the
      original method;
    * ``Qwen3NextRotaryEmbedding.forward`` computes its partial RoPE's ``inv_freq`` (r/2 entries for r
      rotated features) and angles in float64 (default RoPE only; another type raises ``ValueError``).
    """
    import torch
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    original_float = torch.Tensor.float

    def tensor_float(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else original_float(self, *args, **kwargs)

    def rotary(self, x, position_ids):
        rope = getattr(self.config, "rope_parameters", None) or getattr(self.config, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"qwen3_next_in_float64() computes the default RoPE only; this model's rope_type is"
                             f" {rope_type!r}")
        half = self.inv_freq.shape[0]
        inv_freq = 1.0 / _rope_theta(self.config) ** (torch.arange(0, 2 * half, 2, dtype=torch.float64) / (2 * half))
        freqs = position_ids[:, :, None].to(torch.float64) * inv_freq[None, None, :]  # (B, N, r/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, N, r): rotate-half layout
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    proxy = _TorchReadingFloat64(torch, "float32", "float")
    with _patched([(m, "torch", proxy), (torch.Tensor, "float", tensor_float),
                   (m.Qwen3NextRotaryEmbedding, "forward", rotary)]):
        yield


@contextlib.contextmanager
def bloom_in_float64():
    """Inside the ``with`` block, transformers' ``modeling_bloom`` reads ``torch.float32`` as
    float64: its ALiBi slopes (``build_alibi_tensor``'s bases and powers) and its attention's
    softmax (``dtype=torch.float32``) run in float64 with its own code, nothing else changed (the
    module's ``torch`` is a proxy that differs from ``torch`` in that one name); restored on exit."""
    import torch
    from transformers.models.bloom import modeling_bloom as m

    with _patched([(m, "torch", _TorchReadingFloat64(torch, "float32"))]):
        yield


@contextlib.contextmanager
def gpt_oss_in_float64():
    """Inside the ``with`` block, transformers' ``GptOssRMSNorm`` and ``GptOssRotaryEmbedding``
    compute in the model's dtype with the same formulas: the norm without its float32 cast; the
    RoPE angles ``position * inv_freq`` in float64, ``inv_freq`` from transformers' own
    ``ROPE_INIT_FUNCTIONS[rope_type]`` (YaRN's) run with ``torch.float`` and ``torch.float32`` read
    as float64 (the default type: ``base^(-2i/d)`` in float64), and the half-width ``cos`` and
    ``sin`` times the module's ``attention_scaling``, as transformers' forward. Both restored on exit."""
    import torch
    from transformers.models.gpt_oss import modeling_gpt_oss as m

    def rms_norm(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def rotary(self, x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * _inv_freq_float64(self)  # (B, N, Dh/2)
        cos, sin = freqs.cos() * self.attention_scaling, freqs.sin() * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)

    with _patched([(m.GptOssRMSNorm, "forward", rms_norm), (m.GptOssRotaryEmbedding, "forward", rotary)]):
        yield


def _inv_freq_float64(rotary):
    """A rotary module's ``inv_freq`` in float64: ``base^(-2i/d)`` over its config's ``head_dim``
    (the default type), else transformers' own ``ROPE_INIT_FUNCTIONS[rope_type]`` (YaRN's) run with
    ``torch.float`` and ``torch.float32`` read as float64."""
    import torch
    from transformers import modeling_rope_utils as rope_utils

    rope_type = getattr(rotary, "rope_type", None) or "default"
    config = rotary.config
    if rope_type == "default":
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return 1.0 / _rope_theta(config) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    original, rope_utils.torch = rope_utils.torch, _TorchReadingFloat64(torch, "float", "float32")
    try:
        inv_freq, _ = rope_utils.ROPE_INIT_FUNCTIONS[rope_type](config, None)
    finally:
        rope_utils.torch = original
    return inv_freq.to(torch.float64)


@contextlib.contextmanager
def deepseek_v3_in_float64():
    """Inside the ``with`` block, transformers' DeepSeek-V3 computes its float32 steps in float64 with
    the same formulas: the router and the RMSNorms as :func:`moe_models_in_float64`, and
    ``DeepseekV3RotaryEmbedding``'s angles ``position * inv_freq`` in float64 (``inv_freq`` over
    ``qk_rope_head_dim`` features, YaRN's from transformers' own function, as gpt-oss's), the
    full-width ``cos`` and ``sin`` (each frequency twice) times the module's ``attention_scaling``,
    as its forward; restored on exit."""
    import torch
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    def rotary(self, x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * _inv_freq_float64(self)  # (B, N, dr/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, N, dr)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)

    with moe_models_in_float64(), _patched([(m.DeepseekV3RotaryEmbedding, "forward", rotary)]):
        yield
