"""gated_delta_rule_forward / gated_delta_rule_backward: Gated DeltaNet's recurrence, against a plain
loop written from the paper's form of the formula and against finite differences."""
import numpy as np
import pytest

from attention_ref.variants.gated_delta_rule import gated_delta_rule_backward, gated_delta_rule_forward
from _helpers import assert_close, check_gradients


def _inputs(rng, batch=(2, 3), t=4, dk=3, dv=2, state=True):
    q, k = rng.standard_normal(batch + (t, dk)), rng.standard_normal(batch + (t, dk))
    v = rng.standard_normal(batch + (t, dv))
    g = -rng.uniform(0.05, 1.0, batch + (t,))
    beta = rng.uniform(0.1, 0.9, batch + (t,))
    s0 = rng.standard_normal(batch + (dk, dv)) if state else None
    return q, k, v, g, beta, s0


def _loop(q, k, v, g, beta, s0, normalise=True):
    """One (batch, head) and one token at a time, in the paper's (Dv, Dk) layout:
    S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, o_t = S_t q_t / sqrt(dk)."""
    dk, dv = q.shape[-1], v.shape[-1]
    out = np.zeros(v.shape)
    finals = np.zeros(q.shape[:-2] + (dk, dv))
    for index in np.ndindex(q.shape[:-2]):
        S = np.zeros((dv, dk)) if s0 is None else s0[index].T.copy()
        for t in range(q.shape[-2]):
            qt, kt = q[index][t], k[index][t]
            if normalise:
                qt = qt / np.sqrt(qt @ qt + 1e-6)
                kt = kt / np.sqrt(kt @ kt + 1e-6)
            b = beta[index][t]
            S = np.exp(g[index][t]) * S @ (np.eye(dk) - b * np.outer(kt, kt)) + b * np.outer(v[index][t], kt)
            out[index][t] = S @ qt / np.sqrt(dk)
        finals[index] = S.T
    return out, finals


@pytest.mark.parametrize("normalise", [True, False])
@pytest.mark.parametrize("state", [True, False])
def test_forward_matches_loop(normalise, state):
    args = _inputs(np.random.default_rng(0), state=state)
    out, cache = gated_delta_rule_forward(*args, qk_l2norm=normalise)
    expected, final = _loop(*args, normalise=normalise)
    assert_close(out, expected, what="outputs")
    assert_close(cache.final_state, final, what="final state")


def test_unit_key_and_beta_one_store_the_value_exactly():
    """With |k| = 1 and beta = 1 the state maps k to v after the write, whatever it held."""
    rng = np.random.default_rng(1)
    k = np.array([[0.6, 0.8, 0.0]])
    v = rng.standard_normal((1, 2))
    _, cache = gated_delta_rule_forward(k, k, v, np.zeros(1), np.ones(1), rng.standard_normal((3, 2)),
                                        qk_l2norm=False)
    assert_close(cache.final_state.T @ k[0], v[0], what="S^T k")


def test_decoding_token_by_token_matches_the_sequence():
    q, k, v, g, beta, s0 = _inputs(np.random.default_rng(2), t=5)
    out, cache = gated_delta_rule_forward(q, k, v, g, beta, s0)
    state = s0
    for t in range(5):
        o, c = gated_delta_rule_forward(q[..., t:t + 1, :], k[..., t:t + 1, :], v[..., t:t + 1, :],
                                        g[..., t:t + 1], beta[..., t:t + 1], state)
        assert_close(o[..., 0, :], out[..., t, :], what=f"token {t}")
        state = c.final_state
    assert_close(state, cache.final_state, what="final state")


@pytest.mark.parametrize("normalise", [True, False])
def test_gradients(normalise):
    args = _inputs(np.random.default_rng(3))
    check_gradients(lambda *a: gated_delta_rule_forward(*a, qk_l2norm=normalise), gated_delta_rule_backward,
                    *args, names=["q", "k", "v", "g", "beta", "initial_state"])


def test_gradient_of_the_final_state():
    """The loss reads the outputs and the final state (what the next chunk or token receives)."""
    q, k, v, g, beta, s0 = _inputs(np.random.default_rng(4), batch=(2,), t=3)
    w = np.random.default_rng(5).standard_normal(s0.shape)

    def forward(q, k, v, g, beta, s0):
        out, cache = gated_delta_rule_forward(q, k, v, g, beta, s0)
        return np.concatenate([out.ravel(), cache.final_state.ravel()]), (cache, out.shape)

    def backward(dy, c):
        cache, shape = c
        n = int(np.prod(shape))
        return gated_delta_rule_backward(dy[:n].reshape(shape), cache, dy[n:].reshape(w.shape))

    check_gradients(forward, backward, q, k, v, g, beta, s0, names=["q", "k", "v", "g", "beta", "s0"])


def test_float32_stays_float32_and_inputs_untouched():
    args = [None if a is None else a.astype(np.float32) for a in _inputs(np.random.default_rng(6))]
    copies = [a.copy() for a in args]
    out, cache = gated_delta_rule_forward(*args)
    grads = gated_delta_rule_backward(np.ones_like(out), cache)
    assert out.dtype == np.float32 and all(x.dtype == np.float32 for x in grads)
    assert all(np.array_equal(a, c) for a, c in zip(args, copies))


@pytest.mark.parametrize("change, message", [
    (lambda a: {**a, "g": -a["g"]}, "^g is the log of a decay and must be <= 0"),
    (lambda a: {**a, "k": a["k"][..., :2]}, "^q and k must have the same shape"),
    (lambda a: {**a, "beta": a["beta"][..., :2]}, "^beta must have shape"),
    (lambda a: {**a, "initial_state": a["initial_state"][..., :1]}, "^initial_state must have shape"),
    (lambda a: {**a, "v": np.full_like(a["v"], np.nan)}, "^v contains NaN"),
    (lambda a: {**a, "scale": True}, "^scale must be a positive finite number, got True$"),
    (lambda a: {**a, "scale": -1.0}, "^scale must be a positive finite number, got -1.0$"),
])
def test_bad_input_is_refused_by_name(change, message):
    names = ["q", "k", "v", "g", "beta", "initial_state"]
    args = change(dict(zip(names, _inputs(np.random.default_rng(7)))))
    with pytest.raises(ValueError, match=message):
        gated_delta_rule_forward(**args)


def test_a_second_write_to_the_same_key_replaces_and_the_gate_scales_everything():
    """Two claims of lesson 19, section 5: writing v_new over v_old under one unit key
    recalls v_new (plain linear attention would recall the sum); a decay exp(g) with no write (beta = 0)
    scales every recall by exp(g)."""
    rng = np.random.default_rng(8)
    k = np.array([0.0, 0.6, 0.8])
    v_old, v_new = rng.standard_normal(2), rng.standard_normal(2)
    kk = np.stack([k, k])
    _, cache = gated_delta_rule_forward(kk, kk, np.stack([v_old, v_new]), np.zeros(2), np.ones(2), qk_l2norm=False)
    assert_close(cache.final_state.T @ k, v_new, what="replaced")
    s0 = rng.standard_normal((3, 2))
    _, cache = gated_delta_rule_forward(k[None], k[None], v_new[None], np.log([0.1]), np.zeros(1), s0)
    assert_close(cache.final_state, 0.1 * s0, what="decayed")
