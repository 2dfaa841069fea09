"""rope_frequencies (default, linear, llama3) and scaled_rope_forward / scaled_rope_backward."""
import math

import numpy as np
import pytest

from attention_ref.nn.rope_scaling import rope_frequencies, scaled_rope_backward, scaled_rope_forward
from attention_ref.variants.rope import rope_forward
from _helpers import assert_close, check_gradients

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
LINEAR = {"type": "linear", "factor": 4.0}


def loop_frequencies(dim, base, scaling):
    """theta_i = base^(-2i/dim), then each pair scaled on its own, from the formulas."""
    out = []
    for i in range(dim // 2):
        theta = base ** (-2 * i / dim)
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if kind == "linear":
            theta /= scaling["factor"]
        elif kind == "llama3":
            L, low, high, factor = (scaling["original_max_position_embeddings"], scaling["low_freq_factor"],
                                    scaling["high_freq_factor"], scaling["factor"])
            wavelength = 2 * math.pi / theta
            if wavelength > L / low:
                theta /= factor
            elif wavelength >= L / high:
                s = (L / wavelength - low) / (high - low)
                theta = (1 - s) * theta / factor + s * theta
        out.append(theta)
    return np.array(out)


@pytest.mark.parametrize("dim", [2, 8, 16, 64, 128])
@pytest.mark.parametrize("base", [10.0, 10000.0, 500000.0])
@pytest.mark.parametrize("scaling", [None, LINEAR, LLAMA3, {**LLAMA3, "low_freq_factor": 0.5, "factor": 32.0}])
def test_frequencies_match_loop(dim, base, scaling):
    assert_close(rope_frequencies(dim, base, scaling), loop_frequencies(dim, base, scaling), rtol=1e-14, atol=0)


def test_llama3_has_all_three_regimes():
    theta = rope_frequencies(128, 500000.0, {**LLAMA3, "original_max_position_embeddings": 8192})
    plain = rope_frequencies(128, 500000.0)
    ratio = theta / plain
    assert ratio[0] == 1.0 and ratio[-1] == 1 / 8.0
    assert ((ratio > 1 / 8) & (ratio < 1)).any()  # interpolated pairs in between
    assert (np.diff(ratio) <= 0).all()  # slower pairs are slowed down more


def loop_rope_half(x, positions, theta):
    """y_i = x_i cos(p theta_i) - x_{i+d/2} sin(p theta_i), y_{i+d/2} = x_i sin + x_{i+d/2} cos."""
    y = np.empty(x.shape)
    half = x.shape[-1] // 2
    for idx in np.ndindex(x.shape[:-1]):
        p = positions[idx[-1]]
        for i in range(half):
            c, s = math.cos(p * theta[i]), math.sin(p * theta[i])
            y[idx + (i,)] = x[idx + (i,)] * c - x[idx + (i + half,)] * s
            y[idx + (i + half,)] = x[idx + (i,)] * s + x[idx + (i + half,)] * c
    return y


@pytest.mark.parametrize("shape", [(1, 2), (5, 4), (2, 6, 8), (2, 2, 3, 16)])
@pytest.mark.parametrize("scaling", [None, LINEAR, LLAMA3])
def test_forward_matches_loop(shape, scaling):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    positions = rng.uniform(0, 500, shape[-2])
    y, _ = scaled_rope_forward(x, positions, 10000.0, scaling)
    assert_close(y, loop_rope_half(x, positions, loop_frequencies(shape[-1], 10000.0, scaling)), rtol=1e-12,
                 atol=1e-12)
    assert_close(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1))  # a rotation keeps lengths


def test_default_is_plain_rope():
    x = np.random.default_rng(1).standard_normal((2, 7, 8))
    for layout in ("half", "interleaved"):
        assert np.array_equal(scaled_rope_forward(x, layout=layout)[0], rope_forward(x, layout=layout)[0])
    linear = scaled_rope_forward(x, np.arange(7) * 4.0, scaling=LINEAR)[0]  # positions / 4 with theta / 4
    assert_close(linear, rope_forward(x, np.arange(7.0), layout="half")[0])


