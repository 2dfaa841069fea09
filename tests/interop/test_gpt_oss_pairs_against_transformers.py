"""gpt-oss's new pairs against transformers' ``gpt_oss`` code (4.57.1 and 5.x): the softmax with
sinks (its eager attention function), YaRN (``ROPE_INIT_FUNCTIONS["yarn"]`` and
``apply_rotary_pos_emb``), the mixture of experts (``GptOssMLP``), the load-balancing loss
(``load_balancing_loss_func`` and the model's ``aux_loss``). Small configs, random weights, no
download; forward and every gradient through torch's autograd. Skipped without torch/transformers.

float64 at 1e-12 except where transformers computes in float32, each listed:

* YaRN's ``inv_freq``: ``torch.float`` and the ramp's ``torch.float32`` are float32; the test runs
  the function with both read as float64 (its module's ``torch`` replaced by a proxy), the formula
  untouched. ``GptOssRotaryEmbedding`` forces float32 for cos and sin: the rotation is compared
  with cos and sin computed by its formula in float64; the module itself, unpatched, at 1e-4
  (positions up to 9000 in float32).
* the causal-LM loss upcasts the logits with ``.float()`` (float32): ``loss + coef * aux_loss`` at 1e-6.
* 5.x's ``load_balancing_loss_func`` sums the probabilities in float32 (``.float()``, float32
  accumulators): 1e-6 there, 1e-12 on 4.57.1 (whose float32 load fractions, counts over the rows kept,
  are exact for the 16 or 8 rows used here).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")

from attention_ref.nn.load_balancing import load_balancing_loss_backward, load_balancing_loss_forward  # noqa: E402
from attention_ref.nn.moe import moe_backward, moe_forward  # noqa: E402
from attention_ref.nn.moe_routing import Routing  # noqa: E402
from attention_ref.nn.rope_scaling import rope_parameters, scaled_rope_backward, scaled_rope_forward  # noqa: E402
from attention_ref.variants.sink_softmax import sink_softmax_backward, sink_softmax_forward  # noqa: E402

#: the largest relative differences seen, printed by ``-s`` (reported, never asserted on)
AGREEMENT = {}


def _close(ours, theirs, what, rtol=1e-12):
    """Equal to ``rtol`` of the largest |value|; records the relative difference."""
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    assert np.shape(ours) == theirs.shape, f"{what}: shape {np.shape(ours)} != {theirs.shape}"
    scale = max(float(np.abs(theirs).max()), 1e-300)
    err = float(np.abs(np.asarray(ours, dtype=np.float64) - theirs).max())
    AGREEMENT[what] = max(AGREEMENT.get(what, 0.0), err / scale)
    assert err <= rtol * scale, f"{what}: max abs error {err:.2e} against max |value| {scale:.2e}"


def _leaf(a):
    return torch.tensor(a, dtype=torch.float64, requires_grad=True)


def _config(**kw):
    base = dict(vocab_size=32, hidden_size=8, intermediate_size=6, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2)
    return transformers.GptOssConfig(**{**base, **kw})


def _eager(config):
    """5.x's default experts kernel (grouped_mm) refuses float64: the loop over experts, the
    reference its kernels answer to (4.57.1 has only the loop on CPU)."""
    if hasattr(config, "_experts_implementation"):
        config._experts_implementation = "eager"
    return config


# ------------------------------------------------------------------------ softmax with sinks
@pytest.mark.parametrize("B,H,N,d", [(1, 2, 5, 4), (2, 3, 4, 8)])
def test_sink_attention_equals_gpt_oss_eager_attention(B, H, N, d):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, N, d)) for _ in range(3))
    sinks = rng.standard_normal(H)
    keep = np.tril(np.ones((N, N), bool))
    keep[-1] = False  # the last query sees no key: all its weight goes to the sink
    scale = d ** -0.5
    module = torch.nn.Module()
    module.sinks, module.num_key_value_groups = torch.nn.Parameter(torch.tensor(sinks)), 1
    module.eval()
    additive = torch.tensor(np.where(keep, 0.0, torch.finfo(torch.float64).min))[None, None]
    tq, tk, tv = _leaf(q), _leaf(k), _leaf(v)
    out, weights = gpt_oss.eager_attention_forward(module, tq, tk, tv, additive, scale)
    dout = rng.standard_normal(out.shape)
    out.backward(torch.tensor(dout))
    # ours: scores (masked -inf), the sink softmax, P V
    scores = np.where(keep, scale * q @ k.swapaxes(-1, -2), -np.inf)  # (B, H, N, N)
    P, cache = sink_softmax_forward(scores, sinks)
    ours = (P @ v).swapaxes(1, 2)  # transformers returns (B, N, H, d)
    _close(P, weights, "sink: weights")
    _close(ours, out, "sink: attention output")
    assert np.all(P[..., -1, :] == 0.0)
    dout_heads = dout.swapaxes(1, 2)  # (B, H, N, d)
    dscores, dsinks = sink_softmax_backward(dout_heads @ v.swapaxes(-1, -2), cache)
    _close(scale * dscores @ k, tq.grad, "sink: dq")
    _close(scale * dscores.swapaxes(-1, -2) @ q, tk.grad, "sink: dk")
    _close(P.swapaxes(-1, -2) @ dout_heads, tv.grad, "sink: dv")
    _close(dsinks, module.sinks.grad, "sink: dsinks")


# ------------------------------------------------------------------------ YaRN
class _TorchFloat32Is64:
    """``torch`` with ``torch.float`` and ``torch.float32`` meaning float64: YaRN's formula in float64."""

    float = torch.float64
    float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def _rope_scaling(config):
    """The config's YaRN mapping (4.x: rope_scaling with rope_theta beside it; 5.x: rope_parameters)."""
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        return dict(parameters)
    return {**config.rope_scaling, "rope_theta": config.rope_theta}


