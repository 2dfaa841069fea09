"""``lm_trace`` against forward hooks on every module of transformers' model, for every family.

Each family's ``*ForCausalLM`` is built from a small config with random weights in float64,
written by ``save_pretrained`` and read by our ``load_pretrained``; a forward hook on every
module of ``named_modules()`` records its output (the first element of a tuple or model output)
in the order the hooks fire (and, with the eager attention of GPT-2 and Gemma 2, the attention
module's second output, its probabilities, against the trace's ``<attention>:probs``). Every hooked linear, embedding, norm, attention, MLP, activation
and decoder-layer module must be in the trace under the same name (4.57's other names through
``trace_names_4x``), in the same order, each within 1e-10 of its largest entry in float64.
Dropout and rotary-embedding modules are left out (their outputs are not activations); so are
module lists. The ids are one batch of two rows with no padding, plus a left-padded check of
the real positions.

transformers' float32 steps inside a float64 model run as the same formulas in float64 (as the
other interop tests do): ``llama_in_float64()`` (RMSNorm and RoPE angles of the Llama-built
families, GPT-NeoX's and Phi-3's), ``gemma3_in_float64()`` / ``gemma2_in_float64()`` (Gemma's
norms, RoPE, embedding scale; Gemma 2's eager softmax); the softmax runs in the model's dtype
with ``sdpa`` (Gemma 2: eager, patched). Runs on transformers 4.57 and 5.x.

What is left out or adjusted is read from the family's data where it is a property of the family: every router's
inputs are checked far from a tie by its routing (our forward's router caches: a softmax routing's top-k logits, a
grouped sigmoid routing's groups and choice scores), and experts that 4.57 keeps as one module per expert
(``Family.experts_5x``) have no ``mlp.experts`` output there. What one release's module of one family records
otherwise (4.57's DeepSeek-V3 router returns its chosen indices in ``torch.topk``'s unsorted order; 5.x's
``kv_b_proj`` records (B, 1, T, ...), its latent as one head) is in one table by name, ``RELEASE_QUIRKS``.
"""
import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import (deepseek_v3_in_float64, gemma2_in_float64, gemma3_in_float64,  # noqa: E402
                                   gpt_oss_in_float64, llama_in_float64, load_pretrained, moe_models_in_float64)
from attention_ref.interop.float64 import bloom_in_float64, qwen3_next_in_float64  # noqa: E402
from attention_ref.models.config import family_of  # noqa: E402
from attention_ref.models.families import FAMILIES, FAMILY  # noqa: E402
from attention_ref.nn.moe_routing import RouterCache  # noqa: E402