@pytest.mark.parametrize("shape", [(1, 2), (5, 4), (2, 6, 8), (2, 2, 3, 6)])
@pytest.mark.parametrize("scaling", [None, LINEAR, LLAMA3])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_backward_gradcheck(shape, scaling, layout):
    rng = np.random.default_rng(2)
    positions = rng.uniform(0, 100, shape[:-1])
    check_gradients(lambda x: scaled_rope_forward(x, positions, 500.0, scaling, layout), scaled_rope_backward,
                    rng.standard_normal(shape), names=["x"])


def test_float32_stays_float32():
    x = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)
    y, cache = scaled_rope_forward(x, scaling=LLAMA3)
    assert y.dtype == scaled_rope_backward(np.ones((3, 8)), cache).dtype == np.float32


@pytest.mark.parametrize("scaling,error,message", [
    ({"rope_type": "yarn", "factor": 4.0}, ValueError,
     r"^RoPE type 'yarn' needs scaling\['original_max_position_embeddings'\], which is missing$"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "truncate": 0}, TypeError,
     r"^scaling\['truncate'\] must be True or False, got 0$"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "low_freq_factor": 1.0},
     ValueError, r"^scaling has \['low_freq_factor'\], which RoPE type 'yarn' does not use here"),
    ({"rope_type": "longrope", "factor": 4.0}, ValueError,
     r"^RoPE type 'longrope' is not implemented \(only default, linear, llama3, yarn\); it is refused"),
    ({"type": "dynamic", "factor": 2.0}, ValueError, r"^RoPE type 'dynamic' is not implemented"),
    ({"rope_type": "linear"}, ValueError, r"^RoPE type 'linear' needs scaling\['factor'\], which is missing$"),
    ({"rope_type": "linear", "factor": 2.0, "mscale": 1.0}, ValueError,
     r"^scaling has \['mscale'\], which RoPE type 'linear' does not use here; it is refused rather than ignored$"),
    ({**LLAMA3, "factor": -1.0}, ValueError, r"^scaling\['factor'\] must be a positive real number, got -1.0$"),
    ({**LLAMA3, "high_freq_factor": 1.0}, ValueError, r"^scaling\['high_freq_factor'\] = 1.0 must be larger"),
    ({"rope_type": "default", "rope_theta": 100.0}, ValueError,
     r"^base = 10000.0 and scaling\['rope_theta'\] = 100.0 disagree"),
    ([("rope_type", "linear")], TypeError, r"^scaling must be None or a mapping"),
    ({"rope_type": "default", "partial_rotary_factor": 0.5}, ValueError,
     r"^scaling's partial_rotary_factor rotates 4 of x's 8 features; use attention_ref.nn.partial_rotary"),
])
def test_bad_scalings_are_refused_by_name(scaling, error, message):
    with pytest.raises(error, match=message) as info:
        scaled_rope_forward(np.ones((2, 8)), base=10000.0, scaling=scaling)
    assert "\n" not in str(info.value)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match=r"^x must have an even last dimension d"):
        scaled_rope_forward(np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"^positions of shape \(3,\) does not fit x of shape \(2, 4\): expected \(2,\)$"):
        scaled_rope_forward(np.ones((2, 4)), np.arange(3))
    with pytest.raises(ValueError, match=r"^the rotated width int\(dim \* partial_rotary_factor\) = int\(6 \* 0.5\)"):
        rope_frequencies(6, scaling={"partial_rotary_factor": 0.5})
    assert rope_frequencies(8, scaling={"rope_theta": 100.0}).tolist() == (100.0 ** -(np.arange(0, 8, 2) / 8)).tolist()


def test_the_families_page_example_holds():
    """docs/families.md's code block runs and its asserts (every number it shows) hold."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "families.md").read_text(encoding="utf-8")
    blocks = text.split("```python\n")[1:]
    assert blocks, "docs/families.md has no python example"
    for block in blocks:
        exec(compile(block.split("```", 1)[0], "docs/families.md", "exec"), {})
