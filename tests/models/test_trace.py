"""``lm_trace`` without torch: its names for every family, ``only=``, the dtype, and its values
against plain computations (the trace's last entry is ``lm_forward``'s logits; each decoder
layer's output is its input plus its sub-layers' contributions; the probabilities are the
softmax of the scores; the scores are ``scale q k^T`` of the rotated queries and keys). The
values against transformers' modules: tests/interop/test_trace_against_transformers.py."""
import numpy as np
import pytest

import attention_ref as ar
from attention_ref.models.config import family_of
from attention_ref.models.families import FAMILIES, FAMILY

LLAMA = dict(vocab_size=13, d_model=8, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=12, max_positions=64,
             eps=1e-6, rope_theta=100.0, tie_word_embeddings=False, pad_token_id=0)
CONFIGS = {
    "gpt2": ar.LMConfig(family="gpt2", vocab_size=11, d_model=8, num_layers=2, num_heads=2, num_kv_heads=2, d_ff=12,
                        max_positions=16, eps=1e-5),
    "gpt_neox": ar.LMConfig(family="gpt_neox", vocab_size=11, d_model=8, num_layers=2, num_heads=2, num_kv_heads=2,
                            d_ff=12, max_positions=64, eps=1e-5, rope_theta=100.0, rotary_pct=0.5),
    "gemma3_text": ar.LMConfig(**LLAMA, family="gemma3_text", head_dim=4, sliding_window=2, rope_local_theta=10.0,
                               query_pre_attn_scalar=3.0, layer_types=("sliding_attention", "full_attention")),
    "gemma2": ar.LMConfig(**LLAMA, family="gemma2", head_dim=4, sliding_window=2, attn_softcap=0.5,
                          rope_local_theta=100.0, query_pre_attn_scalar=3.0, final_softcap=1.0,
                          layer_types=("sliding_attention", "full_attention")),
    "smollm3": ar.LMConfig(**LLAMA, family="smollm3", rope_layers=(True, False)),
    "bloom": ar.LMConfig(family="bloom", vocab_size=11, d_model=8, num_layers=2, num_heads=2, num_kv_heads=2, d_ff=32,
                         max_positions=1 << 30, eps=1e-5),
    "gpt_oss": ar.LMConfig(**{**LLAMA, "d_ff": 6}, family="gpt_oss", head_dim=4, sliding_window=2, num_experts=4,
                           experts_per_token=2, layer_types=("sliding_attention", "full_attention"),
                           rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                         "truncate": False}),
    **{f: ar.LMConfig(**LLAMA, family=f) for f in ("llama", "qwen2", "qwen3", "mistral", "phi3", "olmo2")},
    "qwen3_moe": ar.LMConfig(**LLAMA, family="qwen3_moe", num_experts=4, experts_per_token=2,
                             settings={"sparse_layers": (False, True), "moe_d_ff": 6, "norm_topk_prob": True}),
    # one linear-attention layer (no scores) and one full layer, experts and a gated shared expert on both
    "qwen3_next": ar.LMConfig.from_dict({"model_type": "qwen3_next", **FAMILY["qwen3_next"].example}),
    # DeepSeek-V3: a dense layer, then a routed one (4 experts in 2 groups, a shared expert); YaRN with mscale_all_dim
    "deepseek_v3": ar.LMConfig.from_dict({**FAMILY["deepseek_v3"].example, "model_type": "deepseek_v3",
                                          "num_hidden_layers": 2, "vocab_size": 13}),
}
IDS = np.array([[1, 5, 2, 7, 3], [4, 4, 9, 1, 2]])


def _run(family, dtype=np.float64, **kwargs):
    config = CONFIGS[family]
    params = ar.init_lm_params(config, seed=1, dtype=dtype)
    params = {k: v + (0.3 * np.random.default_rng(2).standard_normal(v.shape)).astype(dtype) for k, v in params.items()}
    return config, params, ar.lm_trace(IDS, params, config, **kwargs)


