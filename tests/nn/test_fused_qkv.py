"""fused_qkv_split_forward / fused_qkv_split_backward: GPT-NeoX's per-head and Phi-3's block layouts."""
import numpy as np
import pytest

from attention_ref.nn.fused_qkv import fused_qkv_split_backward, fused_qkv_split_forward
from _helpers import check_gradients


def loop_split(qkv, H, Hkv, layout):
    """Column by column from the layout's definition."""
    Dh = qkv.shape[-1] // (H + 2 * Hkv)
    q, k, v = ([] for _ in range(3))
    if layout == "per_head":  # [q_0 k_0 v_0 q_1 k_1 v_1 ...]
        for h in range(H):
            for j, part in enumerate((q, k, v)):
                part.extend(qkv[..., (3 * h + j) * Dh + c] for c in range(Dh))
    else:  # [q | k | v]
        q.extend(qkv[..., c] for c in range(H * Dh))
        k.extend(qkv[..., H * Dh + c] for c in range(Hkv * Dh))
        v.extend(qkv[..., (H + Hkv) * Dh + c] for c in range(Hkv * Dh))
    return tuple(np.stack(part, axis=-1) for part in (q, k, v))


CASES = [("per_head", 1, None, 2, (3,)), ("per_head", 2, None, 3, (2, 4)), ("per_head", 4, 4, 2, (2, 3)),
         ("blocks", 2, None, 2, (5,)), ("blocks", 4, 2, 3, (2, 3)), ("blocks", 3, 1, 4, (1, 2, 2))]


@pytest.mark.parametrize("layout,H,Hkv,Dh,lead", CASES)
def test_forward_matches_loop(layout, H, Hkv, Dh, lead):
    kv = H if Hkv is None else Hkv
    qkv = np.random.default_rng(0).standard_normal(lead + ((H + 2 * kv) * Dh,))
    (q, k, v), _ = fused_qkv_split_forward(qkv, H, Hkv, layout)
    for ours, reference in zip((q, k, v), loop_split(qkv, H, kv, layout)):
        assert np.array_equal(ours, reference)


def test_splits_a_weight_matrix_by_its_columns():
    """The weight W_qkv (d, 3 H Dh) splits like the activations: (x W_qkv) split = x (W_qkv split)."""
    rng = np.random.default_rng(1)
    x, W = rng.standard_normal((5, 6)), rng.standard_normal((6, 2 * 3 * 4))
    (Wq, Wk, Wv), _ = fused_qkv_split_forward(W, 2)
    (q, k, v), _ = fused_qkv_split_forward(x @ W, 2)
    assert np.allclose(q, x @ Wq, rtol=1e-14, atol=1e-14) and np.allclose(v, x @ Wv, rtol=1e-14, atol=1e-14)


def _joined(layout, H, Hkv):
    """The pair with its three outputs concatenated, for gradcheck."""
    def forward(qkv):
        parts, cache = fused_qkv_split_forward(qkv, H, Hkv, layout)
        return np.concatenate(parts, axis=-1), (cache, [p.shape[-1] for p in parts])

    def backward(dout, cache):
        cache, widths = cache
        return fused_qkv_split_backward(tuple(np.split(dout, np.cumsum(widths)[:-1], axis=-1)), cache)
    return forward, backward


@pytest.mark.parametrize("layout,H,Hkv,Dh,lead", CASES)
def test_backward_gradcheck_and_round_trip(layout, H, Hkv, Dh, lead):
    kv = H if Hkv is None else Hkv
    qkv = np.random.default_rng(2).standard_normal(lead + ((H + 2 * kv) * Dh,))
    check_gradients(*_joined(layout, H, Hkv), qkv, names=["qkv"])
    parts, cache = fused_qkv_split_forward(qkv, H, Hkv, layout)
    assert np.array_equal(fused_qkv_split_backward(parts, cache), qkv)  # the backward is the inverse permutation


def test_float32_stays_float32_and_copies():
    qkv = np.arange(12, dtype=np.float32)
    parts, cache = fused_qkv_split_forward(qkv, 2)
    assert all(p.dtype == np.float32 and not np.shares_memory(p, qkv) for p in parts)
    assert fused_qkv_split_backward(tuple(np.ones(p.shape) for p in parts), cache).dtype == np.float32


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"^qkv's last dimension 10 is not \(num_heads \+ 2 num_kv_heads\) \* head_dim"
                                         r" = 6 \* head_dim \(qkv has shape \(2, 10\)\)$"):
        fused_qkv_split_forward(np.ones((2, 10)), 2)
    with pytest.raises(ValueError, match=r"^the per_head layout holds as many key/value heads as query heads"):
        fused_qkv_split_forward(np.ones(16), 4, 2)
    with pytest.raises(ValueError, match=r"^layout must be one of \('per_head', 'blocks'\), got 'neox'$"):
        fused_qkv_split_forward(np.ones(12), 2, layout="neox")
    with pytest.raises(TypeError, match=r"^num_heads must be a positive integer, got 2.0$"):
        fused_qkv_split_forward(np.ones(12), 2.0)
    parts, cache = fused_qkv_split_forward(np.ones((2, 12)), 2)
    with pytest.raises(ValueError, match=r"^dk must have shape \(2, 4\) \(the forward output's\), got \(2, 3\)$"):
        fused_qkv_split_backward((parts[0], np.ones((2, 3)), parts[2]), cache)
    with pytest.raises(TypeError, match=r"^dqkv_parts must be the three gradients \(dq, dk, dv\)$"):
        fused_qkv_split_backward(parts[0], cache)
