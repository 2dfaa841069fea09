"""GPT-2 and Llama as whole language models, without torch: every gradient of a tiny model
against finite differences, the decoder's logits against the full forward, left padding that
changes nothing, the loading round trip, and the errors."""
import json

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.interop import from_transformers_state, load_pretrained, to_transformers, write_safetensors
from attention_ref.models.families import FAMILY

GPT2 = ar.LMConfig(family="gpt2", vocab_size=11, d_model=8, num_layers=2, num_heads=2, num_kv_heads=2, d_ff=12,
                   max_positions=16, eps=1e-5)
LLAMA = ar.LMConfig(family="llama", vocab_size=13, d_model=8, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=12,
                    max_positions=64, eps=1e-6, rope_theta=100.0, tie_word_embeddings=False, pad_token_id=0)
#: GPT-NeoX (Pythia): parallel residual, rotary on half of each head's 4 features, untied head (as Pythia)
NEOX = ar.LMConfig(family="gpt_neox", vocab_size=11, d_model=8, num_layers=2, num_heads=2, num_kv_heads=2, d_ff=12,
                   max_positions=64, eps=1e-5, rope_theta=100.0, tie_word_embeddings=False, rotary_pct=0.5)
CONFIGS = {
    "gpt2": GPT2,
    "gpt2-untied-scaled-by-layer": ar.LMConfig(**{**GPT2.to_dict(), "tie_word_embeddings": False,
                                                  "scale_attn_by_inverse_layer_idx": True}),
    "llama": LLAMA,
    "llama-tied": ar.LMConfig(**{**LLAMA.to_dict(), "tie_word_embeddings": True}),
    # Llama 3.x: at head width 2 and base 100 the one pair's wavelength 6.3 lies between 16 / 4 and 16 / 1
    "llama3-rope": ar.LMConfig(**{**LLAMA.to_dict(), "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}}),
    "qwen2": ar.LMConfig(**{**LLAMA.to_dict(), "family": "qwen2"}),  # biases on q, k, v
    "qwen3": ar.LMConfig(**{**LLAMA.to_dict(), "family": "qwen3"}),  # RMSNorm over each head's q and k
    "qwen3-wide-heads": ar.LMConfig(**{**LLAMA.to_dict(), "family": "qwen3", "head_dim": 4}),  # H Dh = 16 != D
    "mistral": ar.LMConfig(**{**LLAMA.to_dict(), "family": "mistral", "sliding_window": 2}),  # shorter than T = 5
    "phi3": ar.LMConfig(**{**LLAMA.to_dict(), "family": "phi3"}),  # fused qkv and gate_up params
    "phi3-sliding-window-tied": ar.LMConfig(**{**LLAMA.to_dict(), "family": "phi3", "sliding_window": 2,
                                               "tie_word_embeddings": True}),
    "gpt_neox": NEOX,
    "gpt_neox-sequential-tied": ar.LMConfig(**{**NEOX.to_dict(), "use_parallel_residual": False,
                                               "tie_word_embeddings": True, "rotary_pct": 1.0}),
    # Gemma 3: sliding layers (window 2, local base 10) around a global one (base 100, linear scaling), heads
    # 3 wide (H Dh = 12 != D), scores by query_pre_attn_scalar ** -0.5, tied head
    "gemma3": ar.LMConfig(**{**LLAMA.to_dict(), "family": "gemma3_text", "num_layers": 3, "head_dim": 4,
                             "sliding_window": 2, "tie_word_embeddings": True, "query_pre_attn_scalar": 3.0,
                             "layer_types": ("sliding_attention", "full_attention", "sliding_attention"),
                             "rope_local_theta": 10.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    # Gemma 2: no q/k norms, the scores capped at 0.5 and the logits at 1.0 (small: tanh bends them), untied
    "gemma2": ar.LMConfig(**{**LLAMA.to_dict(), "family": "gemma2", "num_layers": 3, "head_dim": 4,
                             "sliding_window": 2, "query_pre_attn_scalar": 3.0, "rope_local_theta": 100.0,
                             "layer_types": ("sliding_attention", "full_attention", "sliding_attention"),
                             "attn_softcap": 0.5, "final_softcap": 1.0}),
    # OLMo 2: norms after the sub-layers, q/k norms over the whole projections (models/families/olmo2.py)
    "olmo2": ar.LMConfig(**{**LLAMA.to_dict(), "family": "olmo2"}),
    # SmolLM3: layer 1 without RoPE (no_rope_layers [1, 0])
    "smollm3": ar.LMConfig(**{**LLAMA.to_dict(), "family": "smollm3", "rope_layers": (True, False)}),
    # gpt-oss: sinks, biases on every projection, a sliding layer (window 2) and a full one, YaRN (factor 4 over
    # 16 positions), 3 experts of width 4 of which each token takes 2 (models/families/gpt_oss.py)
    "gpt_oss": ar.LMConfig(**{**LLAMA.to_dict(), "family": "gpt_oss", "d_ff": 4, "head_dim": 4, "sliding_window": 2,
                              "layer_types": ("sliding_attention", "full_attention"), "num_experts": 3,
                              "experts_per_token": 2, "rope_scaling": {
                                  "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                  "truncate": False}}),
    # Qwen3-MoE: layer 0 dense, layer 1 with 3 experts of width 4 of which each token takes 2, normalised
    # (models/families/qwen3_moe.py)
    "qwen3_moe": ar.LMConfig(**{**LLAMA.to_dict(), "family": "qwen3_moe", "head_dim": 4, "num_experts": 3,
                                "experts_per_token": 2, "settings": {"sparse_layers": (False, True), "moe_d_ff": 4,
                                                                     "norm_topk_prob": True}}),
    # Qwen3-Next: a Gated DeltaNet layer and a gated-attention layer (RoPE on half of each head), experts with a
    # gated shared expert on the first, a dense MLP on the second (mlp_only_layers) (models/families/qwen3_next.py)
    "qwen3_next": ar.LMConfig.from_dict({
        "model_type": "qwen3_next", **FAMILY["qwen3_next"].example, "vocab_size": 13, "hidden_size": 8,
        "intermediate_size": 6, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
        "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 3, "linear_value_head_dim": 2,
        "linear_conv_kernel_dim": 2, "num_experts": 3, "moe_intermediate_size": 2, "shared_expert_intermediate_size": 3,
        "mlp_only_layers": [1], "pad_token_id": 0}),
    # DeepSeek-V3: MLA (a query compression, a latent of 4, RoPE on 2 of each head's 4 key features), layer 0 dense,
    # layer 1 with 4 experts in 2 groups (1 kept) and a shared expert, YaRN with mscale_all_dim
    # (models/families/deepseek_v3.py)
    "deepseek_v3": ar.LMConfig(**{**LLAMA.to_dict(), "family": "deepseek_v3", "num_heads": 2, "num_kv_heads": 2,
                                  "head_dim": 2, "num_experts": 4, "experts_per_token": 2, "rope_scaling": {
                                      "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                      "mscale": 1.0, "mscale_all_dim": 0.8},
                                  "settings": {"q_lora_rank": 4, "kv_lora_rank": 4, "qk_nope_head_dim": 2,
                                               "qk_rope_head_dim": 2, "v_head_dim": 3, "rope_interleave": True,
                                               "first_k_dense_replace": 1, "moe_intermediate_size": 3,
                                               "n_shared_experts": 1, "n_group": 2, "topk_group": 1,
                                               "norm_topk_prob": True, "routed_scaling_factor": 2.5}}),
    # Llama with Meta's interleaved RoPE pairs (config.rope_layout)
    "llama-interleaved": ar.LMConfig(**{**LLAMA.to_dict(), "rope_layout": "interleaved", "head_dim": 4}),
}


def _model(name, seed=0):
    config = CONFIGS[name]
    params = ar.init_lm_params(config, seed=seed)
    rng = np.random.default_rng(seed + 1)
    # larger, non-special weights: the attention is far from uniform and every norm parameter matters
    return {k: v * 10 + 0.1 * rng.standard_normal(v.shape) if v.ndim == 2 else v + 0.3 * rng.standard_normal(v.shape)
            for k, v in params.items()}, config


def _router_caches(cache):
    """Every router's cache inside a block's cache (a tree of named tuples and tuples): gpt-oss's one, Qwen3-Next's
    on its expert layers, none on a dense one."""
    from attention_ref.nn.moe_routing import RouterCache
    if isinstance(cache, RouterCache):
        return [cache]
    if isinstance(cache, tuple):
        return [r for part in cache for r in _router_caches(part)]
    return []


def _far_from_group_ties(router, bias, gap=1e-3):
    """Sigmoid routing with groups (DeepSeek-V3): the kept groups' scores 1e-3 above the next group's, and the
    chosen experts' choice scores above the other kept experts' (a finite difference must not move the choice)."""
    r = router.routing
    c = router.p + bias  # (T, E): the choice scores
    T, E = c.shape
    groups = np.sort(c.reshape(T, r.n_group, -1), -1)[..., -2:].sum(-1)  # (T, G)
    ranked = np.sort(groups, -1)[:, ::-1]
    assert r.topk_group == r.n_group or (ranked[:, r.topk_group - 1] - ranked[:, r.topk_group]).min() > gap
    kept = np.argsort(-groups, -1, kind="stable")[:, :r.topk_group]
    mask = np.zeros((T, r.n_group), bool)
    np.put_along_axis(mask, kept, True, -1)
    choice = np.sort(np.where(np.repeat(mask, E // r.n_group, -1), c, -np.inf), -1)[:, ::-1]
    assert (choice[:, r.top_k - 1] - choice[:, r.top_k]).min() > gap  # -inf past the kept experts: an infinite gap


@pytest.mark.parametrize("name", CONFIGS)
def test_every_gradient_of_a_tiny_model_against_finite_differences(name):
    params, config = _model(name)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, config.vocab_size, (2, 5))
    ids[0, 1] = 0  # Llama's pad row is read, and gets no gradient
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    keys = [k for k in params if not (config.pad_token_id is not None and k == "embed_tokens")]

    def forward(sub):
        return ar.lm_forward(ids, {**params, **sub}, config, attention_mask=mask)

    def backward(dlogits, cache):
        grads = ar.lm_backward(dlogits, cache)
        return {k: grads[k] for k in keys}

    if config.num_experts is not None:  # no near tie in the routing: a finite difference must not change the experts
        for layer, block in enumerate(forward({})[1].blocks):
            for router in _router_caches(block):  # the router's input (T, D) and weight (D, E)
                if router.routing.order == "sigmoid_topk":  # DeepSeek-V3's grouped sigmoid routing
                    _far_from_group_ties(router, params[f"layers.{layer}.mlp.e_score_correction_bias"])
                    continue
                top = np.sort(router.linear.x @ router.linear.W + params.get(f"layers.{layer}.mlp.b_router", 0.0),
                              axis=-1)  # (T, E)
                gap = top[:, -config.experts_per_token] - top[:, -config.experts_per_token - 1]
                assert gap.min() > 1e-3 * np.abs(top).max(), (layer, gap.min())
    report = ar.gradcheck(forward, backward, {k: params[k] for k in keys}, atol=1e-7, rtol=1e-5)
    report.raise_if_failed()
    grads = ar.lm_backward(np.ones((2, 5, config.vocab_size)), forward({})[1])
    assert sorted(grads) == sorted(params) and all(grads[k].shape == params[k].shape for k in params)
    if config.pad_token_id is not None:  # the table's other rows, by finite differences; the pad row: 0
        table = [k for k in params if k == "embed_tokens"][0]
        if not config.tie_word_embeddings:
            assert not grads[table][config.pad_token_id].any()
        rows = [r for r in range(config.vocab_size) if r != config.pad_token_id]

        def forward_rows(W_rows):
            W = params[table].copy()
            W[rows] = W_rows
            return forward({table: W})

        def backward_rows(dlogits, cache):
            return ar.lm_backward(dlogits, cache)[table][rows]

        ar.gradcheck(forward_rows, backward_rows, params[table][rows], atol=1e-7, rtol=1e-5).raise_if_failed()


@pytest.mark.parametrize("name", CONFIGS)
def test_lm_loss_is_the_mean_next_token_cross_entropy(name):
    params, config = _model(name)
    ids = np.random.default_rng(3).integers(1, config.vocab_size, (2, 6))
    mask = np.array([[1] * 6, [1, 1, 1, 1, 0, 0]])
    loss, grads, logits = ar.lm_loss(ids, params, config, attention_mask=mask)
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    terms = [-logp[b, n, ids[b, n + 1]] for b in range(2) for n in range(5) if mask[b, n + 1]]
    assert loss == pytest.approx(np.mean(terms), rel=1e-12)
    assert sorted(grads) == sorted(params)


@pytest.mark.parametrize("name", CONFIGS)
def test_decoder_gives_the_full_forward_logits_step_by_step(name):
    params, config = _model(name)
    ids = np.random.default_rng(4).integers(1, config.vocab_size, (3, 7))
    full, _ = ar.lm_forward(ids, params, config)
    decoder = ar.LMDecoder(params, config)
    first = decoder.prefill(ids[:, :4])
    np.testing.assert_allclose(first, full[:, :4], rtol=1e-12, atol=1e-12)
    for n in range(4, 7):
        np.testing.assert_allclose(decoder.step(ids[:, n]), full[:, n], rtol=1e-12, atol=1e-12)
    assert all(c.length == 7 for c in decoder.caches) and len({id(c) for c in decoder.caches}) == config.num_layers


@pytest.mark.parametrize("name", CONFIGS)
def test_left_padding_changes_no_token(name):
    """A prompt generated alone and inside a left-padded batch gives the same tokens (positions
    count real tokens only, padding keys are hidden)."""
    params, config = _model(name)
    rng = np.random.default_rng(5)
    long, short = rng.integers(1, config.vocab_size, 6), rng.integers(1, config.vocab_size, 3)
    batch = np.stack([long, np.concatenate([[0, 0, 0], short])])
    mask = np.array([[1] * 6, [0, 0, 0, 1, 1, 1]])
    together = ar.generate(batch, params, config, 5, attention_mask=mask)
    np.testing.assert_array_equal(together[0], ar.generate(long, params, config, 5))
    np.testing.assert_array_equal(together[1, 3:], ar.generate(short, params, config, 5))
    np.testing.assert_array_equal(together[:, :6], batch)


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    params, config = _model("llama")
    ids = np.array([[3, 4, 5]])
    a = ar.generate(ids, params, config, 8, temperature=1.5, seed=7)
    np.testing.assert_array_equal(a, ar.generate(ids, params, config, 8, temperature=1.5, seed=7))
    np.testing.assert_array_equal(ar.generate(ids, params, config, 8, temperature=2.0, top_k=1, seed=1),
                                  ar.generate(ids, params, config, 8))
    draws = {tuple(ar.generate(ids, params, config, 4, temperature=5.0, seed=s)[0, 3:]) for s in range(6)}
    assert len(draws) > 1  # sampling at a high temperature does not always give the greedy tokens
    assert ar.generate(ids, params, config, 0).shape == (1, 3)


def test_sampling_follows_the_softmax():
    """Frequencies of the first sampled token against softmax(logits / T) (and top_k)."""
    from attention_ref.models.generate import _next_tokens

    logits = np.array([[2.0, 1.0, 0.0, -1.0]] * 20000)
    ids = np.zeros((20000, 1), int)
    rng = np.random.default_rng(0)
    p = np.exp(logits[0] / 0.8)
    p /= p.sum()
    processed = ar.process_logits(logits, ids, do_sample=True, temperature=0.8, top_k=None)
    freq = np.bincount(_next_tokens(processed, True, rng), minlength=4) / 20000
    np.testing.assert_allclose(freq, p, atol=0.015)
    processed = ar.process_logits(logits, ids, do_sample=True, top_k=2)
    top2 = np.bincount(_next_tokens(processed, True, rng), minlength=4) / 20000
    np.testing.assert_allclose(top2, [np.e / (np.e + 1), 1 / (np.e + 1), 0, 0], atol=0.015)


def test_one_kv_cache_per_layer():
    params, config = _model("gpt2")
    x = np.random.default_rng(6).standard_normal((1, 3, config.d_model))
    cache = ar.KVCache()
    ar.gpt2_block_decode_step(x, ar.block_params(params, config, 0), 2, cache)
    with pytest.raises(ValueError, match="holds the keys of another layer.*one KVCache per layer"):
        ar.gpt2_block_decode_step(x, ar.block_params(params, config, 1), 2, cache)
    assert cache.length == 3  # refused before anything was appended
    same = {k: v.copy() for k, v in ar.block_params(params, config, 0).items()}  # the same weights, copied
    ar.gpt2_block_decode_step(x[:, :1], same, 2, cache)
    assert cache.length == 4
    lparams, lconfig = _model("llama")
    cache = ar.KVCache()
    ar.llama_block_decode_step(x, ar.block_params(lparams, lconfig, 0), 4, cache)
    with pytest.raises(ValueError, match="another layer"):
        ar.llama_block_decode_step(x, ar.block_params(lparams, lconfig, 1), 4, cache)


@pytest.mark.parametrize("name", ["gpt2-untied-scaled-by-layer", "llama", "llama-tied"])
def test_load_pretrained_round_trip(tmp_path, name):
    """Our params under transformers' names, written as save_pretrained does (config.json and
    model.safetensors, or shards with their index), read back equal."""
    params, config = _model(name)
    hf = {"gpt2": {"model_type": "gpt2", "vocab_size": config.vocab_size, "n_embd": config.d_model,
                   "n_layer": config.num_layers, "n_head": config.num_heads, "n_positions": config.max_positions,
                   "n_inner": config.d_ff, "layer_norm_epsilon": config.eps,
                   "tie_word_embeddings": config.tie_word_embeddings,
                   "scale_attn_by_inverse_layer_idx": config.scale_attn_by_inverse_layer_idx},
          "llama": {"model_type": "llama", "vocab_size": config.vocab_size, "hidden_size": config.d_model,
                    "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
                    "num_key_value_heads": config.num_kv_heads, "intermediate_size": config.d_ff,
                    "rms_norm_eps": config.eps, "rope_parameters": {"rope_type": "default",
                                                                    "rope_theta": config.rope_theta},
                    "max_position_embeddings": config.max_positions, "pad_token_id": config.pad_token_id,
                    "tie_word_embeddings": config.tie_word_embeddings}}[config.family]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    state = to_transformers(params, config)  # model.state_dict()'s names: the head's included when tied
    table = {"gpt2": "transformer.wte.weight", "llama": "model.embed_tokens.weight"}[config.family]
    assert (state["lm_head.weight"] is state[table]) == config.tie_word_embeddings
    if config.tie_word_embeddings:  # save_pretrained writes a tied weight once
        del state["lm_head.weight"]
    if name == "llama":  # sharded, as save_pretrained(max_shard_size=...) writes it
        names = sorted(state)
        shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
        for file, keys in shards.items():
            write_safetensors({k: state[k] for k in keys}, tmp_path / file)
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}))
    else:
        write_safetensors(state, tmp_path / "model.safetensors")
    loaded, loaded_config = load_pretrained(tmp_path)
    assert loaded_config == config
    assert sorted(loaded) == sorted(params)
    for k in params:
        np.testing.assert_array_equal(loaded[k], params[k], err_msg=k)
    f32, _ = load_pretrained(tmp_path, dtype=np.float32)
    assert all(v.dtype == np.float32 for v in f32.values())


def test_loading_refuses_what_it_does_not_implement(tmp_path):
    llama3 = {"model_type": "llama", "vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 8,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    with pytest.raises(ValueError, match="needs scaling\\['low_freq_factor'\\], which is missing"):
        ar.LMConfig.from_dict(llama3)  # llama3 and linear are run; a parameter missing is named
    for rope_type in ("dynamic", "yarn", "longrope"):
        with pytest.raises(ValueError, match=f"rope_type = '{rope_type}' is not supported"):
            ar.LMConfig.from_dict({**llama3, "rope_scaling": None,  # 5.x's spelling alone (beside 4.x's: a conflict)
                                   "rope_parameters": {"rope_type": rope_type, "factor": 2.0}})
    with pytest.raises(ValueError, match="does not use here"):
        ar.LMConfig.from_dict({**llama3, "rope_scaling": {"rope_type": "linear", "factor": 2.0, "beta_fast": 3}})
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        ar.LMConfig.from_dict({**llama3, "rope_scaling": {"rope_type": "linear", "factor": 2.0,
                                                          "partial_rotary_factor": 0.5}})
    qwen2 = {**llama3, "model_type": "qwen2", "rope_scaling": None}
    assert ar.LMConfig.from_dict(qwen2).qkv_bias
    with pytest.raises(ValueError, match="qwen2: use_sliding_window = True is not supported"):
        ar.LMConfig.from_dict({**qwen2, "use_sliding_window": True, "sliding_window": 4})
    with pytest.raises(ValueError, match="qwen2: layer_types = \\['full_attention', 'sliding_attention'\\]"):
        ar.LMConfig.from_dict({**qwen2, "layer_types": ["sliding_attention", "full_attention"]})
    qwen3 = {**qwen2, "model_type": "qwen3", "head_dim": 2}
    assert ar.LMConfig.from_dict(qwen3).qk_norm and ar.LMConfig.from_dict(qwen3).head_dim is None  # 4 / 2
    assert ar.LMConfig.from_dict({**qwen3, "head_dim": 6}).d_head == 6
    with pytest.raises(ValueError, match="qwen3: head_dim = 3 is not supported"):  # RoPE rotates pairs
        ar.LMConfig.from_dict({**qwen3, "head_dim": 3})
    with pytest.raises(ValueError, match="gpt2: head_dim = 8 is not supported"):
        ar.LMConfig(**{**GPT2.to_dict(), "head_dim": 8})
    with pytest.raises(ValueError, match="qwen3: attention_bias = True"):  # Qwen3's: on o_proj too
        ar.LMConfig.from_dict({**qwen3, "attention_bias": True})
    with pytest.raises(ValueError, match="qwen3: use_sliding_window = True"):
        ar.LMConfig.from_dict({**qwen3, "use_sliding_window": True})
    mistral = {**qwen2, "model_type": "mistral", "sliding_window": 4096}
    assert ar.LMConfig.from_dict(mistral).sliding_window == 4096
    assert ar.LMConfig.from_dict({**mistral, "sliding_window": None}).sliding_window is None
    assert ar.LMConfig.from_dict({**llama3, "rope_scaling": None, "sliding_window": 4}).sliding_window is None
    with pytest.raises(ValueError, match="llama: sliding_window = 4 is not supported"):
        ar.LMConfig(**{**LLAMA.to_dict(), "sliding_window": 4})
    with pytest.raises(ValueError, match="sliding_window must be None or a positive integer"):
        ar.LMConfig(**{**LLAMA.to_dict(), "family": "mistral", "sliding_window": 0})
    for flag in ("attention_bias", "mlp_bias"):  # Llama's: biases on o_proj too, or in the MLP
        with pytest.raises(ValueError, match=f"llama: {flag} = True is not supported"):
            ar.LMConfig.from_dict({**llama3, "rope_scaling": None, flag: True})
    with pytest.raises(ValueError, match="RoPE type 'dynamic' is not implemented"):
        ar.LMConfig(**{**LLAMA.to_dict(), "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    with pytest.raises(ValueError, match="model_type 'bert' is not supported"):
        ar.LMConfig.from_dict({"model_type": "bert"})
    with pytest.raises(ValueError, match="activation_function = 'relu'"):
        ar.LMConfig.from_dict({"model_type": "gpt2", "activation_function": "relu", "vocab_size": 8, "n_embd": 4,
                               "n_layer": 1, "n_head": 2, "n_positions": 8})
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**llama3, "rope_scaling": None}))
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor"):
        load_pretrained(tmp_path)
    params, config = _model("gpt2")
    state = to_transformers(params, config)
    del state["transformer.h.1.mlp.c_fc.weight"]
    with pytest.raises(KeyError, match="transformer.h.1.mlp.c_fc.weight"):
        from_transformers_state(state, config)


def test_bad_inputs_are_named():
    params, config = _model("gpt2")
    with pytest.raises(ValueError, match=r"ids\[0, 2\] = 11 is not a token id in \[0, 11\)"):
        ar.lm_forward([[1, 2, 11]], params, config)
    with pytest.raises(ValueError, match="more than GPT-2's max_positions = 16"):
        ar.lm_forward(np.ones((1, 17), int), params, config)
    with pytest.raises(ValueError, match=r"missing \['h.1.ln2.gamma'\]"):
        ar.lm_forward([[1]], {k: v for k, v in params.items() if k != "h.1.ln2.gamma"}, config)
    with pytest.raises(TypeError, match="config must be an LMConfig"):
        ar.lm_forward([[1]], params, {"model_type": "gpt2"})
    with pytest.raises(ValueError, match="must be left-padded"):
        ar.generate([[1, 2, 0]], params, config, 2, attention_mask=[[1, 1, 0]])
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        ar.generate([[1, 2]], params, config, 2, temperature=-1)
    with pytest.raises(ValueError, match="attention_mask must hold 0/1"):
        ar.lm_forward([[1, 2]], params, config, attention_mask=[[1, 2]])
    with pytest.raises(ValueError, match=r"dlogits must have shape \(1, 2, 11\)"):
        ar.lm_backward(np.ones((1, 2, 10)), ar.lm_forward([[1, 2]], params, config)[1])


def test_float32_stays_float32():
    params, config = _model("llama")
    p32 = {k: v.astype(np.float32) for k, v in params.items()}
    logits, cache = ar.lm_forward([[1, 2, 3]], p32, config)
    assert logits.dtype == np.float32
    grads = ar.lm_backward(np.ones_like(logits), cache)
    assert all(g.dtype == np.float32 for g in grads.values())
    np.testing.assert_allclose(logits, ar.lm_forward([[1, 2, 3]], params, config)[0], rtol=1e-4, atol=1e-4)


def test_what_a_newcomer_ran_into(tmp_path):
    """From a fresh-eyes run: negative pad ids, dtypes at load, GPT-2's limit with padding, a tiny
    temperature, a variant file name."""
    d = {"model_type": "llama", "vocab_size": 40, "hidden_size": 8, "num_hidden_layers": 1,
         "num_attention_heads": 2, "intermediate_size": 16, "pad_token_id": -1}
    assert ar.LMConfig.from_dict(d).pad_token_id == 39  # as torch's padding_idx = -1
    params, config = _model("gpt2")
    hf = {"model_type": "gpt2", "vocab_size": 11, "n_embd": 8, "n_layer": 2, "n_head": 2, "n_positions": 16,
          "n_inner": 12}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    write_safetensors(to_transformers(params, config), tmp_path / "model.safetensors")
    for bad in (np.int64, np.float16):
        with pytest.raises(TypeError, match="dtype must be a floating dtype, float32 or float64"):
            load_pretrained(tmp_path, dtype=bad)
    (tmp_path / "model.safetensors").rename(tmp_path / "model.v1.safetensors")
    with pytest.raises(FileNotFoundError, match=r"look like a save_pretrained\(variant=...\) file"):
        load_pretrained(tmp_path)
    # GPT-2's max_positions counts real tokens: 10 pads + 6 real + 8 new > 16 columns, 14 positions
    ids = np.concatenate([np.zeros((1, 10), int), np.arange(1, 7)[None]], axis=1)
    mask = (ids > 0).astype(int)
    out = ar.generate(ids, params, config, 8, attention_mask=mask)
    np.testing.assert_array_equal(out[0, 10:], ar.generate(np.arange(1, 7), params, config, 8))
    with pytest.raises(ValueError, match="6 prompt tokens \\+ max_new_tokens = 11 is more than"):
        ar.generate(ids, params, config, 11, attention_mask=mask)
    with np.errstate(all="raise"):  # no warning: a tiny temperature is greedy
        np.testing.assert_array_equal(ar.generate([1, 2], params, config, 5, temperature=1e-320, seed=0),
                                      ar.generate([1, 2], params, config, 5))


def test_train_tiny_gpt_refuses_zero_steps():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "train_tiny_gpt.py"
    spec = importlib.util.spec_from_file_location("train_tiny_gpt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for argv in (["--steps", "0"], ["--eval-every", "0"]):
        with pytest.raises(SystemExit):
            module.main(argv)


def test_a_tied_config_over_a_different_stored_head_is_refused():
    """transformers 4.x reads a tied config's head as the token table, 5.x keeps the stored
    lm_head.weight: neither is guessed; the same head as the table is fine."""
    from attention_ref.interop import from_transformers_state, to_transformers

    params, config = _model("llama")  # untied
    state = to_transformers(params, config)
    tied = ar.LMConfig(**{**config.to_dict(), "tie_word_embeddings": True})
    with pytest.raises(ValueError, match="tie_word_embeddings = True but the state holds an 'lm_head.weight'"):
        from_transformers_state(state, tied)
    same = {**state, "lm_head.weight": state["model.embed_tokens.weight"]}
    assert "lm_head.W" not in from_transformers_state(same, tied)


def test_interleaved_rope_is_half_rope_with_the_columns_of_each_head_paired_otherwise():
    """rope_layout="interleaved" pairs features (2i, 2i + 1), "half" pairs (i, i + Dh/2): the same
    model, with W_q's and W_k's columns of each head permuted from one pairing to the other."""
    params, config = _model("llama-interleaved")
    half = ar.LMConfig(**{**config.to_dict(), "rope_layout": "half"})
    Dh = config.d_head
    order = np.concatenate([np.arange(0, Dh, 2), np.arange(1, Dh, 2)])  # interleaved pair i -> (i, i + Dh/2)
    permuted = dict(params)
    for name, heads in (("W_q", config.num_heads), ("W_k", config.num_kv_heads)):
        for i in range(config.num_layers):
            W = params[f"layers.{i}.self_attn.{name}"]
            cols = np.concatenate([h * Dh + order for h in range(heads)])
            permuted[f"layers.{i}.self_attn.{name}"] = W[:, cols]
    ids = np.array([[1, 2, 3, 4, 5, 6]])
    a, _ = ar.lm_forward(ids, params, config)
    b, _ = ar.lm_forward(ids, permuted, half)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    c, _ = ar.lm_forward(ids, params, half)
    assert np.abs(a - c).max() > 1e-3  # the layout matters: the unpermuted weights give other logits
    with pytest.raises(ValueError, match="rope_layout must be one of"):
        ar.LMConfig(**{**config.to_dict(), "rope_layout": "halves"})
    with pytest.raises(ValueError, match="gpt2: rope_layout = 'interleaved' is not supported"):
        ar.LMConfig(**{**CONFIGS["gpt2"].to_dict(), "rope_layout": "interleaved"})


def test_each_step_is_named_by_its_transformers_module():
    from attention_ref.models.lm import step_modules

    assert step_modules(CONFIGS["gpt2"]) == {"embed": "transformer.wte", "block": ["transformer.h.0", "transformer.h.1"],
                                             "final_norm": "transformer.ln_f", "head": "lm_head"}
    assert step_modules(CONFIGS["olmo2"]) == {"embed": "model.embed_tokens", "block": ["model.layers.0", "model.layers.1"],
                                              "final_norm": "model.norm", "head": "lm_head"}
    assert step_modules(CONFIGS["gpt_neox"])["final_norm"] == "gpt_neox.final_layer_norm"


def test_settings_are_a_family_s_own_constants_stored_as_sorted_pairs():
    LMConfig = ar.LMConfig
    """``LMConfig.settings``: a mapping is stored as sorted pairs (lists as tuples), read by
    ``setting``; refused by name for a family that has none; a malformed value named."""
    from attention_ref.models.families import FAMILY
    allowed = [name for name, f in FAMILY.items() if "settings" in f.allowed]
    small = dict(vocab_size=8, d_model=8, num_layers=1, num_heads=2, num_kv_heads=2, d_ff=8, max_positions=8, eps=1e-5)
    with pytest.raises(ValueError, match="settings"):
        LMConfig(family="llama", settings={"q_lora_rank": 4}, **small)
    assert LMConfig(family="llama", **small).setting("anything", 3) == 3
    for name in allowed:  # a family with its own constants (DeepSeek-V3, Qwen3-Next) stores them sorted
        config = LMConfig.from_dict({"model_type": name, **FAMILY[name].example})
        assert list(config.settings) == sorted(config.settings)
        assert all(not isinstance(v, list) for _, v in config.settings)
        with pytest.raises(ValueError, match="settings must be a mapping"):
            LMConfig(**{**config.to_dict(), "settings": [("a",)]})


def test_qwen3_next_reads_its_layer_plan_and_refuses_bad_settings_by_name():
    """Qwen3-Next's reader: transformers' default layer kinds (every ``full_attention_interval``-th layer full), the
    experts' layers from ``decoder_sparse_step`` and ``mlp_only_layers``; a malformed setting named."""
    d = {"model_type": "qwen3_next", **FAMILY["qwen3_next"].example, "num_hidden_layers": 6, "layer_types": None,
         "full_attention_interval": 3, "decoder_sparse_step": 2, "mlp_only_layers": [5]}
    config = ar.LMConfig.from_dict(d)
    assert config.setting("linear_layers") == (True, True, False, True, True, False)
    assert config.setting("moe_layers") == (False, True, False, True, False, False)
    assert config.rotary_dim == 4  # int(head_dim 8 * partial_rotary_factor 0.5)
    dense = ar.LMConfig.from_dict({**d, "num_experts": 0})
    assert dense.num_experts is None and not any(dense.setting("moe_layers"))
    for field, value, match in [("linear_num_value_heads", 3, "must be a multiple of"),
                                ("full_attention_interval", 0, "full_attention_interval.? must be a positive integer"),
                                ("mlp_only_layers", "5", "mlp_only_layers must be"),
                                ("partial_rotary_factor", 0.1, "must be even"),
                                ("norm_topk_prob", 1, "norm_topk_prob")]:
        with pytest.raises(ValueError, match=match):
            ar.LMConfig.from_dict({**d, field: value})
    with pytest.raises(ValueError, match="settings linear_layers must be"):
        ar.LMConfig(**{**config.to_dict(), "settings": {**dict(config.settings), "linear_layers": (True,)}})
