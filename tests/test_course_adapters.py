"""Adapters in the shape of a course's (Stanford CS336's assignment 1: run_softmax, run_rope,
run_multihead_self_attention_with_rope, get_adamw_cls, run_gradient_clipping, ...), calling
attention_ref only, against the same computations written in torch here (docs/for_courses.md)."""
import math

import numpy as np
import pytest

import attention_ref as ar

# --------------------------------------------------------------------------------------------
# Adapters as a course writes them: torch tensors in, torch tensors out, the package in between
# (weights (d_out, d_in) as torch's Linear stores them, RoPE interleaved, the mask True = keep).
# --------------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")
F = torch.nn.functional


def _np(t):
    return t.detach().numpy()


def run_softmax(in_features, dim):
    return torch.tensor(ar.softmax_forward(_np(in_features), axis=dim)[0])


def run_scaled_dot_product_attention(Q, K, V, mask=None):
    return torch.tensor(ar.scaled_dot_product_attention_forward(_np(Q), _np(K), _np(V),
                                                                None if mask is None else _np(mask))[0])


def run_rope(d_k, theta, max_seq_len, in_query_or_key, token_positions):
    x, positions = _np(in_query_or_key), _np(token_positions)
    # token_positions (..., n) name the batch axes; x may have more (the heads) before n: insert them
    missing = x.ndim - 1 - positions.ndim
    if positions.ndim > 1 and missing > 0:
        positions = positions.reshape(positions.shape[:-1] + (1,) * missing + positions.shape[-1:])
    return torch.tensor(ar.rope_forward(x, positions, theta, layout="interleaved")[0])


def run_rmsnorm(d_model, eps, weights, in_features):
    return torch.tensor(ar.rms_norm_forward(_np(in_features), _np(weights), eps)[0])


def run_silu(in_features):
    return torch.tensor(ar.silu(_np(in_features)))


def run_swiglu(d_model, d_ff, w1_weight, w2_weight, w3_weight, in_features):
    return torch.tensor(ar.swiglu_forward(_np(in_features), _np(w1_weight).T, _np(w3_weight).T, _np(w2_weight).T)[0])


def run_multihead_self_attention_with_rope(d_model, num_heads, max_seq_len, theta, q_proj_weight, k_proj_weight,
                                           v_proj_weight, o_proj_weight, in_features, token_positions=None):
    x = _np(in_features)
    params = {"W_q": _np(q_proj_weight).T, "W_k": _np(k_proj_weight).T, "W_v": _np(v_proj_weight).T,
              "W_o": _np(o_proj_weight).T}
    positions = None if token_positions is None else _np(token_positions)
    out, _ = ar.rope_multi_head_attention_forward(x, x, x, params, num_heads, ar.causal_mask(x.shape[-2]),
                                                  layout="interleaved", positions=positions, theta=theta)
    return torch.tensor(out)


def run_cross_entropy(inputs, targets):
    return torch.tensor(ar.cross_entropy_forward(_np(inputs), _np(targets))[0])


def run_gradient_clipping(parameters, max_l2_norm):
    parameters = [p for p in parameters if p.grad is not None]
    clipped, _ = ar.clip_grad_norm({str(i): _np(p.grad) for i, p in enumerate(parameters)}, max_l2_norm)
    for i, p in enumerate(parameters):
        p.grad = torch.tensor(clipped[str(i)])


def run_get_lr_cosine_schedule(it, max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters):
    return ar.cosine_lr_schedule(it, max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters)