FIVE = int(transformers.__version__.split(".")[0]) >= 5
RELEASE = 5 if FIVE else 4
#: One transformers release's own way of writing one family's module, which the family's data cannot say (the other
#: release's module of the same family records as the trace does): (family, release) -> what its hooks record
#: otherwise than the trace (5.x's names and outputs), handled where the tests read it
RELEASE_QUIRKS = {
    # 4.57's Gemma 2 scales the embedding after its plain nn.Embedding (5.x: inside Gemma2TextScaledWordEmbedding):
    # its model.embed_tokens hook records the unscaled lookup, compared with the token table's rows
    # (docs/whole_models.md, the trace's 4.x names)
    ("gemma2", 4): "unscaled embedding",
    # 4.57's gpt-oss mlp.router returns the top-k softmax weights scattered into (B T, E) (5.x: the logits) and its
    # mlp.experts (B, T, D) (5.x: (B T, D)): compared with the same formulas on the trace's logits and outputs
    ("gpt_oss", 4): "scattered router",
    # 4.57's Qwen3-Next MoE block calls its router before its shared expert (5.x: after it)
    ("qwen3_next", 4): "router first",
    # 4.57's DeepSeek-V3 mlp.gate returns the chosen indices, in torch.topk's unsorted order: left out
    ("deepseek_v3", 4): "unsorted router",
    # 5.x's DeepSeek-V3 kv_b_proj reads the latent viewed as one head: (B, 1, T, H (dn + dv)), the same numbers
    ("deepseek_v3", 5): "latent as one head",
}
#: the module whose output 4.57's Gemma 2 records unscaled
EMBEDDING = "model.embed_tokens"
RTOL = 1e-10
SMALL = dict(vocab_size=41, hidden_size=16, intermediate_size=24, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=None, eos_token_id=None)
ROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}} if FIVE else {"rope_theta": 500.0}
_DEEPSEEK = FAMILY["deepseek_v3"].example
#: the small config of each family (transformers' config class, its model class, its fields, the float64 patch)
BUILD = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(vocab_size=37, n_embd=16, n_head=4, n_layer=2, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0, attn_implementation="eager", bos_token_id=None, eos_token_id=None), None),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(SMALL, **ROPE, attn_implementation="sdpa"), llama_in_float64),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(SMALL, **ROPE, attn_implementation="sdpa"), llama_in_float64),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(SMALL, **ROPE, head_dim=6, attn_implementation="sdpa"),
              llama_in_float64),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(SMALL, **ROPE, head_dim=4, sliding_window=3, attn_implementation="sdpa"), llama_in_float64),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(SMALL, **ROPE, attn_implementation="sdpa"), llama_in_float64),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM",
                dict(SMALL, **ROPE, no_rope_layer_interval=2, attn_implementation="sdpa"), llama_in_float64),
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(SMALL, **ROPE, original_max_position_embeddings=64, attn_implementation="sdpa"), llama_in_float64),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                 dict(vocab_size=41, hidden_size=24, num_attention_heads=3, intermediate_size=20, num_hidden_layers=2,
                      rotary_pct=0.25, rotary_emb_base=100.0, max_position_embeddings=64, layer_norm_eps=1e-5,
                      hidden_act="gelu", bos_token_id=None, eos_token_id=None, pad_token_id=0,
                      attn_implementation="sdpa"), llama_in_float64),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(SMALL, **ROPE, head_dim=6, num_hidden_layers=3, sliding_window=3, query_pre_attn_scalar=5,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    attn_logit_softcapping=0.5, final_logit_softcapping=1.0, attn_implementation="eager"),
               gemma2_in_float64),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    dict(SMALL, head_dim=6, num_hidden_layers=3, sliding_window=3, query_pre_attn_scalar=5,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                         attn_implementation="sdpa",
                         **({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 500.0},
                                                 "sliding_attention": {"rope_type": "default", "rope_theta": 20.0}}}
                            if FIVE else {"rope_theta": 500.0, "rope_local_base_freq": 20.0})),
                    gemma3_in_float64),
    "bloom": ("BloomConfig", "BloomForCausalLM",
              dict(vocab_size=41, hidden_size=16, n_layer=2, n_head=4, pad_token_id=0, bos_token_id=None,
                   eos_token_id=None, attn_implementation="eager"), bloom_in_float64),
    # gpt-oss: eager attention (its sinks), the experts' loop (5.x's grouped_mm refuses float64), YaRN
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(SMALL, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=3,
                     attn_implementation="eager", **({"experts_implementation": "eager"} if FIVE else {}),
                     **({"rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0,
                                             "original_max_position_embeddings": 16, "truncate": False}} if FIVE
                        else {"rope_theta": 500.0, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                                    "original_max_position_embeddings": 16,
                                                                    "truncate": False}})),
                gpt_oss_in_float64),
    # Qwen3-MoE: layer 0 dense (mlp_only_layers), layer 1 with 4 experts; 5.x's experts in their loop (float64)
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(SMALL, **ROPE, head_dim=6, moe_intermediate_size=12, num_experts=4, num_experts_per_tok=2,
                       norm_topk_prob=True, mlp_only_layers=[0], attn_implementation="sdpa",
                       **({"experts_implementation": "eager"} if FIVE else {})),
                  lambda: _both(llama_in_float64(), moe_models_in_float64())),
    # Qwen3-Next: one linear-attention and one full layer, experts and a gated shared expert on both
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                   dict(SMALL, head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=4,
                        linear_value_head_dim=3, linear_conv_kernel_dim=3, num_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=6, shared_expert_intermediate_size=5,
                        layer_types=["linear_attention", "full_attention"], attn_implementation="sdpa",
                        **({"experts_implementation": "eager"} if FIVE else {}),
                        **({"rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                                                "partial_rotary_factor": 0.5}} if FIVE
                           else {"rope_theta": 500.0, "partial_rotary_factor": 0.5})),
                   qwen3_next_in_float64),
    # DeepSeek-V3: the family's example (a dense layer, two routed ones, a query compression, YaRN with mscale_all_dim)
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    {**{k: v for k, v in _DEEPSEEK.items() if k not in ("rope_theta", "rope_scaling")},
                     **({"rope_parameters": {**_DEEPSEEK["rope_scaling"], "rope_theta": _DEEPSEEK["rope_theta"]}} if FIVE
                        else {"rope_theta": _DEEPSEEK["rope_theta"], "rope_scaling": dict(_DEEPSEEK["rope_scaling"])}),
                     "pad_token_id": 0, "bos_token_id": None, "eos_token_id": None, "attn_implementation": "sdpa",
                     **({"experts_implementation": "eager"} if FIVE else {})},
                    deepseek_v3_in_float64),
}
def _routers(params, config, ids, mask):
    """(layer, :class:`RouterCache`) of every router our forward runs, read from each block's cache (a tree of
    named tuples and tuples)."""
    def found(cache):
        if isinstance(cache, RouterCache):
            return [cache]
        return [r for part in cache for r in found(part)] if isinstance(cache, tuple) else []

    _, cache = ar.lm_forward(ids, params, config, attention_mask=mask)
    return [(layer, router) for layer, block in enumerate(cache.blocks) for router in found(block)]