YARNS = [{}, {"truncate": True}, {"factor": 4.0, "beta_fast": 16.0, "beta_slow": 2.0},
         {"factor": 8.0, "mscale": 1.0, "mscale_all_dim": 0.5}, {"attention_factor": 1.3},
         {"original_max_position_embeddings": 64, "factor": 2.0}]


@pytest.mark.parametrize("change", YARNS, ids=lambda c: ",".join(c) or "gpt-oss")
@pytest.mark.parametrize("head_dim", [8, 64])
def test_yarn_equals_rope_init_functions(monkeypatch, change, head_dim):
    from transformers import modeling_rope_utils as rope_utils

    config = _config(head_dim=head_dim)
    scaling = {**_rope_scaling(config), **change}
    if isinstance(getattr(config, "rope_parameters", None), dict):  # 5.x (rope_scaling is deprecated there)
        config.rope_parameters = dict(scaling)
    else:  # 4.x
        config.rope_scaling = {key: value for key, value in scaling.items() if key != "rope_theta"}
    init = rope_utils.ROPE_INIT_FUNCTIONS["yarn"]
    float32, factor32 = init(config, "cpu")
    theta, attention_factor = rope_parameters(head_dim, scaling=scaling)
    _close(theta, float32.double(), "yarn: inv_freq (transformers in float32)", rtol=1e-6)
    monkeypatch.setattr(rope_utils, "torch", _TorchFloat32Is64())
    float64, factor64 = init(config, "cpu")
    assert float64.dtype == torch.float64
    _close(theta, float64, "yarn: inv_freq")
    assert attention_factor == pytest.approx(factor64, rel=1e-15) and factor32 == factor64
    AGREEMENT["yarn: attention factor"] = max(AGREEMENT.get("yarn: attention factor", 0.0),
                                              abs(attention_factor - factor64) / factor64)