def get_adamw_cls():
    """A torch optimiser whose step is the package's AdamW on the parameters' arrays."""

    class PackageAdamW(torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
            self.arrays = {}
            self.ours = [ar.AdamW(self.arrays, lr, betas, eps, weight_decay) for _ in self.param_groups]

        @torch.no_grad()
        def step(self, closure=None):
            for group, opt in zip(self.param_groups, self.ours):
                opt.lr = group["lr"]
                for i, p in enumerate(group["params"]):
                    opt.params[str(i)] = _np(p).copy()
                opt.step({str(i): None if p.grad is None else _np(p.grad) for i, p in enumerate(group["params"])})
                for i, p in enumerate(group["params"]):
                    if p.grad is not None:
                        p.copy_(torch.tensor(opt.params[str(i)]))

    return PackageAdamW


# ------------------------------------------------------------------------------- the checks
def _rng():
    return np.random.default_rng(2026)


def test_softmax_and_its_overflow_case():
    x = torch.tensor(_rng().standard_normal((5, 10)))
    assert torch.allclose(run_softmax(x, dim=-1), F.softmax(x, dim=-1), rtol=1e-12, atol=1e-15)
    assert torch.allclose(run_softmax(x, dim=0), F.softmax(x, dim=0), rtol=1e-12, atol=1e-15)
    assert torch.allclose(run_softmax(x + 1000, dim=-1), F.softmax(x, dim=-1), rtol=1e-12, atol=1e-15)


def test_scaled_dot_product_attention_with_a_4d_mask():
    rng = _rng()
    q, k, v = (torch.tensor(rng.standard_normal(s)) for s in [(4, 3, 5, 8), (4, 3, 7, 8), (4, 3, 7, 6)])
    mask = torch.tensor(rng.random((4, 3, 5, 7)) > 0.4)
    mask[..., 0] = True  # every query keeps a key (torch's SDPA gives NaN for a query with none)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(run_scaled_dot_product_attention(q, k, v, mask), expected, rtol=1e-12, atol=1e-13)
    assert torch.allclose(run_scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v),
                          rtol=1e-12, atol=1e-13)


def _torch_rope_interleaved(x, positions, theta):
    """RoFormer's pairs (2i, 2i+1) as complex numbers: x (..., n, d), positions broadcasting to (..., n)."""
    d = x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.to(torch.float64)[..., None] * freqs  # (..., n, d/2)
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def test_rope_with_token_positions():
    rng = _rng()
    x = torch.tensor(rng.standard_normal((4, 12, 16)))
    positions = torch.tensor(rng.integers(0, 1000, (4, 12)))
    expected = _torch_rope_interleaved(x, positions, 10000.0)
    assert torch.allclose(run_rope(16, 10000.0, 2048, x, positions), expected, rtol=1e-12, atol=1e-12)
    assert torch.allclose(run_rope(16, 10000.0, 2048, x, torch.arange(12)),
                          _torch_rope_interleaved(x, torch.arange(12), 10000.0), rtol=1e-12, atol=1e-12)
    # queries of shape (B, H, n, d) with B = H = 4 and positions (B, n): each batch row its own positions
    xh = torch.tensor(rng.standard_normal((4, 4, 12, 16)))
    assert torch.allclose(run_rope(16, 10000.0, 2048, xh, positions),
                          _torch_rope_interleaved(xh, positions[:, None, :], 10000.0), rtol=1e-12, atol=1e-12)


def test_rmsnorm_silu_and_swiglu():
    rng = _rng()
    x = torch.tensor(rng.standard_normal((4, 12, 16)))
    w = torch.tensor(rng.standard_normal(16))
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    assert torch.allclose(run_rmsnorm(16, 1e-5, w, x), expected, rtol=1e-12, atol=1e-13)
    assert torch.allclose(run_silu(x), F.silu(x), rtol=1e-13, atol=1e-15)
    w1, w2, w3 = (torch.tensor(rng.standard_normal(s) / 4) for s in [(48, 16), (16, 48), (48, 16)])
    expected = F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)
    assert torch.allclose(run_swiglu(16, 48, w1, w2, w3, x), expected, rtol=1e-12, atol=1e-12)


