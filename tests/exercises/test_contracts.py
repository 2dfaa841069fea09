"""Each exercise's cases come from its input contract: the default run covers every value of
every feature, changing one feature per case around a common base, and each case's inputs
are what its features say."""
import numpy as np
import pytest

from attention_ref.exercises import EXERCISES, check
from attention_ref.exercises.contracts import CONTRACTS, PAIRS


@pytest.mark.parametrize("name", list(EXERCISES))
def test_every_feature_value_is_exercised_one_at_a_time(name):
    e = EXERCISES[name]
    contract = e.contract
    assert contract is CONTRACTS[name]
    cases = e.cases(np.random.default_rng(0))
    base = contract.base()
    assert cases[0].features == base and cases[0].feature in ("", "scores near 800")
    for feature, values in contract.features.items():
        assert len(values) >= 2 and len(set(map(repr, values))) == len(values), feature
        seen = {repr(c.features[feature]) for c in cases}
        assert seen == set(map(repr, values)), (feature, seen)  # every value, none invented
    together = [dict(t) for t in contract.together]
    pairs = [c for c in cases if c.feature.startswith(PAIRS + ": ")]
    assert pairs and cases[-len(pairs):] == pairs  # the covering set comes last
    for case in cases[1:len(cases) - len(pairs)]:
        changed = {k: v for k, v in case.features.items() if v != base[k]}
        assert len(changed) == 1 or changed in together, changed  # one feature, or a named combination
        assert case.feature  # said in the report: "(dtype = float32)"


@pytest.mark.parametrize("name", list(EXERCISES))
def test_the_default_run_covers_every_pair_of_feature_values(name):
    """Issue 42: every value of a feature meets every value of every other feature in some
    case (but the combinations kept apart), and the covering set is the same for every seed."""
    contract = EXERCISES[name].contract
    cases = contract.cases(np.random.default_rng(0))
    names = list(contract.features)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for va in contract.features[a]:
                for vb in contract.features[b]:
                    if any(pair == {a: va, b: vb} for pair in contract.apart):
                        assert not any(c.features[a] == va and c.features[b] == vb for c in cases)
                        continue
                    assert any(c.features[a] == va and c.features[b] == vb for c in cases), (a, va, b, vb)
    assert [c.features for c in contract.cases(np.random.default_rng(7))] == [c.features for c in cases]


@pytest.mark.parametrize("name", list(EXERCISES))
def test_the_inputs_are_what_the_features_say(name):
    e = EXERCISES[name]
    for case in e.cases(np.random.default_rng(1)):
        arrays = [a for a in case.inputs if isinstance(a, np.ndarray) and a.dtype.kind == "f"]
        dtype = np.float32 if case.features["dtype"] == "float32" else np.float64
        assert arrays and all(a.dtype == dtype for a in arrays if not np.isneginf(a).any() or a.ndim > 2), name
        out, cache = e.forward(*case.inputs, **case.kwargs)
        assert np.asarray(out).dtype == dtype and np.isfinite(out).all()


def test_the_contract_covers_what_issue_29_lists():
    f = {name: c.features for name, c in CONTRACTS.items()}
    assert all(set(v["dtype"]) == {"float64", "float32"} for v in f.values())
    att = f["scaled_dot_product_attention_backward"]
    assert {"given"} <= set(att["scale"]) and {"k, v broadcast", "q broadcast", "none", "two"} <= set(att["batch"])
    assert {"bool", "float -inf", "causal"} <= set(att["mask"]) and {"n_q", "n_k", "d_k", "batch"} <= set(att["size_1"])
    mh = f["multi_head_attention_backward"]
    assert {"d_v = d_k"} <= set(mh["head_widths"]) and {"none"} <= set(mh["bias"]) and 1 in mh["h"]
    assert {"k, v broadcast", "q broadcast"} <= set(mh["batch"])
    assert {"q, v only", "k, o only"} <= set(mh["bias"])  # each bias present in one, None in the other
    assert {"d_model = h*d_k", "d_model != h*d_k"} == set(mh["model_width"])
    enc = f["encoder_block_backward"]
    assert set(enc["activation"]) == {"relu", "gelu", "gelu_exact"} and set(enc["norm_first"]) == {False, True}
    assert {0, 1, 2} <= set(f["linear_backward"]["leading"]) and "no" in f["linear_backward"]["bias"]
    assert f["split_heads_backward"]["h"][0] != f["split_heads_backward"]["d_head"][0]  # the base has H != Dh
    flash = f["flash_attention_backward"]
    assert {"k, v broadcast", "k, v no batch"} <= set(flash["batch"])
    assert 3 in flash["block_size"] and "causal and window" in flash["rule"] and "float -inf" in flash["mask"]


def test_the_contract_covers_what_issue_42_lists():
    """Every input the docstrings accept: a query that may attend no key wherever a mask is
    taken, broadcasting on the second batch axis, every mask shape, scale= and eps= in the
    encoder block, eps= in layer norm."""
    f = {name: c.features for name, c in CONTRACTS.items()}
    assert "an empty row" in f["softmax_backward"]["mask"] and "an empty row" in f["encoder_block_backward"]["mask"]
    for name in ("scaled_dot_product_attention_backward", "flash_attention_backward",
                 "multi_head_attention_backward"):
        assert "bool, an empty row" in f[name]["mask"], name
        assert {"(n_k,)", "(1, n_k)", "per batch item"} <= set(f[name]["mask_shape"]), name
        assert "k, v broadcast on axis 2" in f[name]["batch"], name
    assert "given" in f["encoder_block_backward"]["scale"] and 0.1 in f["encoder_block_backward"]["eps"]
    assert 0.1 in f["layer_norm_backward"]["eps"]