def test_yarn_rotation_equals_apply_rotary_pos_emb():
    config = _config(head_dim=16)
    scaling = _rope_scaling(config)
    theta, a = rope_parameters(16, scaling=scaling)
    assert a > 1  # gpt-oss's factor 32 gives 0.1 ln 32 + 1
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 2, 7, 16)), rng.standard_normal((2, 2, 7, 16))
    positions = np.array([[0, 1, 2, 3, 4, 5, 6], [3, 9, 40, 100, 4000, 5000, 9000]])
    angles = torch.tensor(positions, dtype=torch.float64)[..., None] * torch.tensor(theta)  # (B, N, D/2)
    cos, sin = angles.cos() * a, angles.sin() * a  # GptOssRotaryEmbedding's formula, in float64
    tq, tk = _leaf(q), _leaf(k)
    rq, rk = gpt_oss.apply_rotary_pos_emb(tq, tk, cos, sin)
    dq, dk = rng.standard_normal(q.shape), rng.standard_normal(k.shape)
    (rq * torch.tensor(dq) + rk * torch.tensor(dk)).sum().backward()
    for x, r, dr, t, name in ((q, rq, dq, tq, "q"), (k, rk, dk, tk, "k")):
        y, cache = scaled_rope_forward(x, positions[:, None, :], scaling=scaling, layout="half")
        _close(y, r, f"yarn: rotated {name}")
        _close(scaled_rope_backward(dr, cache), t.grad, f"yarn: d{name}")
    # the module itself computes the angles, cos and sin in float32: at position 9000 an angle is
    # rounded by up to 9000 * 2^-24 ~ 5e-4 rad, so 1e-4 here
    embedding = gpt_oss.GptOssRotaryEmbedding(config)
    cos32, sin32 = embedding(torch.zeros(1, dtype=torch.float64), torch.tensor(positions))
    _close(cos.numpy(), cos32, "yarn: cos (GptOssRotaryEmbedding, float32)", rtol=1e-4)
    _close(sin.numpy(), sin32, "yarn: sin (GptOssRotaryEmbedding, float32)", rtol=1e-4)


# ------------------------------------------------------------------------ mixture of experts
LIMIT = 7.0  # 4.57.1 fixes GptOssExperts.limit = 7.0 and alpha = 1.702; 5.x reads them from the config


def _far_from_ties_and_clamps(rng, D=8, E=4, F=6, T=12, k=2):
    """Random weights whose routing has no near tie and whose gate/up values stay 1e-3 from the clamps."""
    for _ in range(200):
        x = rng.standard_normal((T, D))
        W_router, b_router = rng.standard_normal((D, E)), rng.standard_normal(E)
        W_gate_up, b_gate_up = 1.5 * rng.standard_normal((E, D, 2 * F)), rng.standard_normal((E, 2 * F))
        W_down, b_down = 0.3 * rng.standard_normal((E, F, D)), rng.standard_normal((E, D))
        logits = np.sort(x @ W_router + b_router, axis=-1)[:, ::-1]
        gu = np.einsum("td,edf->tef", x, W_gate_up) + b_gate_up
        if (logits[:, k - 1] - logits[:, k]).min() > 1e-3 and np.abs(np.abs(gu) - LIMIT).min() > 1e-3 \
                and (gu[..., ::2] > LIMIT).any() and (np.abs(gu[..., 1::2]) > LIMIT).any():
            return x, W_router, b_router, W_gate_up, b_gate_up, W_down, b_down
    raise AssertionError("no draw far from ties and clamps")


def test_moe_equals_gpt_oss_mlp():
    rng = np.random.default_rng(2)
    x, W_router, b_router, W_gate_up, b_gate_up, W_down, b_down = _far_from_ties_and_clamps(rng)
    config = _eager(_config())
    mlp = gpt_oss.GptOssMLP(config).double().eval()
    assert mlp.experts.limit == LIMIT and mlp.experts.alpha == 1.702
    with torch.no_grad():
        mlp.router.weight.copy_(torch.tensor(W_router.T))
        mlp.router.bias.copy_(torch.tensor(b_router))
        mlp.experts.gate_up_proj.copy_(torch.tensor(W_gate_up))
        mlp.experts.gate_up_proj_bias.copy_(torch.tensor(b_gate_up))
        mlp.experts.down_proj.copy_(torch.tensor(W_down))
        mlp.experts.down_proj_bias.copy_(torch.tensor(b_down))
    tx = _leaf(x.reshape(2, 6, 8))
    theirs, _ = mlp(tx)
    dy = rng.standard_normal(theirs.shape)
    theirs.backward(torch.tensor(dy))
    y, cache = moe_forward(x.reshape(2, 6, 8), W_router, b_router, W_gate_up, b_gate_up, W_down, b_down,
                           Routing(2))
    _close(y, theirs, "moe: output")
    dx, dW_router, db_router, dW_gate_up, db_gate_up, dW_down, db_down = moe_backward(dy, cache)
    _close(dx, tx.grad, "moe: dx")
    _close(dW_router, mlp.router.weight.grad.T, "moe: dW_router")
    _close(db_router, mlp.router.bias.grad, "moe: db_router")
    _close(dW_gate_up, mlp.experts.gate_up_proj.grad, "moe: dW_gate_up")
    _close(db_gate_up, mlp.experts.gate_up_proj_bias.grad, "moe: db_gate_up")
    _close(dW_down, mlp.experts.down_proj.grad, "moe: dW_down")
    _close(db_down, mlp.experts.down_proj_bias.grad, "moe: db_down")


