"""YaRN: its frequencies and attention factor (nn/yarn.py, through rope_scaling's registry) and the
scaled rotation's backward."""
import math

import numpy as np
import pytest

from attention_ref.nn.rope_scaling import rope_frequencies, rope_parameters, scaled_rope_backward, scaled_rope_forward
from attention_ref.variants.rope import rope_forward
from _helpers import assert_close, check_gradients

GPT_OSS = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
           "original_max_position_embeddings": 4096}


def _loop(d, base, factor, L, beta_fast, beta_slow, truncate):
    """Peng et al.'s NTK-by-parts, pair by pair, from the formula."""
    def index(turns):  # the pair that makes `turns` full turns over L positions
        return d * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))
    low, high = index(beta_fast), index(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    high = high + 0.001 if low == high else high
    out = []
    for i in range(d // 2):
        theta = base ** (-2 * i / d)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        out.append(theta * (1 - ramp) + theta / factor * ramp)
    return np.array(out)


@pytest.mark.parametrize("d,base", [(64, 150000.0), (8, 10000.0), (128, 500000.0)])
@pytest.mark.parametrize("factor,L,beta_fast,beta_slow,truncate", [
    (32.0, 4096, 32.0, 1.0, False), (32.0, 4096, 32.0, 1.0, True), (4.0, 64, 16.0, 2.0, True),
    (2.0, 1_000_000, 32.0, 1.0, True)])  # the last: a long original context, most pairs slowed
def test_frequencies_match_loop(d, base, factor, L, beta_fast, beta_slow, truncate):
    scaling = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": L,
               "beta_fast": beta_fast, "beta_slow": beta_slow, "truncate": truncate}
    theta, _ = rope_parameters(d, base, scaling)
    assert_close(theta, _loop(d, base, factor, L, beta_fast, beta_slow, truncate), what="yarn frequencies")


def test_fast_pairs_kept_slow_pairs_divided():
    theta, a = rope_parameters(64, 150000.0, GPT_OSS)
    plain = 150000.0 ** (-np.arange(0, 64, 2) / 64)
    assert theta[0] == plain[0] and theta[-1] == pytest.approx(plain[-1] / 32, rel=1e-15)
    assert np.all(theta <= plain) and np.all(theta >= plain / 32)
    assert a == pytest.approx(0.1 * math.log(32) + 1, rel=1e-15)


@pytest.mark.parametrize("extra,expected", [
    ({}, 0.1 * math.log(8.0) + 1),
    ({"attention_factor": 1.25}, 1.25),
    ({"mscale": 0.707, "mscale_all_dim": 0.5}, (0.1 * 0.707 * math.log(8) + 1) / (0.1 * 0.5 * math.log(8) + 1)),
    ({"mscale": 1.0}, 0.1 * math.log(8.0) + 1),  # only one of the pair: the default
])
def test_attention_factor(extra, expected):
    _, a = rope_parameters(16, 10000.0, {"rope_type": "yarn", "factor": 8.0,
                                         "original_max_position_embeddings": 64, **extra})
    assert a == pytest.approx(expected, rel=1e-15)


def test_factor_at_most_one_has_attention_factor_one():
    assert rope_parameters(16, 10000.0, {"rope_type": "yarn", "factor": 0.5,
                                         "original_max_position_embeddings": 64})[1] == 1.0


def test_rotation_is_rope_times_the_attention_factor():
    rng = np.random.default_rng(0)
    x, positions = rng.standard_normal((2, 5, 16)), rng.uniform(0, 5000, (2, 5))
    theta, a = rope_parameters(16, 10000.0, {**GPT_OSS, "original_max_position_embeddings": 64})
    y, _ = scaled_rope_forward(x, positions, 10000.0, {**GPT_OSS, "original_max_position_embeddings": 64})
    # the plain rotation with theta's angles: RoPE at rescaled positions pair by pair, by hand
    angles = positions[..., None] * theta
    first, second = x[..., :8], x[..., 8:]
    expected = np.concatenate([first * np.cos(angles) - second * np.sin(angles),
                               first * np.sin(angles) + second * np.cos(angles)], axis=-1)
    assert_close(y, a * expected, what="yarn rotation")
    assert_close(np.linalg.norm(y, axis=-1), a * np.linalg.norm(x, axis=-1), what="lengths times a")


def test_other_types_keep_attention_factor_one():
    x = np.random.default_rng(1).standard_normal((4, 8))
    y, _ = scaled_rope_forward(x, base=10000.0, scaling=None, layout="interleaved")
    assert_close(y, rope_forward(x, layout="interleaved")[0])
    assert rope_parameters(8)[1] == 1.0


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("shape", [(1, 2), (3, 8), (2, 4, 16)])
def test_backward_gradcheck(layout, shape):
    rng = np.random.default_rng(2)
    positions = rng.uniform(0, 300, shape[:-1])
    scaling = {**GPT_OSS, "original_max_position_embeddings": 32, "factor": 4.0}
    check_gradients(lambda x: scaled_rope_forward(x, positions, 1000.0, scaling, layout), scaled_rope_backward,
                    rng.standard_normal(shape), names=["x"])


def test_float32_stays_float32():
    x = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)
    y, cache = scaled_rope_forward(x, scaling={**GPT_OSS, "rope_theta": 150000.0})
    assert y.dtype == scaled_rope_backward(np.ones((3, 8)), cache).dtype == np.float32


def test_rope_frequencies_refuses_yarn_by_name():
    """Frequencies alone would drop the attention factor: the models' path refuses YaRN."""
    with pytest.raises(ValueError, match=r"^RoPE type 'yarn' is not implemented \(only default, linear, llama3\);"
                                         r" it is refused rather than computed as another type \(yarn also scales"
                                         r" cos and sin by an attention factor"):
        rope_frequencies(64, 150000.0, GPT_OSS)


@pytest.mark.parametrize("change,message", [
    ({"beta_fast": -1.0}, r"^scaling\['beta_fast'\] must be a positive real number, got -1.0$"),
    ({"factor": 0.0}, r"^scaling\['factor'\] must be a positive real number, got 0.0$"),
    ({"attention_factor": float("nan")}, r"^scaling\['attention_factor'\] must be a positive real number"),
])
def test_bad_yarn_parameters_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        rope_parameters(64, 150000.0, {**GPT_OSS, **change})