def _torch_mha_with_rope(x, wq, wk, wv, wo, num_heads, theta, positions):
    B, n, d = x.shape
    split = lambda t: t.view(B, n, num_heads, d // num_heads).transpose(1, 2)  # noqa: E731
    q, k, v = split(F.linear(x, wq)), split(F.linear(x, wk)), split(F.linear(x, wv))
    q = _torch_rope_interleaved(q, positions[..., None, :], theta)
    k = _torch_rope_interleaved(k, positions[..., None, :], theta)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(o.transpose(1, 2).reshape(B, n, d), wo)


def test_multihead_self_attention_with_rope():
    rng = _rng()
    x = torch.tensor(rng.standard_normal((4, 12, 64)))
    ws = [torch.tensor(rng.standard_normal((64, 64)) / 8) for _ in range(4)]
    positions = torch.tensor(rng.integers(0, 100, (4, 12)))
    for given in (positions, None):
        used = torch.arange(12).expand(4, 12) if given is None else given
        expected = _torch_mha_with_rope(x, *ws, 4, 10000.0, used)
        actual = run_multihead_self_attention_with_rope(64, 4, 16, 10000.0, *ws, x, given)
        assert torch.allclose(actual, expected, rtol=1e-11, atol=1e-11)


def test_cross_entropy_and_its_overflow_case():
    rng = _rng()
    logits, targets = torch.tensor(rng.standard_normal((8, 5))), torch.tensor(rng.integers(0, 5, 8))
    assert torch.allclose(run_cross_entropy(logits, targets), F.cross_entropy(logits, targets), rtol=1e-13)
    big = logits * 1000
    assert torch.allclose(run_cross_entropy(big, targets), F.cross_entropy(big, targets), rtol=1e-13)


def _optimize(opt_class, steps=200, dtype=torch.float64):
    """A course's check: fit a small linear map with squared error, from one seed."""
    torch.manual_seed(42)
    model = torch.nn.Linear(3, 2, bias=False).to(dtype)
    opt = opt_class(model.parameters(), lr=1e-3, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        opt.zero_grad()
        x = torch.tensor(rng.random(3), dtype=dtype)
        y = torch.stack([x[0] + x[1], -x[2]])
        ((y - model(x)) ** 2).sum().backward()
        opt.step()
    return model.weight.detach()


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_adamw(dtype, tol):
    ours, reference = _optimize(get_adamw_cls(), dtype=dtype), _optimize(torch.optim.AdamW, dtype=dtype)
    assert ours.dtype == dtype
    assert torch.allclose(ours, reference, rtol=tol, atol=tol), (ours - reference).abs().max()


def test_gradient_clipping():
    rng = _rng()
    shapes = [(5, 4), (4,), (3, 2, 2)]
    for max_norm in (1e-2, 1e6):  # clipped, and left alone
        ours = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64)) for s in shapes]
        theirs = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64)) for s in shapes]
        grads = [torch.tensor(rng.standard_normal(s)) for s in shapes]
        for a, b, g in zip(ours, theirs, grads):
            a.grad, b.grad = g.clone(), g.clone()
        ours[1].grad = theirs[1].grad = None  # a parameter without a gradient is skipped by both
        run_gradient_clipping(ours, max_norm)
        torch.nn.utils.clip_grad_norm_(theirs, max_norm)
        for a, b in zip(ours, theirs):
            assert (a.grad is None) == (b.grad is None)
            if a.grad is not None:
                assert torch.allclose(a.grad, b.grad, rtol=1e-13, atol=0)


def test_cosine_schedule():
    def handout(it, lr_max, lr_min, t_w, t_c):  # the three cases, written from the course's description
        if it < t_w:
            return it / t_w * lr_max
        if it <= t_c:
            return lr_min + 0.5 * (1 + math.cos((it - t_w) / (t_c - t_w) * math.pi)) * (lr_max - lr_min)
        return lr_min

    for it in range(25):
        assert math.isclose(run_get_lr_cosine_schedule(it, 1.0, 0.1, 7, 21), handout(it, 1.0, 0.1, 7, 21),
                            rel_tol=1e-14, abs_tol=1e-15)
    # the decay is torch's cosine annealing started at the end of the warm-up
    p = torch.nn.Parameter(torch.zeros(1))
    sgd = torch.optim.SGD([p], lr=1.0)
    annealing = torch.optim.lr_scheduler.CosineAnnealingLR(sgd, T_max=21 - 7, eta_min=0.1)
    for epoch in range(15):
        assert math.isclose(run_get_lr_cosine_schedule(7 + epoch, 1.0, 0.1, 7, 21), annealing.get_last_lr()[0],
                            rel_tol=1e-12)
        sgd.step()
        annealing.step()
