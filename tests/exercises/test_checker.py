"""The exercise checker: a correct attempt always passes, and each classic mistake, written
here as a student would write it, is named by the checker's diagnosis."""
import numpy as np
import pytest

from attention_ref import layer_norm_backward as ar_layer_norm_backward
from attention_ref.core.heads import merge_heads
from attention_ref.exercises import EXERCISES, MISTAKES, check, hint
from attention_ref.variants.blockwise import _key_blocks, _scores

# -- independent correct implementations, written from the formulas ---------------------------


def softmax_backward(dy, cache):
    y = cache.y
    return y * (dy - np.sum(dy * y, axis=cache.axis, keepdims=True))


def linear_backward(dy, cache):
    x, W = cache.x, cache.W
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    return dy @ W.T, x2.T @ dy2, dy2.sum(axis=0) if cache.has_bias else None


def sum_to(g, shape):
    """A gradient computed on broadcast shapes, summed back to its input's ``shape``."""
    g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
    return g.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1), keepdims=True)


def attention_backward(dout, cache):
    q, k, v, P, scale = cache.q, cache.k, cache.v, cache.weights, cache.scale
    dv = np.einsum("...ij,...id->...jd", P, dout)
    dP = np.einsum("...id,...jd->...ij", dout, v)
    dS = P * (dP - np.einsum("...ij,...ij->...i", P, dP)[..., None])
    dq = np.einsum("...ij,...jd->...id", dS, k) * q.dtype.type(scale)
    dk = np.einsum("...ij,...id->...jd", dS, q) * q.dtype.type(scale)
    return sum_to(dq, q.shape), sum_to(dk, k.shape), sum_to(dv, v.shape)


def split_heads_backward(dheads):
    *batch, h, n, d = dheads.shape
    return np.moveaxis(dheads, -3, -2).reshape(*batch, n, h * d)


def merge_heads_backward(dmerged, num_heads):
    *batch, n, width = dmerged.shape
    return np.moveaxis(dmerged.reshape(*batch, n, num_heads, width // num_heads), -2, -3)


def layer_norm_backward(dy, cache):
    x_hat, rstd, gamma = cache
    g = dy * gamma
    dx = rstd * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))
    rows = (dy * x_hat).reshape(-1, x_hat.shape[-1])
    return dx, rows.sum(axis=0), dy.reshape(-1, x_hat.shape[-1]).sum(axis=0)


def flash_attention_backward(dout, cache, *, normalise=True, row_D=True, accumulate=True, scaled=True,
                             diagonal=False, use_window=True, use_causal=True, use_mask=True, subtract_max=True):
    """Tile by tile; the keywords make it one of the classic wrong versions."""
    q, k, v, mask, out, m, log_l, scale, causal, window, block = cache
    window, causal, mask = window if use_window else None, causal and use_causal, mask if use_mask else None
    n_q, n_k = q.shape[-2], k.shape[-2]
    dq, dk, dv = (np.zeros(shape, q.dtype) for shape in (out.shape[:-1] + q.shape[-1:],
                                                          out.shape[:-2] + k.shape[-2:], out.shape[:-2] + v.shape[-2:]))
    D = np.sum(dout * out, axis=-1, keepdims=True)
    factor = scale if scaled else 1.0
    for qs in range(0, n_q, block):
        qe = min(qs + block, n_q)
        for ks in _key_blocks(qs, qe, n_q, n_k, block, causal, window):
            ke = min(ks + block, n_k)
            s = _scores(q[..., qs:qe, :] * scale, k, mask, qs, qe, ks, ke, n_q, n_k, causal, window)
            with np.errstate(over="ignore", invalid="ignore"):
                lse = m[..., qs:qe, None] + (log_l[..., qs:qe, None] if normalise else 0)
                p = np.nan_to_num(np.exp(s - lse)) if subtract_max else np.where(s == -np.inf, 0, np.exp(s) / np.exp(lse))
                dp = dout[..., qs:qe, :] @ np.swapaxes(v[..., ks:ke, :], -1, -2)
                ds = p * (1 - p) * dp if diagonal else \
                    p * (dp - (D[..., qs:qe, :] if row_D else np.sum(p * dp, axis=-1, keepdims=True)))
            dq[..., qs:qe, :] += ds @ k[..., ks:ke, :] * factor
            new_dk = np.swapaxes(ds, -1, -2) @ q[..., qs:qe, :] * factor
            new_dv = np.swapaxes(p, -1, -2) @ dout[..., qs:qe, :]
            if accumulate:
                dk[..., ks:ke, :] += new_dk
                dv[..., ks:ke, :] += new_dv
            else:
                dk[..., ks:ke, :] = new_dk
                dv[..., ks:ke, :] = new_dv
    return sum_to(dq, q.shape), sum_to(dk, k.shape), sum_to(dv, v.shape)


