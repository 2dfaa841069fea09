"""DeepSeek-V3's decoder block (nn/deepseek_block.py): its backward against finite differences in float64 on a
dense and a MoE layer (routing 1e-3 from any tie), and its bad inputs named. Against transformers:
tests/interop/test_deepseek_block_against_transformers.py."""
import numpy as np
import pytest

from attention_ref.nn.deepseek_block import DeepSeekLayer, deepseek_block_backward, deepseek_block_forward
from attention_ref.nn.mla import MLAShape, mla_param_shapes
from attention_ref.nn.moe_routing import Routing
from _helpers import check_gradients

D, E, F = 12, 8, 4
SHAPE = MLAShape(3, 6, 5, 4, 4, 3)
THETA, POSITIONS = 50.0 ** (-np.arange(0, 4, 2) / 4), np.arange(4)


def _params(rng, moe):
    p = {f"self_attn.{n}": (1 + 0.2 * rng.standard_normal(s) if len(s) == 1 else 0.5 * rng.standard_normal(s))
         for n, s in mla_param_shapes(D, SHAPE).items()}
    p["input_norm.weight"], p["post_attention_norm.weight"] = 1 + 0.2 * rng.standard_normal((2, D))
    if not moe:
        return {**p, "mlp.W_gate": rng.standard_normal((D, 10)), "mlp.W_up": rng.standard_normal((D, 10)),
                "mlp.W_down": 0.5 * rng.standard_normal((10, D))}
    return {**p, "mlp.W_router": 0.3 * rng.standard_normal((D, E)),
            "mlp.e_score_correction_bias": 0.1 * rng.standard_normal(E),
            "mlp.experts.W_gate": rng.standard_normal((E, D, F)), "mlp.experts.W_up": rng.standard_normal((E, D, F)),
            "mlp.experts.W_down": 0.5 * rng.standard_normal((E, F, D)), "mlp.shared.W_gate": rng.standard_normal((D, F)),
            "mlp.shared.W_up": rng.standard_normal((D, F)), "mlp.shared.W_down": 0.5 * rng.standard_normal((F, D))}


def _far_from_ties(cache, bias, gap):
    rc = cache.mlp[0].router
    c, idx, routing = rc.p + bias, rc.idx, rc.routing
    size = E // routing.n_group
    groups = np.sort(np.sort(c.reshape(len(c), routing.n_group, size), -1)[..., -2:].sum(-1), -1)[:, ::-1]
    if (groups[:, routing.topk_group - 1] - groups[:, routing.topk_group]).min() < gap:
        return False
    for t in range(len(c)):
        kept = set(int(e) // size for e in idx[t])
        rest = [c[t, e] for e in range(E) if e not in idx[t] and e // size in kept]
        if rest and c[t, idx[t]].min() - max(rest) < gap:
            return False
    return True


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_deepseek_block_gradcheck(moe):
    layer = DeepSeekLayer(SHAPE, 1e-6, Routing(2, "sigmoid_topk", True, 4, 2, 2.5) if moe else None)
    rng = np.random.default_rng(3)
    for _ in range(100):
        p, x = _params(rng, moe), rng.standard_normal((1, 4, D))
        _, cache = deepseek_block_forward(x, p, layer, THETA, POSITIONS)
        if not moe or _far_from_ties(cache, p["mlp.e_score_correction_bias"], 1e-3):
            break
    else:
        raise AssertionError("no draw far from ties")
    bias = p.pop("mlp.e_score_correction_bias", None)
    extra = {} if bias is None else {"mlp.e_score_correction_bias": bias}

    def backward(dy, cache):
        dx, g = deepseek_block_backward(dy, cache)
        g.pop("mlp.e_score_correction_bias", None)  # a buffer: no gradient (zeros)
        return dx, g
    check_gradients(lambda x, q: deepseek_block_forward(x, {**q, **extra}, layer, THETA, POSITIONS), backward,
                    x, p, names=["x", "params"])


def test_deepseek_block_bad_inputs_are_named():
    rng = np.random.default_rng(4)
    p, x = _params(rng, True), rng.standard_normal((1, 4, D))
    layer = DeepSeekLayer(SHAPE, 1e-6, Routing(2, "sigmoid_topk", True, 4, 2, 2.5))
    with pytest.raises(ValueError, match=r"^params\['mlp.shared.W_down'\] must have shape \(4, 12\) for x of width"
                                         r" 12, got \(12, 4\)$"):
        deepseek_block_forward(x, {**p, "mlp.shared.W_down": p["mlp.shared.W_down"].T}, layer, THETA, POSITIONS)
    with pytest.raises(ValueError, match=r"^params lack \['mlp.W_gate', 'mlp.W_up', 'mlp.W_down'\] \(a dense layer\)$"):
        deepseek_block_forward(x, p, layer._replace(routing=None), THETA, POSITIONS)
    with pytest.raises(TypeError, match=r"^layer must be an attention_ref.nn.DeepSeekLayer, got tuple$"):
        deepseek_block_forward(x, p, tuple(layer), THETA, POSITIONS)