def test_an_empty_row_has_zero_weights_output_and_gradients():
    """The README's promise, on the checker's own cases: no NaN, and zeros on the row."""
    for name in ("scaled_dot_product_attention_backward", "flash_attention_backward"):
        e = EXERCISES[name]
        rng = np.random.default_rng(0)
        case = next(c for c in e.cases(rng) if c.feature == "mask = bool, an empty row")
        out, cache = e.forward(*case.inputs, **case.kwargs)
        assert np.isfinite(out).all() and not out[..., -1, :].any()
        dq = e.run(e.backward, np.ones_like(out), cache)[0]
        assert np.isfinite(dq).all() and not dq[..., -1, :].any()


@pytest.mark.parametrize("name", list(EXERCISES))
def test_the_reference_passes_on_random_draws_from_the_contract(name):
    """The contract's sample() draws combinations of every feature (what the mutation test
    sweeps): the library's own backward is right on all of them."""
    e = EXERCISES[name]
    rng = np.random.default_rng(2)
    for _ in range(20):
        case = e.contract.sample_case(rng)
        out, cache = e.forward(*case.inputs, **case.kwargs)
        assert np.isfinite(out).all(), case.features
        e.run(e.backward, rng.standard_normal(np.shape(out)).astype(np.asarray(out).dtype), cache)


def test_a_fix_right_for_square_float64_inputs_only_fails():
    """Two of the false passes issue 29 lists, as one attempt each: float64 gradients for
    float32 inputs, and dk and dv not summed over the batch axes k and v were broadcast along."""
    from attention_ref import scaled_dot_product_attention_backward as right

    def float64(dout, cache):
        return tuple(g.astype(np.float64) for g in right(dout, cache))

    def unsummed(dout, cache):
        P, s = cache.weights, cache.scale
        dP = dout @ np.swapaxes(cache.v, -1, -2)
        dS = P * (dP - (P * dP).sum(-1, keepdims=True))
        return right(dout, cache)[0], np.swapaxes(dS, -1, -2) @ cache.q * s, np.swapaxes(P, -1, -2) @ dout

    name = "scaled_dot_product_attention_backward"
    assert "dtype = 'float32' in the wrong cases" in check(name, float64).diagnosis
    assert "'k, v broadcast' in the wrong cases" in check(name, unsummed).diagnosis


def test_a_multi_head_backward_that_leaves_dkey_at_the_querys_batch_shape_fails():
    """Key and value shared by every batch item of the query (issue 29, a third student's false
    pass): a backward whose attention step does not sum dk and dv back gives dkey and dvalue
    the query's batch axes."""
    from attention_ref import linear_backward, merge_heads_backward, split_heads_backward

    def unsummed(dout, cache):
        dconcat, dW_o, db_o = linear_backward(dout, cache.o_proj)
        a, dheads = cache.attention, merge_heads_backward(dconcat, cache.num_heads)
        P, v, q, k = a.weights, a.v, a.q, a.k
        dP = dheads @ np.swapaxes(v, -1, -2)
        dS = P * (dP - (P * dP).sum(-1, keepdims=True))
        grads = {"W_o": dW_o, "b_o": db_o}
        heads = (dS @ k * a.scale, np.swapaxes(dS, -1, -2) @ q * a.scale, np.swapaxes(P, -1, -2) @ dheads)
        inputs = []
        for name, d, proj in zip("qkv", heads, (cache.q_proj, cache.k_proj, cache.v_proj)):
            d = split_heads_backward(d)
            x = np.broadcast_to(proj.x, d.shape[:-1] + proj.x.shape[-1:])  # the query's batch axes
            dx = d @ proj.W.T
            grads["W_" + name] = x.reshape(-1, x.shape[-1]).T @ d.reshape(-1, d.shape[-1])
            grads["b_" + name] = d.reshape(-1, d.shape[-1]).sum(0) if proj.has_bias else None
            inputs.append(dx)
        return (*inputs, {key: grads[key] for key in cache.param_keys})

    d = check("multi_head_attention_backward", unsummed).diagnosis
    assert "batch = " in d and "'k, v broadcast'" in d.split(" in the wrong cases")[0], d


def test_float32_with_the_exact_gelu_is_a_pair_the_default_run_draws():
    """Issue 42: an exact GELU computed with np.vectorize(math.erf) returns float64 gradients for
    float32 inputs; no one-feature case has both, the pairs do, and the report names the pair."""
    from attention_ref import encoder_block_backward

    def float64_with_exact_gelu(dout, cache):
        dx, grads = encoder_block_backward(dout, cache)
        if cache.ffn.sublayer.activation == "gelu_exact" and dx.dtype == np.float32:
            return dx.astype(np.float64), {k: v.astype(np.float64) for k, v in grads.items()}
        return dx, grads

    result = check("encoder_block_backward", float64_with_exact_gelu)
    assert not result.ok
    said = result.diagnosis
    assert "dtype = 'float32' with activation = 'gelu_exact'" in said and "in every wrong case and in no right" \
        " one (each alone is right" in said, said