def test_every_family_is_traced():
    assert set(CONFIGS) == set(FAMILIES)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_names_and_the_logits(family):
    config, params, trace = _run(family)
    fam = family_of(config)
    names = list(trace)
    logits, _ = ar.lm_forward(IDS, params, config)
    assert names[-1] == "" and np.array_equal(trace[""], logits)  # the whole model: its logits
    assert names[-2] == "lm_head" and names[-3] == fam.base[:-1]
    layers = [fam.their_layer.format(i=i)[:-1] for i in range(config.num_layers)]
    assert [n for n in names if n in layers] == layers  # each decoder layer, in order
    for i, layer in enumerate(layers):
        inside = [n for n in names if n.startswith(layer + ".") or n.startswith(layer + ":")]
        assert names.index(layer) > max(names.index(n) for n in inside)  # a module after its children
        steps = [n for n in inside if ":" in n and not n.startswith(layer + ":")]  # BLOOM's layer: its probs too
        if layer + ".linear_attn" in inside:  # Qwen3-Next's linear attention: a recurrent state, no scores
            assert not steps
            np.testing.assert_allclose(trace[layer], (trace[layers[i - 1]] if i else trace[names[0]])
                                       + trace[layer + ".linear_attn"] + trace[layer + ".mlp"], rtol=1e-12, atol=1e-12)
            continue
        attention = [n.split(":")[0] for n in steps]
        assert len(set(attention)) == 1 and [n.split(":")[1] for n in steps] == ["q_rope", "k_rope", "scores", "probs"]
        attention = attention[0]
        assert names.index(attention) > names.index(attention + ":probs")
        if family == "bloom":  # its attention and MLP modules add the residual: their outputs are h and y
            before = trace[layers[i - 1]] if i else trace["transformer.word_embeddings_layernorm"]
            np.testing.assert_allclose(trace[attention], before + trace[attention + ".dense"], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(trace[layer], trace[attention] + trace[layer + ".mlp.dense_4h_to_h"],
                                       rtol=1e-12, atol=1e-12)
            assert np.array_equal(trace[layer + ".mlp"], trace[layer])
            assert np.array_equal(trace[layer + ":probs"], trace[attention + ":probs"])
            continue
        # the decoder layer's output is its input plus what its attention and MLP add (after their
        # norms where the family puts norms after the sub-layers)
        embeddings = names[:names.index(next(n for n in names if n.startswith(layers[0])))]
        before = trace[layers[i - 1]] if i else sum(trace[n] for n in embeddings)  # GPT-2: wte + wpe
        post = fam.features.norm_placement != "pre"
        a = trace[layer + ".post_attention_layernorm"] if post else trace[attention]
        m = trace[layer + ".post_feedforward_layernorm"] if post else trace[layer + ".mlp"]
        np.testing.assert_allclose(trace[layer], before + a + m, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_scores_and_probabilities(family):
    config, params, trace = _run(family)
    fam = family_of(config)
    attention = [n.split(":")[0] for n in trace if n.endswith(":probs")][0]
    q, k = trace[attention + ":q_rope"], trace[attention + ":k_rope"]  # (B, H, T, Dh), (B, Hkv, T, Dh)
    scores, probs = trace[attention + ":scores"], trace[attention + ":probs"]
    H, T = q.shape[1], q.shape[2]
    assert scores.shape == probs.shape == (2, H, T, T)
    # the softmax of the scores, row by row (masked keys -inf: probability 0); gpt-oss: each head's
    # sink logit in the denominator too
    sinks = params.get(f"{fam.layer_prefix}.0.self_attn.sinks", np.full(H, -np.inf))
    for b in range(2):
        for h in range(H):
            for i in range(T):
                m = max(scores[b, h, i].max(), sinks[h])
                row = np.exp(scores[b, h, i] - m)
                np.testing.assert_allclose(probs[b, h, i], row / (row.sum() + np.exp(sinks[h] - m)), rtol=1e-12,
                                           atol=1e-15)
    # causal: no key after the query
    assert np.all(np.isneginf(scores[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]]))
    # visible scores: one factor times q . k, query head h on key/value head h // G (Gemma 2: then capped)
    G = H // k.shape[1]
    raw = np.einsum("bhid,bhjd->bhij", q, np.repeat(k, G, axis=1))[np.isfinite(scores)]
    s = scores[np.isfinite(scores)]
    if fam.model_type == "gemma2":
        s = np.arctanh(s / config.attn_softcap) * config.attn_softcap
    if fam.model_type == "bloom":  # ALiBi's term m_h j on key j, then one factor times q . k
        slopes = ar.alibi_slopes(H)[None, :, None, None] * np.arange(T)
        s = s - np.broadcast_to(slopes, scores.shape)[np.isfinite(scores)]
    factor = (s @ raw) / (raw @ raw)
    np.testing.assert_allclose(s, factor * raw, rtol=1e-9, atol=1e-12)
    assert factor > 0


def test_only_a_list_or_a_predicate():
    config, params, full = _run("llama")
    chosen = ["model.layers.1.self_attn:probs", "model.embed_tokens", ""]
    picked = ar.lm_trace(IDS, params, config, only=chosen)
    assert list(picked) == [n for n in full if n in chosen]  # in the trace's order
    assert all(np.array_equal(picked[n], full[n]) for n in chosen)
    mlps = ar.lm_trace(IDS, params, config, only=lambda name: name.endswith(".mlp"))
    assert list(mlps) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    with pytest.raises(ValueError, match="only names modules"):
        ar.lm_trace(IDS, params, config, only=["model.layer.0.mlp"])
    with pytest.raises(TypeError, match="only must be"):
        ar.lm_trace(IDS, params, config, only="model.norm")


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_float32_stays_float32_and_params_untouched(family):
    config = CONFIGS[family]
    params = ar.init_lm_params(config, seed=1, dtype=np.float32)
    copies = {k: v.copy() for k, v in params.items()}
    trace = ar.lm_trace(IDS, params, config)
    assert {v.dtype for v in trace.values()} == {np.dtype(np.float32)}
    assert all(np.array_equal(params[k], copies[k]) for k in params)
    logits, _ = ar.lm_forward(IDS, params, config)
    assert np.array_equal(trace[""], logits)


def test_bad_input_named():
    config, params, _ = _run("llama")
    with pytest.raises(TypeError, match="config must be an LMConfig"):
        ar.lm_trace(IDS, params, config.to_dict())
    with pytest.raises(ValueError, match="ids"):
        ar.lm_trace(IDS + 100, params, config)


def test_4x_names():
    assert ar.trace_names_4x(CONFIGS["gpt_neox"]) == {"lm_head": "embed_out"}
    assert ar.trace_names_4x(CONFIGS["llama"]) == {}


def _doc_row(family):
    """The row of docs/whole_models.md's trace table for ``family``, from the trace of its tiny model."""
    config, _, trace = _run(family)
    fam = family_of(config)
    names, prefix = list(trace), fam.their_layer.format(i=0)
    first = next(i for i, n in enumerate(names) if n.startswith(prefix[:-1]))
    last = names.index(fam.their_layer.format(i=config.num_layers - 1)[:-1])
    block = ", ".join(f"`{n[len(prefix) - 1:] if n.startswith(prefix[:-1] + ':') else n[len(prefix):]}`"
                      for n in names[first:names.index(prefix[:-1])])  # the layer's own steps as `:probs`
    after = ", ".join(f"`{n}`" if n else '`""`' for n in names[last + 1:])
    return (f"| `{family}` | {', '.join(f'`{n}`' for n in names[:first])} | `{fam.their_layer.format(i='<i>')}` +"
            f" {block}, then `{fam.their_layer.format(i='<i>')[:-1]}` | {after} |")


def test_the_documented_names_are_the_traces():
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / "docs" / "whole_models.md").read_text(encoding="utf-8")
    for family in FAMILIES:
        assert _doc_row(family) in doc.splitlines(), f"docs/whole_models.md: the trace row of {family}:\n{_doc_row(family)}"


if __name__ == "__main__":  # print the rows of docs/whole_models.md's trace table
    for family in FAMILIES:
        print(_doc_row(family))
