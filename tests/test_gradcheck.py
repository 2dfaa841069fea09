"""gradcheck and numerical_gradient: they must pass correct pairs and catch real mistakes."""
import numpy as np
import pytest

from attention_ref import (
    GradcheckError,
    gradcheck,
    linear_backward,
    linear_forward,
    multi_head_attention_backward,
    multi_head_attention_forward,
    numerical_gradient,
)
from attention_ref.gradcheck import GradcheckReport, GradcheckRow
from _helpers import random_params


def test_numerical_gradient_of_known_function():
    x = np.array([[1.0, -2.0], [0.5, 3.0]])
    g = numerical_gradient(lambda z: np.sum(z ** 3) + z[0, 1] * z[1, 0], x)
    expected = 3 * x ** 2 + np.array([[0, 0.5], [-2.0, 0]])
    np.testing.assert_allclose(g, expected, rtol=1e-8)
    assert x.tolist() == [[1.0, -2.0], [0.5, 3.0]]  # untouched


def test_report_table_and_raise():
    rng = np.random.default_rng(0)
    x, W = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    good = gradcheck(linear_forward, linear_backward, x, W, names=["x", "W"])
    assert good.ok and bool(good)
    text = str(good)
    assert "max abs err" in text and "x" in text and "(4, 2)" in text and "ok" in text
    good.raise_if_failed()  # no exception

    def transposed_weight_product(dy, cache):
        """dW = dy^T x (shape (2, 4)) instead of x^T dy: a shape mistake, not a crash."""
        dx, dW, db = linear_backward(dy, cache)
        return dx, (dy.reshape(-1, 2).T @ cache.x.reshape(-1, 4)), db

    bad = gradcheck(linear_forward, transposed_weight_product, x, W, names=["x", "W"])
    assert not bad.ok and "shape (2, 4), expected (4, 2)" in str(bad)
    with pytest.raises(GradcheckError, match="W"):
        bad.raise_if_failed()


def test_catches_transposed_weight_product_with_square_weight():
    """With a square W the transposed product has the right shape but wrong values."""
    rng = np.random.default_rng(1)
    x, W = rng.standard_normal((5, 3)), rng.standard_normal((3, 3))

    def wrong(dy, cache):
        dx, dW, db = linear_backward(dy, cache)
        return dy @ cache.W, dW, db  # dx = dy W instead of dy W^T

    report = gradcheck(linear_forward, wrong, x, W, names=["x", "W"])
    assert not report.ok
    assert [r.ok for r in report.rows] == [False, True]


def test_missing_and_extra_gradients_fail_clearly():
    rng = np.random.default_rng(2)
    x, W = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    missing = gradcheck(linear_forward, lambda dy, c: (linear_backward(dy, c)[0], None), x, W)
    assert not missing.ok and "missing gradient" in str(missing)
    too_few = gradcheck(linear_forward, lambda dy, c: linear_backward(dy, c)[0], x, W)
    assert not too_few.ok and "1 gradients for 2" in str(too_few)
    extra = gradcheck(linear_forward, lambda dy, c: linear_backward(dy, c)[:2] + (np.ones(1),), x, W)
    assert not extra.ok and "not None" in str(extra)


