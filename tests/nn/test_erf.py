"""The vectorised erf against math.erf: within 4 units in the last place over the whole float64
range (dense grids, random draws over every exponent, random bit patterns, the tails, subnormals)
and over float32's, float32 staying float32; special values exact. Accuracy only: the timing
against np.tanh is measured by benchmarks, never here."""
import math

import numpy as np
import pytest

from attention_ref.nn.erf import ERF_SERIES_LIMIT, erf

ULPS = 4  # the contract; the pieces measure at 1 here


def _units_from_math_erf(x):
    """|ours - math.erf| in units in the last place of math.erf's result (subnormal units included)."""
    ours = erf(x)
    ref = np.array([math.erf(float(v)) for v in x.ravel()], dtype=np.float64).astype(x.dtype).reshape(x.shape)
    return np.abs(ours.astype(np.float64) - ref) / np.spacing(np.abs(ref).astype(x.dtype)).astype(np.float64)


def _assert_within(x, units=ULPS):
    u = _units_from_math_erf(x)
    worst = int(np.argmax(u))
    assert u.max() <= units, f"{u.max():.2f} units from math.erf at x = {x.ravel()[worst]!r}"


def test_dense_grid_over_every_piece_and_their_edges():
    x = np.linspace(-7.0, 7.0, 280_001)  # steps of 5e-5: both pieces of erfcx and the switch at 1, 2.5 and 6
    edges = np.array([ERF_SERIES_LIMIT, 2.5, 6.0, 5.92, 5.93])
    edges = np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, 10)])
    _assert_within(np.concatenate([x, edges, -edges]))


def test_random_draws_over_every_exponent_tails_and_subnormals():
    rng = np.random.default_rng(0)
    uniform = rng.uniform(-6.5, 6.5, 100_000)
    log_uniform = np.exp(rng.uniform(-744.0, 709.0, 50_000)) * rng.choice([-1.0, 1.0], 50_000)  # 5e-324 to 8e307
    bits = rng.integers(0, 2 ** 63, 50_000, dtype=np.uint64).view(np.float64)  # any finite float64, sign included
    subnormal = np.geomspace(5e-324, 2.2e-308, 2_000)
    tiny = np.geomspace(2.2e-308, 1e-3, 2_000)  # where erf(x) = 2x / sqrt(pi) to rounding
    tails = np.append(np.geomspace(6.0, 1e308, 2_000), np.finfo(float).max)
    x = np.concatenate([uniform, log_uniform, bits[np.isfinite(bits)], subnormal, -subnormal, tiny, -tiny, tails, -tails])
    _assert_within(x)


def test_float32_over_its_whole_range_stays_float32():
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2 ** 32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([bits[np.isfinite(bits)], np.linspace(-7, 7, 50_001, dtype=np.float32),
                        np.geomspace(1e-45, 1e-37, 500, dtype=np.float32)])  # float32's subnormals
    assert erf(x).dtype == np.float32
    _assert_within(x)


def test_float16_stays_float16_within_the_same_units():
    x = np.arange(-(2 ** 15), 2 ** 15, dtype=np.int32).astype(np.int16).view(np.float16)  # every float16
    x = x[np.isfinite(x)]
    assert erf(x).dtype == np.float16
    _assert_within(x)


def test_special_values_and_symmetry():
    assert erf(0.0) == 0.0 and not np.signbit(erf(0.0)) and np.signbit(erf(-0.0))
    np.testing.assert_array_equal(erf(np.array([np.inf, -np.inf, 6.0, -40.0, np.finfo(float).max])),
                                  [1.0, -1.0, 1.0, -1.0, 1.0])
    assert np.isnan(erf(np.nan)) and np.isnan(erf(np.array([1.0, np.nan, -np.nan]))[1:]).all()
    x = np.linspace(0, 7, 1001)
    np.testing.assert_array_equal(erf(-x), -erf(x))
    assert erf(np.float32(-0.0)).dtype == np.float32 and np.signbit(erf(np.float32(-0.0)))


@pytest.mark.parametrize("dtype, expected", [(np.float32, np.float32), (np.float64, np.float64), (np.int64, np.float64)])
def test_dtype_and_shape(dtype, expected):
    x = np.arange(-3, 3).astype(dtype).reshape(2, 3)
    got = erf(x)
    assert got.dtype == expected and got.shape == (2, 3)
    np.testing.assert_allclose(got.ravel(), [math.erf(v) for v in range(-3, 3)], rtol=1e-6 if dtype == np.float32 else 1e-15)


def test_input_left_unchanged_and_empty():
    x = np.array([-3.0, 0.5, 2.0, 8.0])
    before = x.copy()
    erf(x)
    np.testing.assert_array_equal(x, before)
    assert erf(np.zeros((0, 3))).shape == (0, 3)
