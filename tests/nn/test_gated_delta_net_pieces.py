"""Gated DeltaNet's and gated attention's small pairs: the short causal depthwise convolution (with its
decoding window), the gated RMSNorm and the sigmoid output gate, against plain loops and finite
differences."""
import numpy as np
import pytest

from attention_ref.nn.causal_conv1d import causal_conv1d_backward, causal_conv1d_forward
from attention_ref.nn.gated_rms_norm import gated_rms_norm_backward, gated_rms_norm_forward
from attention_ref.nn.sigmoid_gate import sigmoid_gate_backward, sigmoid_gate_forward
from _helpers import assert_close, check_gradients


def _silu(a):
    return a / (1.0 + np.exp(-a))


def _conv_loop(x, w, b, window, activation):
    """y[t, c] = act(sum_j w[c, j] x[t - K + 1 + j, c] + b[c]), inputs before the sequence from window."""
    kw = w.shape[1]
    y = np.zeros(x.shape)
    for index in np.ndindex(x.shape[:-2]):
        past = np.zeros((kw - 1, x.shape[-1])) if window is None else window[index]
        seq = np.concatenate([past, x[index]])
        for t in range(x.shape[-2]):
            for c in range(x.shape[-1]):
                z = sum(w[c, j] * seq[t + j, c] for j in range(kw)) + (0.0 if b is None else b[c])
                y[index][t, c] = _silu(z) if activation == "silu" else z
    return y


@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("with_bias, with_window", [(False, False), (True, True)])
def test_conv_forward_matches_loop(activation, with_bias, with_window):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 5, 3)), rng.standard_normal((3, 4))
    b = rng.standard_normal(3) if with_bias else None
    window = rng.standard_normal((2, 3, 3)) if with_window else None
    y, cache = causal_conv1d_forward(x, w, b, window, activation)
    assert_close(y, _conv_loop(x, w, b, window, activation), what="causal conv")
    assert_close(cache.window, x[:, -3:, :], what="the window carried")


def test_conv_decoding_token_by_token_matches_the_sequence():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 6, 3)), rng.standard_normal((3, 4))
    y, _ = causal_conv1d_forward(x, w)
    window = None
    for t in range(6):
        y_t, cache = causal_conv1d_forward(x[:, t:t + 1], w, window=window)
        assert_close(y_t[:, 0], y[:, t], what=f"token {t}")
        window = cache.window


@pytest.mark.parametrize("activation", ["silu", None])
def test_conv_gradients(activation):
    rng = np.random.default_rng(2)
    x, w, b, window = (rng.standard_normal(s) for s in ((2, 5, 3), (3, 4), (3,), (2, 3, 3)))
    check_gradients(lambda x, w, b, window: causal_conv1d_forward(x, w, b, window, activation),
                    causal_conv1d_backward, x, w, b, window, names=["x", "weight", "bias", "window"])


def test_conv_kernel_of_width_one_has_an_empty_window():
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((4, 2)), rng.standard_normal((2, 1))
    y, cache = causal_conv1d_forward(x, w, activation=None)
    assert_close(y, x * w[:, 0])
    assert cache.window.shape == (0, 2)


@pytest.mark.parametrize("kwargs, message", [
    ({"weight": np.ones((2, 4))}, r"^weight must have shape \(3, k\)"),
    ({"bias": np.ones(2)}, r"^bias must have shape \(3,\)"),
    ({"window": np.ones((2, 2, 3))}, r"^window must have shape \(2, 3, 3\)"),
    ({"activation": "gelu"}, "^activation must be one of"),
])
def test_conv_refuses_bad_input_by_name(kwargs, message):
    args = {"x": np.ones((2, 5, 3)), "weight": np.ones((3, 4)), **kwargs}
    with pytest.raises(ValueError, match=message):
        causal_conv1d_forward(**args)


def test_gated_rms_norm_matches_formula_and_gradients():
    rng = np.random.default_rng(4)
    x, z, w = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 3, 5)), rng.standard_normal(5)
    y, _ = gated_rms_norm_forward(x, z, w, 1e-6)
    expected = np.zeros_like(x)
    for index in np.ndindex(x.shape[:-1]):
        row = x[index]
        expected[index] = w * row / np.sqrt(np.mean(row ** 2) + 1e-6) * _silu(z[index])
    assert_close(y, expected, what="gated RMSNorm")
    check_gradients(lambda x, z, w: gated_rms_norm_forward(x, z, w, 1e-6), gated_rms_norm_backward, x, z, w,
                    names=["x", "z", "weight"])
    with pytest.raises(ValueError, match=r"^z must have x's shape \(2, 3, 5\), got \(2, 3, 4\)$"):
        gated_rms_norm_forward(x, z[..., :4], w)


def test_sigmoid_gate_matches_formula_and_gradients():
    rng = np.random.default_rng(5)
    x, gate = rng.standard_normal((2, 3, 4)), 3 * rng.standard_normal((2, 3, 4))
    y, _ = sigmoid_gate_forward(x, gate)
    assert_close(y, x / (1.0 + np.exp(-gate)), what="x sigmoid(gate)")
    check_gradients(sigmoid_gate_forward, sigmoid_gate_backward, x, gate, names=["x", "gate"])
    y32, cache = sigmoid_gate_forward(x.astype(np.float32), gate.astype(np.float32))
    assert y32.dtype == np.float32 and all(g.dtype == np.float32 for g in sigmoid_gate_backward(y32, cache))
    with pytest.raises(ValueError, match=r"^gate must have x's shape"):
        sigmoid_gate_forward(x, gate[..., :2])