def test_same_array_for_several_inputs_is_perturbed_independently():
    """Self-attention passes one x three times; each gets its own gradient."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 6))
    params = random_params(rng, 6, 2, 3, 3)
    report = gradcheck(multi_head_attention_forward, multi_head_attention_backward, x, x, x, params, 2,
                       atol=1e-8, rtol=1e-7)
    assert report.ok, str(report)

    def summed_backward(dout, cache):  # returns dx = dq + dk + dv for each: wrong per input
        dq, dk, dv, grads = multi_head_attention_backward(dout, cache)
        total = dq + dk + dv
        return total, total, total, grads

    assert not gradcheck(multi_head_attention_forward, summed_backward, x, x, x, params, 2).ok


def test_dict_inputs_get_dict_gradients():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 6))
    params = random_params(rng, 6, 2, 3, 3)
    params["b_k"] = None  # a None entry is skipped

    def forward(x, p):
        return multi_head_attention_forward(x, x, x, p, 2)

    def backward(dout, cache):
        dq, dk, dv, grads = multi_head_attention_backward(dout, cache)
        return dq + dk + dv, grads

    report = gradcheck(forward, backward, x, params, names=["x", "params"])
    assert report.ok, str(report)
    assert [r.name for r in report.rows] == ["x"] + [f"params[{k}]" for k in params if params[k] is not None]

    def backward_bad_dict(dout, cache):
        dx, grads = backward(dout, cache)
        grads = dict(grads)
        grads["W_v"] = grads["W_v"] * 1.01
        del grads["W_o"]
        return dx, grads

    bad = gradcheck(forward, backward_bad_dict, x, params, names=["x", "params"])
    failed = {r.name for r in bad.rows if not r.ok}
    assert failed == {"params[W_v]", "params[W_o]"}


def test_inputs_are_never_modified():
    rng = np.random.default_rng(5)
    x32 = rng.standard_normal((3, 4)).astype(np.float32)
    W = rng.standard_normal((4, 2))
    before = (x32.copy(), W.copy())

    def mutating_forward(x, W):
        x += 1.0  # a badly behaved forward mutates what it is given
        return linear_forward(x, W)

    gradcheck(mutating_forward, linear_backward, x32, W)
    np.testing.assert_array_equal(x32, before[0])
    np.testing.assert_array_equal(W, before[1])


def test_checks_in_float64_even_for_float32_inputs():
    rng = np.random.default_rng(6)
    x, W = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    report = gradcheck(linear_forward, linear_backward, x, W, atol=1e-8, rtol=1e-7)
    assert report.ok, str(report)


def test_zero_gradient_is_not_flagged():
    x = np.random.default_rng(7).standard_normal((3, 4))
    report = gradcheck(lambda x: (np.zeros(2) * x.sum(), None), lambda d, c: np.zeros((3, 4)), x)
    assert report.ok and "-" in str(report)


def test_needs_a_differentiable_input():
    with pytest.raises(TypeError, match="floating-point"):
        gradcheck(lambda n: (np.ones(1), None), lambda d, c: None, 3)


def test_detects_a_small_error_and_tolerates_none_bias():
    rng = np.random.default_rng(8)
    x, W = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))

    def slightly_off(dy, cache):
        dx, dW, db = linear_backward(dy, cache)
        return dx, dW * (1 + 1e-5), db

    assert gradcheck(linear_forward, slightly_off, x, W).ok  # within default rtol=1e-3
    assert not gradcheck(linear_forward, slightly_off, x, W, atol=1e-8, rtol=1e-7).ok


@pytest.mark.parametrize("n_rows", [2, 3])
def test_forward_returning_a_bare_array_is_a_type_error(n_rows):
    """A (2, 5) array would unpack into two rows (a false FAIL), a (3, 5) one would not
    unpack at all: both are the same user mistake and get the same clear message."""
    x = np.random.default_rng(4).standard_normal((n_rows, 5))
    with pytest.raises(TypeError, match=rf"\(out, cache\), got a bare array of shape \({n_rows}, 5\)"):
        gradcheck(lambda z: 2.0 * z, lambda dout, cache: 2.0 * dout, x)


def test_forward_returning_a_tuple_of_the_wrong_length_is_a_type_error():
    x = np.random.default_rng(5).standard_normal((2, 3))
    with pytest.raises(TypeError, match="got a tuple of length 3"):
        gradcheck(lambda z: (z, None, None), lambda dout, cache: dout, x)
    with pytest.raises(TypeError, match="got a tuple of length 1"):
        gradcheck(lambda z: (z,), lambda dout, cache: dout, x)
    with pytest.raises(TypeError, match="first entry is a dict"):
        gradcheck(lambda z: ({"out": z}, None), lambda dout, cache: dout, x)


def test_forward_without_a_cache_wrapped_as_the_message_says_passes():
    x = np.random.default_rng(6).standard_normal((2, 5))
    report = gradcheck(lambda z: (2.0 * z, None), lambda dout, cache: 2.0 * dout, x)
    assert report.ok, str(report)


def test_worst_index_is_shown_only_for_failing_inputs():
    """For a passing input the position of the largest error is rounding noise that moves
    with the BLAS and the CPU; for a failing one it points at the mistake."""
    rng = np.random.default_rng(7)
    x, W = rng.standard_normal((5, 3)), rng.standard_normal((3, 3))

    def wrong(dy, cache):
        dx, dW, db = linear_backward(dy, cache)
        return dx, dW.T, db  # a transposed dW: right shape, wrong values

    report = gradcheck(linear_forward, wrong, x, W, names=["x", "W"])
    x_line, W_line = [line for line in str(report).splitlines() if line.startswith(("x ", "W "))]
    assert x_line.split()[-2:] == ["-", "ok"]
    assert W_line.endswith("FAIL") and str(report.rows[1].worst_index) in W_line
    assert report.rows[0].worst_index is not None  # the field itself is kept


# ------------------------------------------------- the ways people call it beyond the happy path
def _double(x):
    return 2.0 * x, None


def test_a_dict_input_with_one_entry():
    report = gradcheck(lambda p: ((p["w"] ** 2).sum(keepdims=True), p), lambda d, p: {"w": 2 * p["w"] * d},
                       {"w": np.array([1.0, -2.0])}, names=["p"])
    assert report.ok and [r.name for r in report.rows] == ["p[w]"]


def test_a_dict_of_integers_is_passed_through_without_a_gradient():
    received = []

    def forward(x, table):
        received.append(table["i"].dtype)
        return 2.0 * x, None

    report = gradcheck(forward, lambda d, c: 2.0 * d, np.ones(2), {"i": np.arange(2)})
    assert report.ok and [r.name for r in report.rows] == ["input 0"]
    assert set(received) == {np.dtype(int)}  # not turned into floats, not perturbed


def test_a_single_input_whose_backward_returns_a_one_tuple():
    assert gradcheck(_double, lambda d, c: (2.0 * d,), np.ones(3)).ok


def test_a_size_one_input_with_a_wrong_gradient_fails():
    report = gradcheck(_double, lambda d, c: 3.0 * d, np.ones(1))
    assert not report.ok and report.rows[0].worst_index == (0,)


def test_an_empty_input_passes_with_nothing_to_compare():
    row = gradcheck(_double, lambda d, c: 2.0 * d, np.ones((0, 3))).rows[0]
    assert row.ok and row.shape == (0, 3) and row.max_abs_err == 0.0 and row.worst_index is None


def test_float32_inputs_reach_forward_in_float64():
    """Finite differences need float64: a float32 forward would round eps = 1e-6 away."""
    received = []

    def forward(x):
        received.append(x.dtype)
        return 2.0 * x, None

    x = np.ones(2, np.float32)
    assert gradcheck(forward, lambda d, c: 2.0 * d, x).ok
    assert set(received) == {np.dtype(np.float64)} and x.dtype == np.float32


def test_report_fields_are_the_numbers_of_the_comparison():
    """Analytic 3 d against numerical 2 d at x = [1, 1]: |error| = |d|, scale = 3 max|d|."""
    report = gradcheck(_double, lambda d, c: 3.0 * d, np.ones(2), seed=5)
    dout = np.random.default_rng(5).standard_normal(2)
    row = report.rows[0]
    assert row.max_abs_err == pytest.approx(np.abs(dout).max(), rel=1e-6)
    assert row.scale == pytest.approx(3 * np.abs(dout).max(), rel=1e-6)
    assert row.rel_err == pytest.approx(1 / 3, rel=1e-6)
    assert row.worst_index == (int(np.argmax(np.abs(dout))),)


def test_default_tolerance_does_not_judge_gradients_near_zero():
    """Below atol = 1e-5 a gradient counts as zero: a wrong gradient of size 1e-9 passes by
    design (rel err '-'); a caller who cares passes a smaller atol, and then it fails."""
    wrong_tiny = (lambda x: (1e-9 * x, None), lambda d, c: 1.5e-9 * d)
    loose = gradcheck(*wrong_tiny, np.ones(3))
    assert loose.ok and np.isnan(loose.rows[0].rel_err)
    assert not gradcheck(*wrong_tiny, np.ones(3), atol=1e-13).ok


# -- every field of every row, and the report's exact text (mutation testing found these unpinned)

def _fields(row):
    """A row as a tuple in which nan equals nan."""
    return tuple("nan" if isinstance(v, float) and np.isnan(v) else v for v in
                 (row.name, row.shape, row.ok, row.max_abs_err, row.rel_err, row.scale,
                  row.worst_index, row.message))


def test_report_text_is_exactly_the_documented_table():
    rows = (
        GradcheckRow("q", (2, 3), False, message="missing gradient (backward returned None)"),
        GradcheckRow("k", (4,), True, 2.4e-09, 1.2e-09, 2.0, (1,)),
        GradcheckRow("b", (4,), True, 0.0, np.nan, 0.0, (0,)),
        GradcheckRow("W", (2, 2), False, 0.5, 0.25, 2.0, (1, 0)),
    )
    report = GradcheckReport(rows, atol=1e-05, rtol=0.001, eps=1e-06, errors=("backward returned 3 gradients",))
    head = "input            shape             max|grad| max abs err   rel err  worst index    status"
    assert str(report) == "\n".join([
        head,
        "-" * len(head),
        "q                (2, 3)           FAIL: missing gradient (backward returned None)",
        "k                (4,)                      2     2.4e-09   1.2e-09  -              ok",
        "b                (4,)                      0     0.0e+00         -  -              ok",
        "W                (2, 2)                    2     5.0e-01   2.5e-01  (1, 0)         FAIL",
        "FAIL: backward returned 3 gradients",
        "(pass: abs err <= 1e-05 + 0.001 * max|grad|; eps = 1e-06; rel err '-' means the gradient"
        " is zero to within atol; worst index is shown for failing inputs)",
    ])
    with pytest.raises(GradcheckError) as info:
        report.raise_if_failed()
    assert str(info.value) == "gradient check failed\n" + str(report)


def _identity(x):
    return x.copy(), None


@pytest.mark.parametrize("gradient, message", [
    (None, "missing gradient (backward returned None)"),
    (np.array(["a"] * 6).reshape(2, 3), "gradient has dtype <U1"),
    (np.ones((3, 2)), "gradient has shape (3, 2), expected (2, 3)"),
])
def test_a_gradient_that_cannot_be_compared_fails_with_its_reason(gradient, message):
    report = gradcheck(_identity, lambda dout, cache: gradient, np.ones((2, 3)), names=["x"])
    assert [_fields(r) for r in report.rows] == [("x", (2, 3), False, "nan", "nan", "nan", None, message)]


def test_a_ragged_gradient_fails_as_not_an_array():
    report = gradcheck(_identity, lambda dout, cache: ([[1.0], [1.0, 2.0]],), np.ones((2, 3)), names=["x"])
    (row,) = report.rows
    assert (row.name, row.shape, row.ok) == ("x", (2, 3), False)
    assert row.message.startswith("gradient is not an array: ")


def test_empty_input_row_is_exactly_zero_error():
    report = gradcheck(_identity, lambda dout, cache: dout, np.ones((0, 3)), names=["x"])
    assert [_fields(r) for r in report.rows] == [("x", (0, 3), True, 0.0, "nan", 0.0, None, "")]


def test_tolerance_boundary_passes_and_relative_error_needs_scale_above_atol():
    """An error of exactly atol + rtol * scale passes; a scale of exactly atol has no relative error."""
    report = gradcheck(lambda x: (0.0 * x, None), lambda dout, cache: np.full(1, 0.5), np.ones(1),
                       atol=0.5, rtol=0.0, names=["x"])
    assert [_fields(r) for r in report.rows] == [("x", (1,), True, 0.5, "nan", 0.5, (0,), "")]


def test_numerical_gradient_uses_the_given_step():
    """Central differences of x^3 are exact up to eps^2: 3 x^2 + eps^2, for array and dict inputs."""
    def cube(x, d):
        return x ** 3 + d["w"] ** 3, (x, d["w"])

    def backward(dout, cache):
        x, w = cache
        return dout * 3 * x ** 2, {"w": dout * 3 * w ** 2}

    report = gradcheck(cube, backward, np.ones(1), {"w": np.ones(1)}, eps=0.1, seed=0, names=["x", "d"])
    dout = np.random.default_rng(0).standard_normal(1)[0]
    for row in report.rows:
        assert row.max_abs_err == pytest.approx(0.01 * abs(dout), rel=1e-6), row.name


def test_default_seed_is_zero():
    x = np.random.default_rng(3).standard_normal((2, 3))
    wrong = lambda dout, cache: 2 * dout  # noqa: E731
    default, seed0, seed1 = (gradcheck(_identity, wrong, x, **kw) for kw in ({}, {"seed": 0}, {"seed": 1}))
    assert _fields(default.rows[0]) == _fields(seed0.rows[0]) != _fields(seed1.rows[0])


def test_forward_may_return_a_python_float():
    report = gradcheck(lambda x: (float(np.sum(x ** 2)), x), lambda dout, cache: 2 * dout * cache, np.ones(3))
    assert report.ok


def test_forward_returning_a_list_is_named_in_the_error():
    with pytest.raises(TypeError) as info:
        gradcheck(lambda x: [x, None], lambda dout, cache: dout, np.ones(3))
    assert str(info.value) == (
        "gradcheck: forward must return a tuple (out, cache), got a list; wrap a function that returns"
        " only the output as `lambda *a: (f(*a), None)` with a backward that ignores the cache")


def test_no_differentiable_input_message():
    for inputs in [(np.arange(3),), ({},)]:  # integers; an empty dict has nothing to check
        with pytest.raises(TypeError) as info:
            gradcheck(_identity, lambda dout, cache: dout, *inputs)
        assert str(info.value) == "gradcheck needs at least one leading floating-point array (or dict of them)"


def test_pass_through_arrays_reach_forward_as_copies():
    mask = np.array([True, False, True])

    def forward(x, m):
        assert m is not mask and m.dtype == bool
        m[:] = False  # a careless forward writing into its mask
        return x * 1.0, None

    gradcheck(forward, lambda dout, cache: dout, np.ones(3), mask)
    assert mask.tolist() == [True, False, True]


def test_extra_gradients_that_are_not_none_are_reported():
    report = gradcheck(_identity, lambda dout, cache: (dout, np.ones(1)), np.ones(2))
    assert report.errors == ("backward returned 2 gradients for 1 differentiable inputs"
                             " (extra entries that are not None)",)


def test_dict_input_with_an_array_gradient_or_none():
    def forward(d, x):
        return d["w"] * x, (d["w"], x)

    def array_for_dict(dout, cache):
        return dout * cache[1], dout * cache[0]

    def none_for_dict(dout, cache):
        return None, dout * cache[0]

    args = ({"w": np.ones(2)}, np.ones(2))
    bad = gradcheck(forward, array_for_dict, *args, names=["d", "x"])
    assert [_fields(r) for r in bad.rows] == [
        ("d", (), False, "nan", "nan", "nan", None, "expected a dict gradient, got ndarray"),
        ("x", (2,), True, *_fields(bad.rows[1])[3:7], ""),
    ]
    missing = gradcheck(forward, none_for_dict, *args, names=["d", "x"])
    assert [r.name for r in missing.rows] == ["d[w]", "x"]
    assert missing.rows[0].message == "missing gradient (backward returned None)" and missing.rows[1].ok


def test_numerical_gradient_evaluates_f_in_float64():
    seen = []

    def f(z):
        seen.append(z.dtype)
        return float(np.sum(z.astype(np.float64) ** 2))

    g = numerical_gradient(f, np.array([0.1, 0.2], dtype=np.float32))
    assert g.dtype == np.float64 and set(seen) == {np.dtype(np.float64)}
    np.testing.assert_allclose(g, 2 * np.array([0.1, 0.2], dtype=np.float32).astype(np.float64), rtol=1e-8)


def test_dict_of_float32_reaches_forward_in_float64():
    seen = []

    def forward(d):
        seen.append(d["w"].dtype)
        return d["w"] * 2, None

    assert gradcheck(forward, lambda dout, cache: {"w": 2 * dout}, {"w": np.ones(2, dtype=np.float32)}).ok
    assert set(seen) == {np.dtype(np.float64)}


@pytest.mark.parametrize("dtype", [np.int64, np.uint8, np.float32])
def test_integer_and_float32_gradients_are_compared(dtype):
    report = gradcheck(lambda x: (2 * x, None), lambda dout, cache: np.full(dout.shape, 0, dtype), np.ones(3))
    (row,) = report.rows
    assert row.message == "" and not row.ok and row.max_abs_err == pytest.approx(row.scale, rel=1e-6)


# -------------------------------------- a pair that writes into what it is given fails, named

def test_a_backward_that_scales_dout_in_place_fails():
    """Before, the finite differences reused the same dout: twice the gradient passed."""
    x, W = np.random.default_rng(9).standard_normal((3, 4)), np.random.default_rng(10).standard_normal((4, 2))

    def doubled(dout, cache):
        dout *= 2
        return linear_backward(dout, cache)

    report = gradcheck(linear_forward, doubled, x, W, names=["x", "W"])
    assert not report.ok and not any(r.ok for r in report.rows)
    assert report.errors[0].startswith("backward wrote into dout;")


def test_a_backward_that_zeroes_dout_and_returns_zeros_fails():
    def zeroed(dy, cache):
        dy[...] = 0
        return linear_backward(dy, cache)

    x, W = np.ones((2, 3)), np.ones((3, 2))
    report = gradcheck(linear_forward, zeroed, x, W)
    assert not report.ok and [r.ok for r in report.rows] == [False, False]
    assert report.errors[0].startswith("backward wrote into dy;")  # the backward's own argument name


def test_a_right_softmax_backward_written_into_dout_fails_by_its_write_only():
    from attention_ref import softmax_backward, softmax_forward

    def in_place(dy, cache):
        s = (dy * cache.y).sum(axis=cache.axis, keepdims=True)
        dy -= s
        dy *= cache.y
        return dy

    x = np.random.default_rng(11).standard_normal((3, 5))
    report = gradcheck(softmax_forward, in_place, x, names=["x"])
    assert [r.ok for r in report.rows] == [True]  # the numbers are right: dout was never reused
    assert not report.ok and report.errors == (
        "backward wrote into dy; a backward must not change its arguments (compute into new arrays:"
        " no +=, *=, [...] = or out=)",)
    assert gradcheck(softmax_forward, softmax_backward, x).ok


def test_a_right_backward_that_zeroes_its_cache_fails_by_naming_the_field():
    x = np.random.default_rng(12).standard_normal((2, 3, 4))
    params = random_params(np.random.default_rng(13), 4, 2, 2, 2)

    def forward(x, p):
        return multi_head_attention_forward(x, x, x, p, 2)

    def zeroes_cache(dout, cache):
        dq, dk, dv, grads = multi_head_attention_backward(dout, cache)
        cache.attention.weights[...] = 0
        return dq + dk + dv, grads

    report = gradcheck(forward, zeroes_cache, x, params, names=["x", "params"])
    assert all(r.ok for r in report.rows)
    assert report.errors[0].startswith("backward wrote into cache.attention.weights;")


def test_a_forward_that_writes_into_its_input_fails_and_the_caller_keeps_its_array():
    x = np.random.default_rng(14).standard_normal((3, 4))
    before = x.copy()

    def forward(x, W):
        x *= 2
        return linear_forward(x, W)

    report = gradcheck(forward, linear_backward, x, np.ones((4, 2)))
    assert not report.ok and report.errors[0].startswith("forward wrote into x;")
    np.testing.assert_array_equal(x, before)


def test_a_backward_that_writes_into_a_dict_or_a_plain_object_in_its_cache_is_named():
    class Box:
        def __init__(self, w):
            self.w = w

    def forward(x):
        return 2.0 * x, {"box": Box(x.copy()), "n": 3}

    def backward(dout, cache):
        cache["box"].w[0] = 7.0
        return 2.0 * dout

    report = gradcheck(forward, backward, np.ones(3))
    assert report.errors[0].startswith("backward wrote into cache['box'].w;")


def test_a_backward_that_only_reads_passes():
    """Reading, aliasing and returning views of the cache are no writes."""
    def forward(x):
        return 2.0 * x, x

    report = gradcheck(forward, lambda dout, cache: 2.0 * dout.view(), np.ones(3))
    assert report.ok and report.errors == ()


@pytest.mark.parametrize("layout", ["C", "F", "transposed view"])
def test_numerical_gradient_whatever_the_input_layout(layout):
    """An input laid out by columns (an F-ordered array, a transposed view such as nn.Linear's weight.T)
    is perturbed entry by entry like any other: the gradient of sum(c * x) is c (a private copy in C
    order, so the perturbation lands)."""
    from attention_ref.gradcheck import numerical_gradient

    c = np.random.default_rng(0).standard_normal((4, 3))
    x = {"C": np.ones((4, 3)), "F": np.asfortranarray(np.ones((4, 3))), "transposed view": np.ones((3, 4)).T}[layout]
    np.testing.assert_allclose(numerical_gradient(lambda a: float((c * a).sum()), x), c, rtol=1e-8)
    assert gradcheck(lambda a: (c * a, None), lambda d, cache: d * c, x).ok