def multi_head_attention_backward(dout, cache, *, transpose_dW_o=False, scale=None, sum_b_o=True, attention=None):
    """Composed from the pieces above; the keywords make it one of the classic wrong versions."""
    h = cache.num_heads
    grads = {}
    dmerged = dout @ cache.o_proj.W.T
    concat = cache.o_proj.x.reshape(-1, cache.o_proj.x.shape[-1])
    dW_o = concat.T @ dout.reshape(-1, dout.shape[-1])
    grads["W_o"] = dW_o.T if transpose_dW_o else dW_o
    grads["b_o"] = None if not cache.o_proj.has_bias else \
        dout.reshape(-1, dout.shape[-1]).sum(0) if sum_b_o else dout.sum(axis=0)
    dheads = merge_heads_backward(dmerged, h)  # (..., H, Nq, Dv)
    att = cache.attention if scale is None else cache.attention._replace(scale=scale)
    dq, dk, dv = (attention or attention_backward)(dheads, att)
    out = []
    for name, d, proj in (("q", dq, cache.q_proj), ("k", dk, cache.k_proj), ("v", dv, cache.v_proj)):
        dp = split_heads_backward(d)
        dx, dW, db = linear_backward(dp, proj)
        if not sum_b_o and db is not None:
            db = dp.sum(axis=0)
        grads["W_" + name], grads["b_" + name] = dW, db
        out.append(dx)
    return out[0], out[1], out[2], {key: grads[key] for key in cache.param_keys}


def encoder_block_backward(dout, cache, *, paths="qkv", skip=("attn", "ffn"), norm=None, attention=None):
    """Composed from the pieces above; the keywords make it one of the classic wrong versions
    (``skip``: the sub-layers whose skip path is kept; ``norm`` and ``attention``: a part's
    wrong backward inside the whole)."""
    from attention_ref import feed_forward_backward
    from attention_ref.nn.residual import join_grads

    norm = norm or layer_norm_backward

    def self_attention_backward(ds, c):
        dquery, dkey, dvalue, grads = multi_head_attention_backward(ds, c, attention=attention)
        return sum(d for p, d in zip("qkv", (dquery, dkey, dvalue)) if p in paths), grads

    def residual(d, c, sub, name):
        if c.norm_first:  # y = x + s(LN(x))
            dz, extra = sub(d, c.sublayer)
            dx_norm, dgamma, dbeta = norm(dz, c.norm)
            return (d + dx_norm if name in skip else dx_norm), extra, dgamma, dbeta
        dsum, dgamma, dbeta = norm(d, c.norm)  # y = LN(x + s(x))
        dz, extra = sub(dsum, c.sublayer)
        return (dsum + dz if name in skip else dz), extra, dgamma, dbeta

    dh, g_ffn, dgamma2, dbeta2 = residual(dout, cache.ffn, feed_forward_backward, "ffn")
    dx, g_attn, dgamma1, dbeta1 = residual(dh, cache.attn, self_attention_backward, "attn")
    return dx, join_grads({"self_attn": g_attn, "ln1": {"gamma": dgamma1, "beta": dbeta1}, "ffn": g_ffn,
                           "ln2": {"gamma": dgamma2, "beta": dbeta2}}, cache.param_keys)


CORRECT = {
    "softmax_backward": softmax_backward,
    "linear_backward": linear_backward,
    "scaled_dot_product_attention_backward": attention_backward,
    "split_heads_backward": split_heads_backward,
    "merge_heads_backward": merge_heads_backward,
    "layer_norm_backward": layer_norm_backward,
    "flash_attention_backward": flash_attention_backward,
    "multi_head_attention_backward": multi_head_attention_backward,
    "encoder_block_backward": encoder_block_backward,
}


def test_every_exercise_has_an_independent_solution_here():
    assert set(CORRECT) == set(EXERCISES)


@pytest.mark.parametrize("name", list(EXERCISES))
def test_correct_attempts_pass_on_50_seeds(name):
    """No false alarm: the library's own backward and the one written above, 50 random draws each."""
    for seed in range(50):
        for attempt in (EXERCISES[name].backward, CORRECT[name]):
            result = check(name, attempt, seed=seed)
            assert result.ok, f"seed {seed}:\n{result}"


