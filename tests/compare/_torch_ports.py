"""Small PyTorch ports of GPT-2, Llama, Gemma 2, GPT-NeoX and Phi-3, written from the papers'
formulas in plain torch (not transformers' code), with transformers' parameter names, and each of
the catalogue's layer- and model-level porting mistakes available as a flag (``mistakes={...}``).

``mistakes=()`` is the correct port the tests check ``compare.module`` / ``compare.model`` accept;
each flag plants one real mistake of ``docs/compare.md``. Only for tests (needs torch).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn


def settings(cfg: dict) -> dict:
    """What the ports read from config.json, by family."""
    f = cfg["model_type"]
    if f == "gpt2":
        D, H = cfg["n_embd"], cfg["n_head"]
        return dict(family=f, D=D, H=H, Hkv=H, Dh=D // H, F=cfg.get("n_inner") or 4 * D, L=cfg["n_layer"],
                    eps=cfg.get("layer_norm_epsilon", 1e-5), act=cfg.get("activation_function", "gelu_new"),
                    V=cfg["vocab_size"], rotary=0, theta=None, tie=cfg.get("tie_word_embeddings", True))
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    Dh = cfg.get("head_dim") or D // H
    s = dict(family=f, D=D, H=H, Hkv=cfg.get("num_key_value_heads") or H, Dh=Dh, F=cfg["intermediate_size"],
             L=cfg["num_hidden_layers"], V=cfg["vocab_size"], tie=cfg.get("tie_word_embeddings", False))
    if f == "gpt_neox":
        s.update(eps=cfg["layer_norm_eps"], act=cfg["hidden_act"], theta=float(cfg["rotary_emb_base"]),
                 rotary=int(Dh * cfg["rotary_pct"]), parallel=cfg.get("use_parallel_residual", True))
    else:
        s.update(eps=cfg["rms_norm_eps"], theta=float(cfg.get("rope_theta", 10000.0)), rotary=Dh,
                 act=cfg.get("hidden_activation") or cfg.get("hidden_act", "silu"))
    if f == "gemma2":
        s.update(scale=cfg["query_pre_attn_scalar"] ** -0.5, softcap=cfg["attn_logit_softcapping"],
                 final_softcap=cfg["final_logit_softcapping"], window=cfg["sliding_window"],
                 layer_types=cfg["layer_types"], tie=cfg.get("tie_word_embeddings", True))
    return s


class Conv1D(nn.Module):
    """GPT-2's linear layer: weight (in, out)."""

    def __init__(self, n_in, n_out, transposed=False):
        super().__init__()
        self.transposed = transposed  # the mistake: used as a Linear weight (out, in)
        self.weight = nn.Parameter(torch.zeros(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return (x @ self.weight.T if self.transposed else x @ self.weight) + self.bias


def activation(name, mistakes):
    if "gelu_variant" in mistakes:
        name = {"gelu": "gelu_new", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu"}[name]
    if name == "silu":
        return nn.functional.silu
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: nn.functional.gelu(x, approximate="tanh")
    return nn.functional.gelu


class RMSNorm(nn.Module):
    def __init__(self, D, eps, gemma, mistakes=()):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(D) if gemma else torch.ones(D))
        self.eps = 1e-5 if "rms_norm_eps" in mistakes else eps
        self.offset = float(gemma) if "norm_offset" not in mistakes else 1.0 - float(gemma)

    def forward(self, x):
        x_hat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x_hat * (self.offset + self.weight)


def norm(s, mistakes=()):
    if s["family"] in ("gpt2", "gpt_neox"):
        return nn.LayerNorm(s["D"], eps=1e-6 if "rms_norm_eps" in mistakes else s["eps"])
    return RMSNorm(s["D"], s["eps"], s["family"] == "gemma2", mistakes)


def rope(x, positions, theta, rotary, interleaved):
    """x (B, H, T, Dh) rotated at positions (B, T) over its first ``rotary`` features."""
    inv = 1.0 / theta ** (torch.arange(0, rotary, 2, dtype=torch.float64) / rotary)
    angle = positions[:, None, :, None].double() * inv  # (B, 1, T, r/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    turn, keep = x[..., :rotary], x[..., rotary:]
    if interleaved:
        a, b = turn[..., 0::2], turn[..., 1::2]
        turned = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    else:
        a, b = turn[..., :rotary // 2], turn[..., rotary // 2:]
        turned = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    return torch.cat([turned, keep], dim=-1)


class Attention(nn.Module):
    """Causal self-attention, ``forward(x, positions, attention_mask)``, transformers' names."""

    def __init__(self, cfg, layer=0, mistakes=()):
        super().__init__()
        s = self.s = settings(cfg)
        self.mistakes = set(mistakes)
        D, H, Hkv = s["D"], s["H"], s["Hkv"]
        Dh = D // H if "head_dim" in mistakes else s["Dh"]
        self.Dh = Dh
        f = s["family"]
        bias = "qkv_bias_missing" not in mistakes
        if f == "gpt2":
            self.c_attn = Conv1D(D, 3 * D) if bias else nn.Linear(D, 3 * D, bias=False)
            if not bias:  # a Linear without bias, read as Conv1D's (in, out) layout
                self.c_attn.weight = nn.Parameter(torch.zeros(D, 3 * D))
            self.c_proj = Conv1D(D, D, transposed="conv1d_transpose" in mistakes)
        elif f == "gpt_neox":
            self.query_key_value = nn.Linear(D, 3 * D, bias=bias)
            self.dense = nn.Linear(D, D)
        elif f == "phi3":
            self.qkv_proj = nn.Linear(D, (H + 2 * Hkv) * Dh, bias=False)
            self.o_proj = nn.Linear(H * Dh, D, bias=False)
        else:
            self.q_proj = nn.Linear(D, H * Dh, bias=False)
            self.k_proj = nn.Linear(D, Hkv * Dh, bias=False)
            self.v_proj = nn.Linear(D, Hkv * Dh, bias=False)
            self.o_proj = nn.Linear(H * Dh, D, bias=False)
        self.window = None
        if f == "gemma2" and s["layer_types"][layer] == "sliding_attention":
            self.window = s["window"]
        if "window_wrong_layers" in mistakes:
            self.window = None if self.window is not None else s.get("window")
        if "window_off_by_one" in mistakes and self.window is not None:
            self.window += 1

    def forward(self, x, positions, attention_mask=None):
        s, m, Dh = self.s, self.mistakes, self.Dh
        B, T, _ = x.shape
        H, Hkv, f = s["H"], s["Hkv"], s["family"]
        if f == "gpt2":
            q, k, v = self.c_attn(x).split(s["D"], dim=-1)
        elif f == "gpt_neox":
            qkv = self.query_key_value(x)
            if "fused_qkv_split" in m:
                q, k, v = qkv.chunk(3, dim=-1)
            else:
                q, k, v = qkv.view(B, T, H, 3 * Dh).split(Dh, dim=-1)
                q, k, v = (t.reshape(B, T, H * Dh) for t in (q, k, v))
        elif f == "phi3":
            q, k, v = self.qkv_proj(x).split([H * Dh, Hkv * Dh, Hkv * Dh], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(B, T, H, Dh).transpose(1, 2)
        k = k.view(B, T, Hkv, Dh).transpose(1, 2)
        v = v.view(B, T, Hkv, Dh).transpose(1, 2)
        if s["rotary"]:
            at = positions
            if "rope_position_offset" in m:
                at = torch.arange(T).expand(B, T)
            theta = 500000.0 if "rope_theta" in m else s["theta"]
            rotary = Dh if "partial_rotary" in m else s["rotary"]
            q = rope(q, at, theta, rotary, "rope_layout" in m)
            k = rope(k, at, theta, rotary, "rope_layout" in m)
        if Hkv < H:
            if "gqa_head_order" in m:
                k, v = k.repeat(1, H // Hkv, 1, 1), v.repeat(1, H // Hkv, 1, 1)
            else:
                k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
        scale = s.get("scale", Dh ** -0.5)
        if "attention_scale" in m:
            scale = s["D"] ** -0.5
        scores = torch.einsum("bhid,bhjd->bhij", q, k) * scale
        if s.get("softcap") and "softcap_missing" not in m:
            scores = s["softcap"] * torch.tanh(scores / s["softcap"])
        i = torch.arange(T)[:, None]
        j = torch.arange(T)[None, :]
        allowed = (j <= i)
        if self.window is not None:
            allowed = allowed & (j > i - self.window)
        allowed = allowed[None, None].expand(B, 1, T, T)
        if attention_mask is not None and "padding_ignored" not in m:
            allowed = allowed & attention_mask[:, None, None, :].bool()
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        out = torch.softmax(scores, dim=-1) @ v  # (B, H, T, Dh)
        out = out.transpose(1, 2).reshape(B, T, H * Dh)
        if f == "gpt2":
            return self.c_proj(out)
        if f == "gpt_neox":
            return self.dense(out)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg, mistakes=()):
        super().__init__()
        s = self.s = settings(cfg)
        self.mistakes = set(mistakes)
        D, F, f = s["D"], s["F"], s["family"]
        self.act = activation(s["act"], mistakes)
        if f == "gpt2":
            if "conv1d_transpose_mlp" in mistakes:  # Linear layers: (out, in), the checkpoint's (in, out) refused
                self.c_fc, self.c_proj = nn.Linear(D, F), nn.Linear(F, D)
            else:
                self.c_fc, self.c_proj = Conv1D(D, F), Conv1D(F, D)
        elif f == "gpt_neox":
            self.dense_h_to_4h, self.dense_4h_to_h = nn.Linear(D, F), nn.Linear(F, D)
        elif f == "phi3":
            self.gate_up_proj = nn.Linear(D, 2 * F, bias=False)
            self.down_proj = nn.Linear(F, D, bias=False)
        else:
            self.gate_proj = nn.Linear(D, F, bias=False)
            self.up_proj = nn.Linear(D, F, bias=False)
            self.down_proj = nn.Linear(F, D, bias=False)

    def forward(self, x):
        f = self.s["family"]
        if f == "gpt2":
            return self.c_proj(self.act(self.c_fc(x)))
        if f == "gpt_neox":
            return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x)))
        if f == "phi3":
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        if "gate_up_swapped" in self.mistakes:
            gate, up = up, gate
        return self.down_proj(self.act(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer=0, mistakes=()):
        super().__init__()
        s = self.s = settings(cfg)
        self.mistakes = set(mistakes)
        f = s["family"]
        if f == "gpt2":
            self.ln_1, self.attn = norm(s, mistakes), Attention(cfg, layer, mistakes)
            self.ln_2, self.mlp = norm(s, mistakes), MLP(cfg, mistakes)
            return
        self.input_layernorm = norm(s, mistakes)
        if f == "gpt_neox":
            self.attention = Attention(cfg, layer, mistakes)
        else:
            self.self_attn = Attention(cfg, layer, mistakes)
        self.post_attention_layernorm = norm(s, mistakes)
        if f == "gemma2":
            self.pre_feedforward_layernorm = norm(s, mistakes)
            self.post_feedforward_layernorm = norm(s, mistakes)
        self.mlp = MLP(cfg, mistakes)

    def forward(self, x, positions, attention_mask=None):
        f, m = self.s["family"], self.mistakes
        if f == "gpt2":
            h = x + self.attn(self.ln_1(x), positions, attention_mask)
            return h + self.mlp(self.ln_2(h))
        if f == "gpt_neox":
            a = self.attention(self.input_layernorm(x), positions, attention_mask)
            parallel = self.s["parallel"] != ("parallel_residual" in m)
            if parallel:
                return x + a + self.mlp(self.post_attention_layernorm(x))
            h = x + a
            return h + self.mlp(self.post_attention_layernorm(h))
        a = self.self_attn(self.input_layernorm(x), positions, attention_mask)
        if f == "gemma2":
            if "post_norm_missing" not in m:
                a = self.post_attention_layernorm(a)
            h = x + a
            out = self.mlp(self.pre_feedforward_layernorm(h))
            if "post_norm_missing" not in m:
                out = self.post_feedforward_layernorm(out)
            return h + out
        h = x + a
        return h + self.mlp(self.post_attention_layernorm(h))


class Base(nn.Module):
    def __init__(self, cfg, mistakes=()):
        super().__init__()
        s = self.s = settings(cfg)
        self.mistakes = set(mistakes)
        f = s["family"]
        layers = nn.ModuleList(DecoderLayer(cfg, i, mistakes if "window_wrong_layers" not in mistakes or i else ())
                               for i in range(s["L"]))
        if f == "gpt2":
            self.wte = nn.Embedding(s["V"], s["D"])
            self.wpe = nn.Embedding(cfg["n_positions"], s["D"])
            self.h, self.ln_f = layers, norm(s)
        elif f == "gpt_neox":
            self.embed_in, self.layers, self.final_layer_norm = nn.Embedding(s["V"], s["D"]), layers, norm(s)
        else:
            self.embed_tokens, self.layers, self.norm = nn.Embedding(s["V"], s["D"]), layers, norm(s, ())
            if "norm_offset" in mistakes:
                self.norm = norm(s, mistakes)

    def forward(self, ids, attention_mask=None):
        f, s = self.s["family"], self.s
        B, T = ids.shape
        positions = torch.arange(T).expand(B, T)
        if f == "gpt2":
            x = self.wte(ids) + self.wpe(positions)
            layers, final = self.h, self.ln_f
        elif f == "gpt_neox":
            x, layers, final = self.embed_in(ids), self.layers, self.final_layer_norm
        else:
            x, layers, final = self.embed_tokens(ids), self.layers, self.norm
            if f == "gemma2" and "embedding_scale" not in self.mistakes:
                x = x * torch.tensor(s["D"] ** 0.5, dtype=x.dtype)
        for layer in layers:
            x = layer(x, positions, attention_mask)
        return final(x)


class CausalLM(nn.Module):
    """The whole model: ``model(ids, attention_mask=None)`` -> logits."""

    def __init__(self, cfg, mistakes=()):
        super().__init__()
        s = self.s = settings(cfg)
        self.mistakes = set(mistakes)
        base = Base(cfg, mistakes)
        setattr(self, {"gpt2": "transformer", "gpt_neox": "gpt_neox"}.get(s["family"], "model"), base)
        self.base = [base]  # not a submodule twice
        head = nn.Linear(s["D"], s["V"], bias=False)
        if s["family"] == "gpt_neox":
            self.embed_out = head
        else:
            self.lm_head = head

    def forward(self, ids, attention_mask=None):
        h = self.base[0](ids, attention_mask)
        head = self.embed_out if self.s["family"] == "gpt_neox" else self.lm_head
        logits = head(h)
        if self.s.get("final_softcap") and "final_softcap_missing" not in self.mistakes:
            logits = self.s["final_softcap"] * torch.tanh(logits / self.s["final_softcap"])
        return logits


def load(folder, mistakes=()):
    """The user's loader: config.json and model.safetensors into :class:`CausalLM`."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    model = CausalLM(cfg, mistakes)
    state = load_file(str(folder / "model.safetensors"))
    head = "embed_out.weight" if cfg["model_type"] == "gpt_neox" else "lm_head.weight"
    if head != "lm_head.weight" and "lm_head.weight" in state:  # transformers 5 writes GPT-NeoX's head so
        state[head] = state.pop("lm_head.weight")
    table = {"gpt2": "transformer.wte.weight", "gpt_neox": "gpt_neox.embed_in.weight"}.get(
        cfg["model_type"], "model.embed_tokens.weight")
    tie = settings(cfg)["tie"] != ("tied_head" in mistakes)
    if tie:
        state[head] = state[table]
    elif head not in state:
        state[head] = torch.randn(settings(cfg)["V"], settings(cfg)["D"]) / math.sqrt(settings(cfg)["D"])
    model.load_state_dict(state, strict=True)
    return model
