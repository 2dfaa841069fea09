"""Multi-head latent attention (nn/mla.py) against transformers' ``DeepseekV3Attention`` on 4.57 and 5.x:
with and without ``q_lora_rank``, RoPE pairs interleaved (``rope_interleave``, whose transformers output
is de-interleaved: the same dot products) or half, the YaRN scale with ``mscale_all_dim``; output and
every gradient at 1e-10 in float64. transformers' float32 steps: its RMSNorms run in float64 by
``moe_models_in_float64`` (the same formula); the cos and sin are given to the module (computed here in
float64 from the same frequencies) rather than by its float32 rotary embedding; ``sdpa`` keeps the
softmax in float64."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attention_ref.interop import moe_models_in_float64  # noqa: E402
from attention_ref.nn.mla import MLAShape, mla_backward, mla_forward, mla_param_shapes, mla_scale  # noqa: E402

D = 12
#: ours -> (their module, transposed)
THEIRS = {"W_q": "q_proj", "W_q_a": "q_a_proj", "W_q_b": "q_b_proj", "W_kv_a": "kv_a_proj_with_mqa",
          "W_kv_b": "kv_b_proj", "W_o": "o_proj", "q_a_norm.weight": "q_a_layernorm", "kv_a_norm.weight": "kv_a_layernorm"}
CASES = [dict(q_lora_rank=None, rope_interleave=True), dict(q_lora_rank=6, rope_interleave=False),
         dict(q_lora_rank=6, rope_interleave=True, yarn=True)]


@pytest.mark.parametrize("case", CASES, ids=["no-q-lora-interleaved", "q-lora-half", "q-lora-interleaved-yarn"])
def test_mla_equals_deepseek_v3_attention(case):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale_all_dim": 1.0,
            "mscale": 1.0, "beta_fast": 32, "beta_slow": 1} if case.get("yarn") else None
    config = transformers.DeepseekV3Config(hidden_size=D, num_attention_heads=3, num_key_value_heads=3,
                                           q_lora_rank=case["q_lora_rank"], kv_lora_rank=5, qk_nope_head_dim=4,
                                           qk_rope_head_dim=4, v_head_dim=3, rope_interleave=case["rope_interleave"],
                                           rope_scaling=rope, max_position_embeddings=64,
                                           attn_implementation="sdpa")
    attn = deepseek.DeepseekV3Attention(config, layer_idx=0).double()
    shape = MLAShape(3, case["q_lora_rank"], 5, 4, 4, 3, eps=config.rms_norm_eps,
                     interleaved=case["rope_interleave"],
                     scale=mla_scale(8, 4.0, 1.0) if rope else None)
    assert shape.scale is None or abs(attn.scaling - shape.scale) < 1e-15  # the YaRN scale, as transformers
    rng = np.random.default_rng(0)
    p = {name: (1.0 + rng.random(s) if name.endswith("norm.weight") else 0.5 * rng.standard_normal(s))
         for name, s in mla_param_shapes(D, shape).items()}
    with torch.no_grad():
        for name, value in p.items():
            module = getattr(attn, THEIRS[name])
            module.weight.copy_(torch.tensor(value if value.ndim == 1 else value.T))
    theta = 50.0 ** (-np.arange(0, 4, 2) / 4)
    positions = np.arange(2, 8)
    angles = positions[:, None] * theta  # (N, dr/2)
    emb = np.concatenate([angles, angles], -1)[None]  # (1, N, dr): transformers' cat(freqs, freqs)
    x = rng.standard_normal((2, 6, D))
    tx = torch.tensor(x, requires_grad=True)
    with moe_models_in_float64():
        theirs = attn(tx, position_embeddings=(torch.tensor(np.cos(emb)), torch.tensor(np.sin(emb))),
                      attention_mask=None)[0]
    dy = rng.standard_normal(theirs.shape)
    theirs.backward(torch.tensor(dy))
    y, cache = mla_forward(x, p, shape, theta, positions)
    np.testing.assert_allclose(y, theirs.detach().numpy(), rtol=0, atol=1e-10 * np.abs(y).max())
    dx, grads = mla_backward(dy, cache)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=0, atol=1e-10 * np.abs(dx).max())
    for name, g in grads.items():
        their_grad = getattr(attn, THEIRS[name]).weight.grad.numpy()
        their_grad = their_grad if g.ndim == 1 else their_grad.T
        np.testing.assert_allclose(g, their_grad, rtol=0, atol=1e-10 * np.abs(g).max(), err_msg=name)
