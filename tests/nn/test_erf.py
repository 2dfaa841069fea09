"""The vectorised erf against math.erf: at most 1e-15 relative error over the real line."""
import math

import numpy as np
import pytest

from attention_ref.nn.erf import ERF_SERIES_LIMIT, erf


def _points():
    dense = np.linspace(-8.0, 8.0, 160_001)  # both expansions and the switch between them
    tiny = np.geomspace(5e-324, 1e-3, 2_000)  # subnormals up to where the series starts to matter
    wide = np.geomspace(1e-3, 1e300, 4_000)
    edges = [0.0, ERF_SERIES_LIMIT, np.nextafter(ERF_SERIES_LIMIT, 0), 5.92, 5.93, 6.0, 26.5, 27.3, np.finfo(float).max]
    x = np.concatenate([dense, tiny, wide, edges])
    return np.concatenate([x, -x])


def test_relative_error_at_most_1e_15_over_the_real_line():
    x = _points()
    ours = erf(x)
    ref = np.array([math.erf(v) for v in x])
    normal = np.abs(ref) >= np.finfo(float).tiny
    rel = np.abs(ours - ref)[normal] / np.abs(ref[normal])
    worst = int(np.argmax(rel))
    assert rel.max() <= 1e-15, f"relative error {rel.max():.2e} at x = {x[normal][worst]!r}"
    ulp = np.spacing(np.abs(ref[~normal]))  # subnormal results: one unit in the last place
    assert (np.abs(ours - ref)[~normal] <= ulp).all()


def test_special_values_and_symmetry():
    assert erf(0.0) == 0.0 and np.signbit(erf(-0.0))
    np.testing.assert_array_equal(erf(np.array([np.inf, -np.inf, 40.0, -40.0])), [1.0, -1.0, 1.0, -1.0])
    assert np.isnan(erf(np.nan))
    x = np.linspace(0, 7, 1001)
    np.testing.assert_array_equal(erf(-x), -erf(x))


@pytest.mark.parametrize("dtype, expected", [(np.float32, np.float32), (np.float64, np.float64), (np.int64, np.float64)])
def test_dtype(dtype, expected):
    x = np.arange(-3, 4).astype(dtype)
    assert erf(x).dtype == expected
    np.testing.assert_allclose(erf(x), [math.erf(v) for v in range(-3, 4)], rtol=1e-6 if dtype == np.float32 else 1e-15)


def test_float32_input_takes_the_short_expansions_and_stays_within_one_unit():
    """float32 and float16 inputs use 18 series terms and 30 fraction levels (a third of the
    work): the result is math.erf rounded to the dtype, within one unit in the last place."""
    import math

    import numpy as np

    from attention_ref.nn.erf import erf

    x = np.concatenate([np.linspace(-8, 8, 100001), np.geomspace(1e-30, 8, 20001),
                        -np.geomspace(1e-30, 8, 20001)])
    for dtype, bits in ((np.float32, np.int32), (np.float16, np.int16)):
        xs = x.astype(dtype)
        ours = erf(xs)
        assert ours.dtype == dtype
        exact = np.array([math.erf(float(t)) for t in xs]).astype(dtype)
        units = np.abs(ours.view(bits).astype(np.int64) - exact.view(bits).astype(np.int64))
        assert units.max() <= 1, (dtype, xs[units.argmax()], units.max())