def _no_near_tie(params, config, ids, mask):
    """Every router's choice has no near tie, so both implementations choose the same experts. By its routing: a
    softmax routing's (gpt-oss's, Qwen3-MoE's, Qwen3-Next's) k-th and (k+1)-th logits of every token apart by 1e-6
    of their scale; a grouped sigmoid routing's (DeepSeek-V3's) kept groups' scores and the next group's, and the
    chosen experts' choice scores and the next kept expert's, at least 1e-6 apart, and every chosen choice score
    positive (4.57 masks the groups not kept with 0, 5.x with -inf)."""
    if config.num_experts is None:
        return
    for layer, router in _routers(params, config, ids, mask):
        r, name = router.routing, f"layer {layer}'s router"
        if r.order != "sigmoid_topk":
            b = params.get(f"layers.{layer}.mlp.b_router", 0.0)  # gpt-oss's router has a bias
            top = np.sort(router.linear.x @ router.linear.W + b, axis=-1)  # (B T, E): the logits, sorted
            assert (top[:, -r.top_k] - top[:, -r.top_k - 1]).min() > 1e-6 * np.abs(top).max(), f"a near tie in {name}"
            continue
        c = router.p + params[f"layers.{layer}.mlp.e_score_correction_bias"]  # (B T, E): the choice scores
        E, G, kept, k = c.shape[-1], r.n_group, r.topk_group, r.top_k
        groups = np.sort(np.sort(c.reshape(-1, G, E // G), -1)[..., -2:].sum(-1), -1)[:, ::-1]  # (B T, G)
        assert kept == G or (groups[:, kept - 1] - groups[:, kept]).min() > 1e-6, f"a near group tie in {name}"
        best = np.argsort(-np.sort(c.reshape(-1, G, E // G), -1)[..., -2:].sum(-1), axis=-1, kind="stable")[:, :kept]
        inside = np.zeros((len(c), G), bool)
        np.put_along_axis(inside, best, True, axis=-1)
        choice = np.sort(np.where(np.repeat(inside, E // G, axis=-1), c, -np.inf), -1)[:, ::-1]
        assert choice[:, k - 1].min() > 1e-6, f"a chosen choice score near 0 in {name}"
        assert k == kept * (E // G) or (choice[:, k - 1] - choice[:, k]).min() > 1e-6, f"a near tie in {name}"


def _gpt_oss_4x(ours, config):
    k = config.experts_per_token
    for name in [n for n in ours if n.endswith("mlp.router")]:
        logits = ours[name]  # (B T, E)
        idx = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
        top = np.take_along_axis(logits, idx, axis=-1)
        w = np.exp(top - top.max(axis=-1, keepdims=True))
        scattered = np.zeros_like(logits)
        np.put_along_axis(scattered, idx, w / w.sum(axis=-1, keepdims=True), axis=-1)
        ours[name] = scattered
        experts = name[:-len("router")] + "experts"
        mlp = ours[name[:-len(".router")]]
        ours[experts] = mlp  # (B, T, D)


@contextlib.contextmanager
def _both(first, second):
    with first, second:
        yield


def _router_first(ours):
    """The trace's (5.x's) order with each ``mlp.gate`` moved before its shared expert, where 4.57's Qwen3-Next
    calls it."""
    out = {}
    for name, value in ours.items():
        if name.endswith("mlp.gate"):
            continue
        if name.endswith("mlp.shared_expert.gate_proj"):
            gate = name[:-len("shared_expert.gate_proj")] + "gate"
            out[gate] = ours[gate]
        out[name] = value
    return out


#: modules that run on other inputs than the trace's steps, in whichever family has them: the experts' inner
#: modules (each on its own tokens: 5.x's ``mlp.experts.act_fn`` once per expert, 4.57's ``mlp.experts.<e>.*``;
#: gpt-oss's experts have none) and the Gated DeltaNet's raw padded convolution ``linear_attn.conv1d``
#: (B, C, T + K - 1), whose SiLU Qwen3-Next's layer applies outside it
NOT_TRACED = (".mlp.experts.", ".linear_attn.conv1d")

#: modules whose output is not an activation: left out of the trace (and of this comparison)
SKIPPED = ("Dropout", "RotaryEmbedding", "ModuleList")


def _model(family):
    config_class, model_class, fields, _ = BUILD[family]
    config = getattr(transformers, config_class)(**fields)
    model = getattr(transformers, model_class)(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # the attention not uniform; norms and biases away from 1 and 0
            if p.ndim == 2 and not bool(p.any()):
                p.normal_(0.0, 0.02)  # 5.x's Qwen3-MoE router starts at zero: every expert tied
            p.mul_(10.0) if "norm" not in name and "ln" not in name and p.ndim == 2 else p.add_(0.2 * torch.randn_like(p))
    return model


def _hooked(model, ids, mask):
    """Every module's output, in the order the forward hooks fire: a list of (name, array)."""
    fired, handles = [], []
    for name, module in model.named_modules():
        if any(kind in type(module).__name__ for kind in SKIPPED) or any(part in name for part in NOT_TRACED):
            continue

        def hook(module, args, output, name=name):
            many = isinstance(output, (tuple, list)) or hasattr(output, "to_tuple")
            fired.append((name, (output[0] if many else output).detach().numpy().copy()))
            if many and isinstance(output, tuple) and len(output) > 1 and getattr(output[1], "ndim", 0) == 4:
                fired.append((name + ":probs", output[1].detach().numpy().copy()))  # eager attention's weights
        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
    finally:
        for handle in handles:
            handle.remove()
    return fired


def _float64(family):
    patch = BUILD[family][3]
    return contextlib.nullcontext() if patch is None else patch()


@pytest.fixture(params=[f for f in FAMILIES if f in BUILD])
def family_run(request, tmp_path):
    family = request.param
    torch.manual_seed(0)
    model = _model(family)
    model.save_pretrained(tmp_path)
    params, config = load_pretrained(tmp_path)
    return family, model, params, config


def test_every_family_has_a_build():
    assert set(FAMILIES) <= set(BUILD), f"families without a transformers build here: {set(FAMILIES) - set(BUILD)}"


def test_every_hooked_module_in_hook_order(family_run):
    family, model, params, config = family_run
    rng = np.random.default_rng(3)
    ids = rng.integers(1, config.vocab_size, (2, 7))
    mask = np.ones_like(ids)
    with _float64(family):
        fired = _hooked(model, ids, mask)
    trace = ar.lm_trace(ids, params, config)
    _no_near_tie(params, config, ids, None)
    to_4x = ar.trace_names_4x(config) if not FIVE else {}
    ours = {to_4x.get(name, name): value for name, value in trace.items()}
    if not FIVE and family_of(config).experts_5x:  # 4.57 keeps them as one module per expert: no mlp.experts output
        ours = {n: v for n, v in ours.items() if not n.endswith(".mlp.experts")}
    quirk = RELEASE_QUIRKS.get((family, RELEASE))
    if quirk == "unscaled embedding":
        ours[EMBEDDING] = params[family_of(config).token_table][ids]
    if quirk == "scattered router":
        _gpt_oss_4x(ours, config)
    if quirk == "router first":
        ours = _router_first(ours)
    if quirk == "unsorted router":
        ours = {n: v for n, v in ours.items() if not n.endswith(".mlp.gate")}
        fired = [(name, value) for name, value in fired if not name.endswith(".mlp.gate")]
    if quirk == "latent as one head":
        ours = {n: v[:, None] if n.endswith(".kv_b_proj") else v for n, v in ours.items()}
    order = [name for name in ours if ":" not in name]
    positions = []
    worst = 0.0
    probs = [name for name, _ in fired if name.endswith(":probs")]
    assert bool(probs) == (BUILD[family][2]["attn_implementation"] == "eager")  # eager returns its weights
    for name, theirs in fired:
        assert name in ours, f"{family}: {name!r} hooked in transformers, not in the trace"
        value = np.broadcast_to(ours[name], theirs.shape)
        scale = max(float(np.abs(theirs).max()), 1e-300)
        err = float(np.abs(value - theirs).max())
        assert err <= RTOL * scale, f"{family}: {name}: max abs error {err:.2e} against max |value| {scale:.2e}"
        worst = max(worst, err / scale)
        if ":" not in name:
            positions.append(order.index(name))
    assert positions == sorted(positions), f"{family}: the trace's order is not the hooks' order"
    hooked = {name for name, _ in fired if ":" not in name}
    assert set(order) == hooked, f"{family}: trace names no module hooks: {sorted(set(order) - hooked)}"
    print(f"{family}: {len(fired)} hooked names matched, largest relative difference {worst:.1e}")


def test_left_padded_real_positions(family_run):
    """A left-padded batch: every module's output at the real positions (padded ones follow no convention)."""
    family, model, params, config = family_run
    rng = np.random.default_rng(4)
    ids = rng.integers(1, config.vocab_size, (2, 7))
    mask = np.ones_like(ids)
    mask[1, :3] = 0
    with _float64(family):
        fired = dict(_hooked(model, ids, mask))
    trace = ar.lm_trace(ids, params, config, attention_mask=mask)
    _no_near_tie(params, config, ids, mask)
    to_4x = ar.trace_names_4x(config) if not FIVE else {}
    quirk = RELEASE_QUIRKS.get((family, RELEASE))
    if quirk == "scattered router":
        _gpt_oss_4x(trace, config)
    for name, value in trace.items():
        name = to_4x.get(name, name)
        if name not in fired or (quirk == "unscaled embedding" and name == EMBEDDING) or fired[name].ndim < 3 \
                or fired[name].shape[:2] != ids.shape:
            continue  # per-position outputs (B, T, ...) only
        theirs, value = fired[name][mask == 1], np.broadcast_to(value, fired[name].shape)[mask == 1]
        scale = max(float(np.abs(theirs).max()), 1e-300)
        assert float(np.abs(value - theirs).max()) <= RTOL * scale, f"{family}: {name} at the real positions"