# -- the classic mistakes, as a student writes them --------------------------------------------

def _attention_wrong(*, scale_power=1, mask=True, softmax="full", dk_transposed=False, no_max=False):
    def backward(dout, cache):
        q, k, v, P, _, scale = cache
        s = scale ** scale_power
        if not mask:  # recomputes the softmax, forgetting the mask
            S = q @ np.swapaxes(k, -1, -2) * cache.scale
            P = np.exp(S - S.max(-1, keepdims=True))
            P = P / P.sum(-1, keepdims=True)
        if no_max:  # recomputes the softmax from exp(S), the mask through the cached zeros
            S = q @ np.swapaxes(k, -1, -2) * cache.scale
            with np.errstate(over="ignore", invalid="ignore"):
                E = np.where(P > 0, np.exp(S), 0)
                P = E / E.sum(-1, keepdims=True)
        dv = np.swapaxes(P, -1, -2) @ dout
        dP = dout @ np.swapaxes(v, -1, -2)
        with np.errstate(invalid="ignore"):
            if softmax == "full":
                dS = P * (dP - np.sum(P * dP, axis=-1, keepdims=True))
            elif softmax == "diagonal":
                dS = P * (1 - P) * dP
            else:
                dS = dP
        dk = (dS @ q if dk_transposed else np.swapaxes(dS, -1, -2) @ q) * s
        dq = dS @ k * s
        return _sum_to(dq, q.shape), _sum_to(dk, k.shape), _sum_to(dv, v.shape)
    return backward


def _sum_to(g, shape):
    """Sum the axes that were broadcast (leading ones, and those of size 1 in ``shape``)."""
    while g.ndim > len(shape):
        g = g.sum(0)
    axes = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape)) if b == 1 and a != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _layer_norm_wrong(kind):
    def backward(dy, cache):
        x_hat, rstd, gamma = cache
        g = dy if kind == "no gain" else dy * gamma
        dgamma = (dy * x_hat).reshape(-1, x_hat.shape[-1]).sum(0)
        dbeta = dy.reshape(-1, x_hat.shape[-1]).sum(0)
        if kind == "constants":
            dx = rstd * g
        elif kind == "no variance":
            dx = rstd * (g - g.mean(-1, keepdims=True))
        elif kind == "no gain":
            dx = rstd * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))
        else:
            dx = layer_norm_backward(dy, cache)[0]
            dgamma = (dy * x_hat).reshape(-1, x_hat.shape[-1])[0]
        return dx, dgamma, dbeta
    return backward


def _linear_dW_transposed(dy, cache):
    dx, dW, db = linear_backward(dy, cache)
    return dx, dy.reshape(-1, dy.shape[-1]).T @ cache.x.reshape(-1, cache.x.shape[-1]), db


def _linear_db_first_axis(dy, cache):
    dx, dW, _ = linear_backward(dy, cache)
    return dx, dW, dy.sum(axis=0) if cache.has_bias else None