def test_clamp_boundary_passes_the_gradient_as_torch_clamp():
    """A gate exactly at the limit: torch.clamp's backward passes the gradient; so does ours."""
    from attention_ref.nn.clamped_swiglu import clamped_swiglu_backward, clamped_swiglu_forward

    x = np.array([[1.0, 0.0]])
    W_gate_up = np.array([[LIMIT, -LIMIT], [0.5, 0.5]])  # gate = 7 exactly, up = -7 exactly
    b, W_down, b_down = np.zeros(2), np.array([[2.0]]), np.zeros(1)
    tx, tW = _leaf(x), _leaf(W_gate_up)
    gu = tx @ tW
    gate, up = gu[..., ::2].clamp(min=None, max=LIMIT), gu[..., 1::2].clamp(min=-LIMIT, max=LIMIT)
    ((up + 1) * gate * torch.sigmoid(gate * 1.702) @ torch.tensor(W_down)).sum().backward()
    _, cache = clamped_swiglu_forward(x, W_gate_up, b, W_down, b_down)
    dx, dW_gate_up, *_ = clamped_swiglu_backward(np.ones((1, 1)), cache)
    assert np.all(dW_gate_up[0] != 0)  # both clamps at their ends pass the gradient
    _close(dx, tx.grad, "moe: dx at the clamp boundary")
    _close(dW_gate_up, tW.grad, "moe: dW_gate_up at the clamp boundary")


# ------------------------------------------------------------------------ load-balancing loss
@pytest.mark.parametrize("masked", [False, True])
def test_load_balancing_loss_equals_transformers(masked):
    rng = np.random.default_rng(3)
    layers = [rng.standard_normal((8, 4)) for _ in range(2)]  # 2 layers of B S = 2 x 4 tokens, E = 4
    # 4 tokens kept per layer: 4.57.1's float32 load fractions (counts / 8) are exact
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0]]) if masked else None
    leaves = tuple(_leaf(a) for a in layers)
    theirs = gpt_oss.load_balancing_loss_func(leaves, 4, 2, None if mask is None else torch.tensor(mask))
    theirs.backward()
    loss, cache = load_balancing_loss_forward(layers, 2, mask)
    rtol = 1e-12 if theirs.dtype == torch.float64 else 1e-6  # 5.x: float32 sums
    _close(loss, theirs.double(), "aux loss", rtol)
    dlogits = load_balancing_loss_backward(1.0, cache)
    _close(dlogits, torch.cat([leaf.grad for leaf in leaves]), "aux loss: dlogits", rtol)


def test_aux_loss_equals_the_models_with_output_router_logits():
    torch.manual_seed(0)
    config = _eager(_config(router_aux_loss_coef=0.25))
    model = transformers.GptOssForCausalLM(config).double().eval()
    ids = torch.tensor([[1, 5, 7, 3, 2, 9, 4, 8], [6, 6, 1, 0, 3, 2, 7, 5]])
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
        out = model(ids, labels=ids, output_router_logits=True)
        lm_only = model(ids, labels=ids).loss
    recorded = [r.detach().numpy() for r in out.router_logits]
    loss, _ = load_balancing_loss_forward(recorded, config.num_experts_per_tok)
    rtol = 1e-12 if out.aux_loss.dtype == torch.float64 else 1e-6
    _close(loss, out.aux_loss.double(), "aux loss: the model's aux_loss", rtol)
    # lm_loss stays the language-modelling loss; coef * aux_loss is added only when asked. (transformers'
    # causal-LM loss upcasts the logits with .float(), float32 in a float64 model: 1e-6 for this sum)
    _close(float(lm_only) + 0.25 * float(loss), out.loss, "aux loss: loss + coef * aux_loss", 1e-6)
