"""The relative-position pairs (issue 48) against transformers (4.57.1 and 5.x): ALiBi against
BLOOM's ``build_alibi_tensor`` (12 and 20 heads, not powers of two; left-padded masks, the
positions from the mask's cumulative sum), T5's buckets against ``T5Attention._relative_position_bucket``
and ``compute_bias``, and T5's attention layer (bidirectional and causal) with the table's
gradient through torch's autograd. Small configs, random weights, float64; skipped without torch.

Float32 steps, each listed: ``build_alibi_tensor`` computes the slopes in float32; it is run
inside :func:`attention_ref.interop.float64.bloom_in_float64` (its ``torch.float32`` read as
float64) for the 1e-12 comparison, and as it is at float32's rounding (1e-6: powers of a float32
base, a few ulps). transformers 4.57's T5 takes its softmax on ``scores.float()`` (float32): the
layer runs with ``Tensor.float`` returning a float64 tensor unchanged (the long distances still
become float32 in the buckets, as there); 5.x takes the softmax in the model's dtype already.
T5's buckets take the logarithm in float32 on both sides (``t5_buckets`` computes it as
transformers does).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers.models.bloom import modeling_bloom  # noqa: E402
from transformers.models.t5 import modeling_t5  # noqa: E402

from attention_ref.interop.float64 import bloom_in_float64  # noqa: E402
from attention_ref.variants.alibi import alibi_bias, alibi_positions, alibi_slopes  # noqa: E402
from attention_ref.variants.t5_bias import t5_bias_backward, t5_bias_forward, t5_buckets  # noqa: E402
from _helpers import assert_close  # noqa: E402

MASKS = [np.ones((2, 7), dtype=np.int64),
         np.array([[0, 0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])]  # left-padded


@pytest.mark.parametrize("heads", [8, 12, 20])
@pytest.mark.parametrize("mask", MASKS, ids=["full", "left_padded"])
def test_alibi_against_build_alibi_tensor(heads, mask):
    ours = alibi_bias(alibi_slopes(heads), alibi_positions(mask))  # (B, H, 1, N)
    ours = ours.reshape(mask.shape[0] * heads, 1, mask.shape[1])
    with bloom_in_float64():
        theirs = modeling_bloom.build_alibi_tensor(torch.tensor(mask), heads, torch.float64).numpy()
    assert_close(ours, theirs, rtol=1e-12, atol=0, what=f"ALiBi, {heads} heads, transformers' code in float64")
    as_is = modeling_bloom.build_alibi_tensor(torch.tensor(mask), heads, torch.float64).numpy()
    assert_close(ours, as_is, rtol=1e-6, atol=0, what="ALiBi against the float32 slopes")


def _t5_config(decoder, buckets=8, max_distance=12):
    return transformers.T5Config(d_model=8, d_kv=3, num_heads=2, d_ff=4, relative_attention_num_buckets=buckets,
                                 relative_attention_max_distance=max_distance, dropout_rate=0.0, is_decoder=decoder,
                                 attn_implementation="eager")


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 12)])
def test_t5_buckets_against_transformers(bidirectional, num_buckets, max_distance):
    relative = torch.arange(300)[None, :] - torch.arange(300)[:, None]
    theirs = modeling_t5.T5Attention._relative_position_bucket(relative, bidirectional=bidirectional,
                                                               num_buckets=num_buckets, max_distance=max_distance)
    ours = t5_buckets(300, 300, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    assert np.array_equal(ours, theirs.numpy())


@pytest.fixture
def float_keeps_float64(monkeypatch):
    """4.57's T5 softmax is on ``scores.float()``: a float64 tensor stays float64 (other dtypes as before)."""
    original = torch.Tensor.float
    monkeypatch.setattr(torch.Tensor, "float",
                        lambda self, *a, **k: self if self.dtype == torch.float64 else original(self, *a, **k))


@pytest.mark.parametrize("decoder", [False, True], ids=["bidirectional", "causal"])
def test_t5_attention_layer_and_table_gradient(decoder, float_keeps_float64):
    torch.manual_seed(0)
    n, config = 6, _t5_config(decoder)
    layer = modeling_t5.T5Attention(config, has_relative_attention_bias=True, layer_idx=0).double()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, n, 8))
    with torch.no_grad():
        layer.relative_attention_bias.weight.copy_(torch.tensor(rng.standard_normal((8, 2))))
    table = layer.relative_attention_bias.weight.detach().numpy()
    buckets = t5_buckets(n, n, bidirectional=not decoder, num_buckets=8, max_distance=12)
    # transformers' compute_bias against the table at our buckets
    assert_close(t5_bias_forward(np.zeros((2, n, n)), table, buckets)[0],
                 layer.compute_bias(n, n)[0].detach().numpy(), rtol=0, atol=0, what="compute_bias")
    # the layer: q, k, v (no biases), scores q k^T unscaled, + T5's bias, the causal mask, softmax, o
    mask = None
    if decoder:
        mask = torch.zeros(1, 1, n, n, dtype=torch.float64)
        mask[..., ~torch.tril(torch.ones(n, n, dtype=torch.bool))] = torch.finfo(torch.float64).min
    xt = torch.tensor(x, requires_grad=True)
    kwargs = {"query_length": n} if transformers.__version__.startswith("4.") else {}
    theirs = layer(xt, mask=mask, **kwargs)[0]
    dout = rng.standard_normal(theirs.shape)
    theirs.backward(torch.tensor(dout))

    W = {name: getattr(layer, name).weight.detach().numpy().T for name in "qkvo"}
    heads = lambda a: a.reshape(2, n, 2, 3).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = heads(x @ W["q"]), heads(x @ W["k"]), heads(x @ W["v"])
    S, cache = t5_bias_forward(q @ k.swapaxes(-1, -2), table, buckets)
    if decoder:
        S = np.where(np.tri(n, dtype=bool), S, -np.inf)
    P = np.exp(S - S.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    o = (P @ v).transpose(0, 2, 1, 3).reshape(2, n, 6)
    assert_close(o @ W["o"], theirs.detach().numpy(), rtol=1e-10, atol=1e-12, what="T5 attention layer")
    # backward: o, P v, the softmax, then the pair's backward (the table's gradient)
    do = (dout @ W["o"].T).reshape(2, n, 2, 3).transpose(0, 2, 1, 3)
    dP = do @ v.swapaxes(-1, -2)
    dS = P * (dP - (dP * P).sum(-1, keepdims=True))
    dscores, dtable = t5_bias_backward(dS, cache)
    assert_close(dtable, layer.relative_attention_bias.weight.grad.numpy(), rtol=1e-10, atol=1e-12,
                 what="the table's gradient")
    dq, dk = dscores @ k, dscores.swapaxes(-1, -2) @ q
    merge = lambda a: a.transpose(0, 2, 1, 3).reshape(2, n, 6)  # noqa: E731
    assert_close(merge(dq) @ W["q"].T + merge(dk) @ W["k"].T + merge(P.swapaxes(-1, -2) @ do) @ W["v"].T,
                 xt.grad.numpy(), rtol=1e-10, atol=1e-12, what="dx")