WRONG = {  # exercise -> {mistake name in the catalogue: a student's wrong attempt}
    "softmax_backward": {
        "diagonal-only Jacobian": lambda dy, cache: dy * cache.y * (1 - cache.y),
        "missing sum term": lambda dy, cache: dy * cache.y,
        "sum term with the wrong sign":
            lambda dy, cache: cache.y * (dy + np.sum(dy * cache.y, cache.axis, keepdims=True)),
        "leading y factor missing": lambda dy, cache: dy - np.sum(cache.y * dy, cache.axis, keepdims=True),
        "sum of dy without the weights":
            lambda dy, cache: cache.y * dy - cache.y * np.sum(dy, axis=cache.axis, keepdims=True),
        "sum along axis 0": lambda dy, cache: cache.y * (dy - np.sum(dy * cache.y, axis=0, keepdims=True)),
        "sum along the last axis whatever cache.axis":
            lambda dy, cache: cache.y * (dy - np.sum(dy * cache.y, axis=-1, keepdims=True)),
    },
    "linear_backward": {
        "transposed weight gradient": _linear_dW_transposed,
        "bias gradient not summed over the batch axes": _linear_db_first_axis,
    },
    "scaled_dot_product_attention_backward": {
        "missing 1/sqrt(d_k)": _attention_wrong(scale_power=0),
        "1/sqrt(d_k) applied twice": _attention_wrong(scale_power=2),
        "masked positions let through": _attention_wrong(mask=False),
        "diagonal-only softmax Jacobian": _attention_wrong(softmax="diagonal"),
        "softmax skipped": _attention_wrong(softmax="skipped"),
        "dk without the transpose": _attention_wrong(dk_transposed=True),
        "P recomputed without the row maximum": _attention_wrong(no_max=True),
    },
    "split_heads_backward": {
        "reshape without moving the heads back": lambda d: d.reshape(d.shape[:-3] + (d.shape[-2], -1)),
        "heads concatenated in reverse order": lambda d: merge_heads(np.flip(d, axis=-3)),
        "features interleaved (Dh, H)":
            lambda d: np.stack([d[..., i, :, :] for i in range(d.shape[-3])], axis=-1).reshape(
                d.shape[:-3] + (d.shape[-2], -1)),
        "axes 0 and 1 swapped whatever the batch axes":
            lambda d: d.transpose((1, 0) + tuple(range(2, d.ndim))).reshape(d.shape[:-3] + (d.shape[-2], -1)),
    },
    "merge_heads_backward": {
        "reshape without moving the heads axis":
            lambda d, h: d.reshape(d.shape[:-2] + (h, d.shape[-2], d.shape[-1] // h)),
        "features split as (Dh, H)":
            lambda d, h: np.stack([d[..., i::h] for i in range(h)], axis=-3),
        "axes 0 and 1 swapped whatever the batch axes": lambda d, h: np.reshape(np.swapaxes(np.reshape(
            d, d.shape[:-1] + (h, -1)), 0, 1), d.shape[:-2] + (h, d.shape[-2], -1)),
    },
    "layer_norm_backward": {
        "mean and variance treated as constants": _layer_norm_wrong("constants"),
        "variance treated as a constant": _layer_norm_wrong("no variance"),
        "gain forgotten in dx": _layer_norm_wrong("no gain"),
        "dgamma not summed over rows": _layer_norm_wrong("dgamma"),
    },
    "flash_attention_backward": {
        "probabilities not normalised": lambda d, c: flash_attention_backward(d, c, normalise=False),
        "D from one tile": lambda d, c: flash_attention_backward(d, c, row_D=False),
        "dk and dv overwritten": lambda d, c: flash_attention_backward(d, c, accumulate=False),
        "missing 1/sqrt(d_k)": lambda d, c: flash_attention_backward(d, c, scaled=False),
        "diagonal-only softmax Jacobian": lambda d, c: flash_attention_backward(d, c, diagonal=True),
        "window ignored": lambda d, c: flash_attention_backward(d, c, use_window=False),
        "causal rule ignored": lambda d, c: flash_attention_backward(d, c, use_causal=False),
        "user mask ignored": lambda d, c: flash_attention_backward(d, c, use_mask=False),
        "P recomputed without the row maximum": lambda d, c: flash_attention_backward(d, c, subtract_max=False),
    },
    "encoder_block_backward": {
        "self-attention paths not summed": lambda d, c: encoder_block_backward(d, c, paths="q"),
        "self-attention's value path dropped": lambda d, c: encoder_block_backward(d, c, paths="qk"),
        "self-attention's key path dropped": lambda d, c: encoder_block_backward(d, c, paths="qv"),
        "residual path dropped": lambda d, c: encoder_block_backward(d, c, skip=()),
        "feed-forward's skip path dropped": lambda d, c: encoder_block_backward(d, c, skip=("attn",)),
        "self-attention's skip path dropped": lambda d, c: encoder_block_backward(d, c, skip=("ffn",)),
    },
    "multi_head_attention_backward": {
        "transposed W_o gradient": lambda d, c: multi_head_attention_backward(d, c, transpose_dW_o=True),
        "missing 1/sqrt(d_k)": lambda d, c: multi_head_attention_backward(d, c, scale=1.0),
        "bias gradients not summed over the batch axes":
            lambda d, c: multi_head_attention_backward(d, c, sum_b_o=False),
    },
}
# a part's mistake inside a composite exercise: the part's wrong attempt, inside the whole
for _m in ("diagonal-only softmax Jacobian", "softmax skipped", "masked positions let through", "dk without the transpose",
           "1/sqrt(d_k) applied twice", "P recomputed without the row maximum", "missing 1/sqrt(d_k)"):
    _wrong_attention = WRONG["scaled_dot_product_attention_backward"][_m]
    if _m != "missing 1/sqrt(d_k)":
        WRONG["multi_head_attention_backward"][f"attention step: {_m}"] = \
            lambda d, c, a=_wrong_attention: multi_head_attention_backward(d, c, attention=a)
    if _m != "P recomputed without the row maximum":  # no encoder case has scores that large
        WRONG["encoder_block_backward"][f"self-attention's attention step: {_m}"] = \
            lambda d, c, a=_wrong_attention: encoder_block_backward(d, c, attention=a)
for _m in ("mean and variance treated as constants", "variance treated as a constant", "gain forgotten in dx"):
    WRONG["encoder_block_backward"][f"layer norms: {_m}"] = \
        lambda d, c, n=WRONG["layer_norm_backward"][_m]: encoder_block_backward(d, c, norm=n)


def test_every_catalogue_mistake_has_a_wrong_attempt_here():
    assert {n: set(m) for n, m in WRONG.items()} == {n: {m.name for m in ms} for n, ms in MISTAKES.items()}


@pytest.mark.parametrize("name, mistake", [(n, m) for n, ms in MISTAKES.items() for m in ms],
                         ids=lambda v: v if isinstance(v, str) else v.name)
def test_each_classic_mistake_is_named(name, mistake):
    for seed in range(3):
        result = check(name, WRONG[name][mistake.name], seed=seed)
        assert not result.ok
        assert result.diagnosis.startswith(mistake.sentence), f"seed {seed}:\n{result}"
        assert mistake.sentence.replace("  ", " ") in str(result).replace("\n  ", " ")


# -- what the checker says when no classic mistake fits ---------------------------------------

def _correct_then(name, change):
    def attempt(*args):
        return change(CORRECT[name](*args), *args)
    return attempt


@pytest.mark.parametrize("name, attempt, words", [
    ("softmax_backward", _correct_then("softmax_backward", lambda dx, dy, c: -dx), "has the wrong sign everywhere"),
    ("scaled_dot_product_attention_backward",
     _correct_then("scaled_dot_product_attention_backward",
                   lambda g, dout, c: (g[0] / c.scale, g[1], g[2])), "dq is 1/scale times the true gradient in every case"),
    ("multi_head_attention_backward",
     _correct_then("multi_head_attention_backward",
                   lambda g, dout, c: (g[0] * c.num_heads, *g[1:])), "h times the true gradient in every case"),
    ("softmax_backward", _correct_then("softmax_backward", lambda dx, dy, c: np.where(c.y == 0, dy, dx)),
     "right except at masked entries, where it must be 0"),
    ("softmax_backward", _correct_then("softmax_backward",
                                       lambda dx, dy, c: dx + (np.arange(dx.shape[0]) == 1).reshape(
                                           (-1,) + (1,) * (dx.ndim - 1)) if dx.ndim >= 3 else dx),
     "wrong only at batch item [1]"),
    ("merge_heads_backward", _correct_then("merge_heads_backward", lambda g, d, h: np.swapaxes(g, -1, -2)),
     "the transpose of the expected"),
    ("linear_backward", _correct_then("linear_backward", lambda g, dy, c: (g[0].astype(np.float32), g[1], g[2])),
     "dx is right to float32 precision but has dtype float32"),
    ("linear_backward", _correct_then("linear_backward", lambda g, dy, c: g[:2]), "returned 2 values; it returns 3"),
    ("layer_norm_backward", _correct_then("layer_norm_backward", lambda g, dy, c: (g[0], g[1] * np.nan, g[2])),
     "dgamma has NaN or infinity"),
    ("layer_norm_backward", _correct_then("layer_norm_backward", lambda g, dy, c: (g[0] * 0, g[1], g[2])),
     "dx is zero everywhere"),
])
def test_what_it_can_see_without_a_catalogue_entry(name, attempt, words):
    result = check(name, attempt)
    assert not result.ok and words in result.diagnosis, str(result)


def test_a_students_own_forward_is_used_and_checked():
    from attention_ref import softmax_forward
    from attention_ref.core.softmax import SoftmaxCache

    def my_forward(x, axis=-1):  # a row all -inf (a case of the contract) gives zeros, never NaN
        m = x.max(axis, keepdims=True)
        e = np.exp(x - np.where(np.isfinite(m), m, 0))
        total = e.sum(axis, keepdims=True)
        y = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
        return y, SoftmaxCache(y, axis)

    assert check("softmax_backward", softmax_backward, forward=my_forward).ok
    wrong = check("softmax_backward", softmax_backward, forward=lambda x, axis=-1: (np.exp(x), softmax_forward(x, axis)[1]))
    assert not wrong.ok and "your forward's output differs from softmax_forward's" in wrong.diagnosis


def test_unknown_exercise_and_hints():
    with pytest.raises(KeyError, match="softmax_backward"):
        check("softmax", softmax_backward)
    assert hint("softmax_backward", 1).startswith("hint 1 of 3: Every y_j depends on every x_i")
    with pytest.raises(ValueError, match="hints 1 to 3"):
        hint("softmax_backward", 4)
    for e in EXERCISES.values():
        assert len(e.hints) >= 2 and all(hint(e.name, i + 1) for i in range(len(e.hints)))



# -- attempts in other styles: a correct one always passes, a wrong one is still named ----------

def test_correct_attempts_in_other_styles_pass():
    from attention_ref import split_heads as library_split, merge_heads as library_merge

    def reordered(dout, cache):  # grads with its keys in another order
        dquery, dkey, dvalue, grads = multi_head_attention_backward(dout, cache)
        return dquery, dkey, dvalue, dict(sorted(grads.items()))

    def as_list(dy, cache):
        return list(linear_backward(dy, cache))

    def one_tuple(dy, cache):
        return (softmax_backward(dy, cache),)

    assert check("multi_head_attention_backward", reordered).ok
    assert check("linear_backward", as_list).ok
    assert check("softmax_backward", one_tuple).ok
    assert check("split_heads_backward", split_heads_backward, forward=library_split).ok
    assert check("merge_heads_backward", merge_heads_backward, forward=library_merge).ok


def test_an_attempt_writing_into_its_arguments_fails_and_is_told_so():
    def in_place(dy, cache):
        y = cache.y
        dx = y * (dy - np.sum(dy * y, axis=cache.axis, keepdims=True))
        y *= 0  # a careless reuse of the cached array
        return dx

    result = check("softmax_backward", in_place)
    assert not result.ok
    assert result.diagnosis.startswith("the gradients are right; your backward wrote into cache.y")


def test_a_wrong_in_place_attempt_is_still_named():
    def diagonal_in_place(dy, cache):
        y = cache.y
        y *= (1 - y)  # y (1 - y), written over the cache
        return dy * y

    result = check("softmax_backward", diagonal_in_place)
    assert result.diagnosis.startswith(MISTAKES["softmax_backward"][0].sentence)


def test_a_crash_shows_the_students_line():
    def crashing(dout, cache):
        dv = cache.weights @ dout  # P dout instead of P^T dout
        return dout, dout, dv

    result = check("scaled_dot_product_attention_backward", crashing)
    assert not result.ok and "dv = cache.weights @ dout" in result.diagnosis


def test_wrong_container_and_extra_axes_are_named():
    none = check("linear_backward", lambda dy, cache: None)
    assert none.diagnosis.startswith("your backward returned a NoneType; it returns a tuple (dx, dW, db)")
    keepdims = check("layer_norm_backward", lambda dy, c: (layer_norm_backward(dy, c)[0],
                                                           layer_norm_backward(dy, c)[1][None], layer_norm_backward(dy, c)[2]))
    assert "axes of size 1 too many or too few" in keepdims.diagnosis
    keys = check("multi_head_attention_backward",
                 lambda d, c: multi_head_attention_backward(d, c)[:3] + ({"W_q": None},))
    assert keys.diagnosis.startswith("grads must have the keys of params: missing ['b_q'")



def test_a_mistake_confined_to_some_cases_says_which():
    def forgets_the_mask_in_the_sum(dy, cache):  # right wherever no entry is masked
        y = cache.y
        return y * (dy - np.sum(np.where(np.isfinite(np.log(y)), dy * y, dy), axis=cache.axis, keepdims=True))

    with np.errstate(divide="ignore"):
        result = check("softmax_backward", forgets_the_mask_in_the_sum)
    assert result.diagnosis.startswith("cases 10-11, 14, 19 are wrong, cases 1-7, 9, 16 are right"), result.diagnosis
    assert "mask = '-inf entries', 'an empty row' in the wrong cases and 'none' in the right ones" in result.diagnosis


def test_report_and_hints_fit_80_columns():
    for name, e in EXERCISES.items():
        for attempt in (e.backward, lambda *a: None):
            report = str(check(name, attempt))
            assert max(len(line) for line in report.splitlines()) <= 80, name
        assert all(len(line) <= 80 for i in range(len(e.hints)) for line in hint(name, i + 1).splitlines())
