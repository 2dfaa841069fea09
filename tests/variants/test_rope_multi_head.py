"""rope_multi_head_attention_forward/backward: against a plain loop written from the formulas,
finite differences in float64, and a torch layer written here (RoPE in both layouts)."""
import math

import numpy as np
import pytest

from attention_ref import causal_mask, rope_multi_head_attention_backward, rope_multi_head_attention_forward
from tests._helpers import assert_close, check_gradients, random_params

LAYOUTS = ["half", "interleaved"]


def _pairs(d, layout):
    """The (first, second) feature indices of each rotated pair."""
    if layout == "interleaved":
        return [(2 * i, 2 * i + 1) for i in range(d // 2)]
    return [(i, i + d // 2) for i in range(d // 2)]


def _rotate_loop(v, p, theta, layout):
    """One vector at position p, pair by pair."""
    out = v.copy()
    d = len(v)
    for i, (a, b) in enumerate(_pairs(d, layout)):
        angle = p * theta ** (-2 * i / d)
        out[a] = v[a] * math.cos(angle) - v[b] * math.sin(angle)
        out[b] = v[a] * math.sin(angle) + v[b] * math.cos(angle)
    return out


def _loop(query, key, value, p, h, hkv, q_pos, k_pos, theta, layout, mask=None):
    """Head by head, token by token: project, rotate, score, softmax, mix, concatenate, project.
    query (B, Nq, D), key and value (B, Nk, D), q_pos (B, Nq), k_pos (B, Nk), mask None or bool (Nq, Nk)."""
    B, n_q, _ = query.shape
    n_k = key.shape[1]
    d_k, d_v = p["W_q"].shape[1] // h, p["W_v"].shape[1] // hkv
    bias = {n: p.get("b_" + n, 0.0) for n in "qkvo"}
    out = np.zeros((B, n_q, p["W_o"].shape[1]))
    for b in range(B):
        Q, K, V = query[b] @ p["W_q"] + bias["q"], key[b] @ p["W_k"] + bias["k"], value[b] @ p["W_v"] + bias["v"]
        heads = []
        for i in range(h):
            j = i // (h // hkv)  # the key/value head this query head reads
            head = np.zeros((n_q, d_v))
            for t in range(n_q):
                q = _rotate_loop(Q[t, i * d_k:(i + 1) * d_k], q_pos[b, t], theta, layout)
                scores = []
                for s in range(n_k):
                    k = _rotate_loop(K[s, j * d_k:(j + 1) * d_k], k_pos[b, s], theta, layout)
                    allowed = mask is None or mask[t, s]
                    scores.append(q @ k / math.sqrt(d_k) if allowed else -math.inf)
                weights = np.exp(np.array(scores) - max(scores))
                weights /= weights.sum()
                head[t] = sum(weights[s] * V[s, j * d_v:(j + 1) * d_v] for s in range(n_k))
            heads.append(head)
        out[b] = np.concatenate(heads, axis=-1) @ p["W_o"] + bias["o"]
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("h, hkv, bias, masked", [(2, 2, True, False), (4, 2, False, True), (4, 1, True, True)])
def test_forward_matches_the_loop(layout, h, hkv, bias, masked):
    rng = np.random.default_rng(0)
    p = random_params(rng, 8, h, 4, 3, num_kv_heads=hkv, bias=bias)
    x = rng.standard_normal((3, 5, 8))
    positions = rng.integers(0, 1000, size=(3, 5))  # per batch row, not starting at 0
    mask = causal_mask(5) if masked else None
    out, cache = rope_multi_head_attention_forward(x, x, x, p, h, mask, layout=layout, positions=positions,
                                                   theta=500.0, num_kv_heads=hkv)
    assert_close(out, _loop(x, x, x, p, h, hkv, positions, positions, 500.0, layout, mask), what="out")
    assert cache.weights.shape == (3, h, 5, 5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cross_attention_with_key_positions_matches_the_loop(layout):
    rng = np.random.default_rng(1)
    p = random_params(rng, 6, 3, 2, 2, kdim=5, vdim=4)
    query, key, value = rng.standard_normal((2, 3, 6)), rng.standard_normal((2, 4, 5)), rng.standard_normal((2, 4, 4))
    q_pos, k_pos = np.array([7, 8, 9]), np.array([[0, 2, 4, 6], [1, 3, 5, 7]])
    out, _ = rope_multi_head_attention_forward(query, key, value, p, 3, layout=layout, positions=q_pos,
                                               key_positions=k_pos)
    expected = _loop(query, key, value, p, 3, 3, np.tile(q_pos, (2, 1)), k_pos, 10000.0, layout)
    assert_close(out, expected, what="cross-attention")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("h, hkv", [(2, 2), (4, 2)])
def test_gradcheck(layout, h, hkv):
    rng = np.random.default_rng(2)
    p = random_params(rng, 8, h, 4, 2, num_kv_heads=hkv)
    query, key, value = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 4, 8))
    q_pos, k_pos = np.array([[3, 4, 5], [10, 11, 12]]), np.array([[0, 1, 2, 3], [9, 10, 11, 12]])

    def forward(query, key, value, params):
        return rope_multi_head_attention_forward(query, key, value, params, h, layout=layout, positions=q_pos,
                                                 key_positions=k_pos, num_kv_heads=hkv)

    check_gradients(forward, rope_multi_head_attention_backward, query, key, value, p,
                    names=["query", "key", "value", "params"])


def test_gradcheck_self_attention_causal():
    rng = np.random.default_rng(3)
    p = random_params(rng, 4, 2, 2, 2, bias=False)
    x = rng.standard_normal((5, 4))

    def forward(x, params):
        return rope_multi_head_attention_forward(x, x, x, params, 2, causal_mask(5), layout="interleaved")

    def backward(dout, cache):
        dquery, dkey, dvalue, grads = rope_multi_head_attention_backward(dout, cache)
        return dquery + dkey + dvalue, grads

    check_gradients(forward, backward, x, p, names=["x", "params"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_scores_depend_on_offsets_only(layout):
    """Shifting every position by the same amount leaves the output unchanged (R(m)^T R(n) = R(n - m))."""
    rng = np.random.default_rng(4)
    p = random_params(rng, 8, 2, 4, 4)
    x = rng.standard_normal((5, 8))
    a, _ = rope_multi_head_attention_forward(x, x, x, p, 2, layout=layout, positions=np.arange(5))
    b, _ = rope_multi_head_attention_forward(x, x, x, p, 2, layout=layout, positions=np.arange(5) + 37)
    assert_close(a, b, rtol=1e-11, atol=1e-11, what="shifted positions")
    c, _ = rope_multi_head_attention_forward(x, x, x, p, 2, layout=layout, positions=np.arange(5)[::-1])
    assert not np.allclose(a, c)  # the order of the positions does matter


def test_the_two_layouts_differ():
    rng = np.random.default_rng(5)
    p = random_params(rng, 8, 2, 4, 4)
    x = rng.standard_normal((4, 8))
    half, _ = rope_multi_head_attention_forward(x, x, x, p, 2, layout="half")
    inter, _ = rope_multi_head_attention_forward(x, x, x, p, 2, layout="interleaved")
    assert np.abs(half - inter).max() > 1e-3


def test_positions_per_batch_row_when_batch_equals_heads():
    """The course's trap: B = H = 4 and positions (B, n). Row b's tokens are at positions[b], for
    every head; the result is each row computed alone."""
    rng = np.random.default_rng(6)
    p = random_params(rng, 8, 4, 2, 2)
    x = rng.standard_normal((4, 3, 8))
    positions = rng.permuted(np.tile(np.arange(3), (4, 1)), axis=1) + 10 * np.arange(4)[:, None]
    out, _ = rope_multi_head_attention_forward(x, x, x, p, 4, layout="interleaved", positions=positions)
    for b in range(4):
        alone, _ = rope_multi_head_attention_forward(x[b], x[b], x[b], p, 4, layout="interleaved",
                                                     positions=positions[b])
        assert_close(out[b], alone, what=f"batch row {b}")


def test_decoding_one_token_is_the_last_row():
    rng = np.random.default_rng(7)
    p = random_params(rng, 8, 4, 2, 2, num_kv_heads=2)
    x = rng.standard_normal((2, 6, 8))
    full, _ = rope_multi_head_attention_forward(x, x, x, p, 4, causal_mask(6), layout="half", num_kv_heads=2)
    last, _ = rope_multi_head_attention_forward(x[:, -1:], x, x, p, 4, layout="half", positions=np.array([5]),
                                                key_positions=np.arange(6), num_kv_heads=2)
    assert_close(last[:, 0], full[:, -1], what="the last token")


def test_float32_stays_float32():
    rng = np.random.default_rng(8)
    p = random_params(rng, 8, 2, 4, 4, dtype=np.float32)
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    out, cache = rope_multi_head_attention_forward(x, x, x, p, 2, layout="half", positions=np.arange(5) + 10000)
    assert out.dtype == np.float32
    dq, dk, dv, grads = rope_multi_head_attention_backward(np.ones_like(out), cache)
    assert {a.dtype for a in (dq, dk, dv, *grads.values())} == {np.dtype(np.float32)}
    out64, _ = rope_multi_head_attention_forward(x.astype(float), x.astype(float), x.astype(float),
                                                 {n: w.astype(float) for n, w in p.items()}, 2, layout="half",
                                                 positions=np.arange(5) + 10000)
    assert_close(out, out64, rtol=1e-4, atol=1e-4, what="float32 against float64")


def test_inputs_are_not_modified():
    rng = np.random.default_rng(9)
    p = random_params(rng, 4, 2, 2, 2)
    x, positions = rng.standard_normal((2, 3, 4)), np.array([[1, 2, 3], [4, 5, 6]])
    copies = (x.copy(), positions.copy(), {n: w.copy() for n, w in p.items()})
    out, cache = rope_multi_head_attention_forward(x, x, x, p, 2, layout="half", positions=positions)
    dout = np.ones_like(out)
    rope_multi_head_attention_backward(dout, cache)
    np.testing.assert_array_equal(x, copies[0])
    np.testing.assert_array_equal(positions, copies[1])
    for n in p:
        np.testing.assert_array_equal(p[n], copies[2][n])
    np.testing.assert_array_equal(dout, np.ones_like(out))


def _bad(**overrides):
    rng = np.random.default_rng(10)
    args = dict(query=rng.standard_normal((2, 3, 4)), key=None, value=None, params=random_params(rng, 4, 2, 2, 2),
                num_heads=2, layout="half")
    args.update(overrides)
    args["key"] = args["query"] if args["key"] is None else args["key"]
    args["value"] = args["key"] if args["value"] is None else args["value"]
    return args


@pytest.mark.parametrize("overrides, error, message", [
    ({"layout": "rotate_half"}, ValueError,
     r"^layout must be 'half' \(pairs i, i \+ d_k/2: Llama, GPT-NeoX\) or 'interleaved' \(pairs 2i, 2i \+ 1:"
     r" RoFormer, GPT-J\), got 'rotate_half'$"),
    ({"theta": 0.0}, ValueError, r"^theta must be a positive real number, got 0.0$"),
    ({"positions": np.zeros((2, 1, 3))}, ValueError,
     r"^positions of shape \(2, 1, 3\) must be \(3,\) or have the 2 axes of query's leading shape \(2, 3\)"
     r" \(size-1 axes broadcast\)$"),
    ({"positions": np.zeros(4)}, ValueError, r"^positions of shape \(4,\) must be \(3,\) or have the 2 axes"),
    ({"positions": np.zeros((3, 3))}, ValueError, r"^positions of shape \(3, 3\) must be \(3,\) or have"),
    ({"positions": np.array([0, np.nan, 1])}, ValueError, r"^positions contains NaN"),
    ({"key": np.zeros((2, 5, 4))}, ValueError,
     r"^key_positions must be given when key's length n_k = 5 differs from query's n_q = 3"),
    ({"key": np.zeros((2, 5, 4)), "key_positions": np.arange(4)}, ValueError,
     r"^key_positions of shape \(4,\) must be \(5,\) or have the 2 axes of key's leading shape \(2, 5\)"),
])
def test_bad_arguments_are_named(overrides, error, message):
    with pytest.raises(error, match=message):
        rope_multi_head_attention_forward(**_bad(**overrides))


def test_positions_for_two_batch_axes_need_the_second_axis():
    """(B, n) against a query with two batch axes (B, C, n, D) is refused, not broadcast against C."""
    rng = np.random.default_rng(11)
    p = random_params(rng, 4, 2, 2, 2)
    x = rng.standard_normal((2, 2, 3, 4))
    positions = np.array([[0, 1, 2], [5, 6, 7]])
    with pytest.raises(ValueError, match=r"^positions of shape \(2, 3\) must be \(3,\) or have the 3 axes of query's"
                                         r" leading shape \(2, 2, 3\)"):
        rope_multi_head_attention_forward(x, x, x, p, 2, layout="half", positions=positions)
    out, _ = rope_multi_head_attention_forward(x, x, x, p, 2, layout="half", positions=positions[:, None, :])
    first, _ = rope_multi_head_attention_forward(x[0], x[0], x[0], p, 2, layout="half", positions=positions[0])
    assert_close(out[0], first, what="the first batch row")


def test_odd_head_width_and_missing_layout_are_refused():
    rng = np.random.default_rng(12)
    p = random_params(rng, 6, 2, 3, 3)
    x = rng.standard_normal((3, 6))
    with pytest.raises(ValueError, match=r"^the head width d_k = W_q's columns / num_heads = 3 must be even"):
        rope_multi_head_attention_forward(x, x, x, p, 2, layout="half")
    with pytest.raises(TypeError, match="layout"):
        rope_multi_head_attention_forward(x, x, x, p, 2)  # the pairing is never guessed


def test_backward_refuses_another_cache():
    from attention_ref import multi_head_attention_forward

    rng = np.random.default_rng(13)
    p = random_params(rng, 4, 2, 2, 2)
    x = rng.standard_normal((3, 4))
    out, plain = multi_head_attention_forward(x, x, x, p, 2)
    with pytest.raises(TypeError, match=r"^cache must be what rope_multi_head_attention_forward returned, got"
                                        r" MultiHeadCache$"):
        rope_multi_head_attention_backward(np.ones_like(out), plain)


# ----------------------------------------------------------------------- against torch
def _torch_rope(x, positions, theta, layout, torch):
    """RoPE written in torch: x (B, H, N, Dk), positions (B, N)."""
    d = x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (Dk/2,)
    angles = positions[:, None, :, None].to(torch.float64) * freqs  # (B, 1, N, Dk/2)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    if layout == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def _torch_layer(x, weights, h, hkv, positions, theta, layout, torch):
    """Self-attention as torch code: Linear layers (weight = our W transposed), RoPE, causal SDPA."""
    F = torch.nn.functional
    B, N, _ = x.shape
    q = F.linear(x, weights["q"]).view(B, N, h, -1).transpose(1, 2)  # (B, H, N, Dk)
    k = F.linear(x, weights["k"]).view(B, N, hkv, -1).transpose(1, 2)  # (B, Hkv, N, Dk)
    v = F.linear(x, weights["v"]).view(B, N, hkv, -1).transpose(1, 2)
    q, k = _torch_rope(q, positions, theta, layout, torch), _torch_rope(k, positions, theta, layout, torch)
    mask = torch.ones(N, N, dtype=torch.bool).tril()
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=hkv < h)  # (B, H, N, Dv)
    return F.linear(o.transpose(1, 2).reshape(B, N, -1), weights["o"])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("h, hkv", [(4, 4), (4, 2)])
def test_forward_and_backward_match_torch(layout, h, hkv):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(14)
    p = random_params(rng, 16, h, 4, 4, num_kv_heads=hkv, bias=False)
    x = rng.standard_normal((4, 6, 16))
    positions = rng.integers(0, 4096, size=(4, 6))
    out, cache = rope_multi_head_attention_forward(x, x, x, p, h, causal_mask(6), layout=layout, positions=positions,
                                                   theta=10000.0, num_kv_heads=hkv)
    dout = rng.standard_normal(out.shape)
    dquery, dkey, dvalue, grads = rope_multi_head_attention_backward(dout, cache)

    xt = torch.tensor(x, requires_grad=True)
    weights = {n: torch.tensor(p["W_" + n].T.copy(), requires_grad=True) for n in "qkvo"}  # torch's (d_out, d_in)
    reference = _torch_layer(xt, weights, h, hkv, torch.tensor(positions), 10000.0, layout, torch)
    (reference * torch.tensor(dout)).sum().backward()
    assert_close(out, reference.detach().numpy(), rtol=1e-11, atol=1e-11, what="out")
    assert_close(dquery + dkey + dvalue, xt.grad.numpy(), rtol=1e-10, atol=1e-10, what="dx")
    for n in "qkvo":
        assert_close(grads["W_" + n], weights[n].grad.numpy().T, rtol=1e-10, atol=1e-10, what="dW_" + n)
