"""compare's verdicts: what they name, what they only locate, unsupported features, exceptions,
settings, the R-ratio, and the catalogue against docs/compare.md."""
import math
import re
from pathlib import Path

import numpy as np
import pytest

from attention_ref import compare
from attention_ref.compare.judge import _Judged
from attention_ref.compare.operations import OPERATIONS

ROOT = Path(__file__).resolve().parents[2]

ISSUE_IDS = ("rope_layout rope_theta rope_scaling_ignored rope_position_offset partial_rotary gqa_head_order head_dim "
             "attention_scale softcap_missing mask_inverted causal_off_by_one window_off_by_one window_wrong_layers "
             "padding_ignored masked_row_nan softmax_axis softmax_overflow rms_norm_eps norm_offset qk_norm_placement "
             "post_norm_missing embedding_scale tied_head conv1d_transpose gelu_variant qkv_bias_missing "
             "parallel_residual gate_up_swapped fused_qkv_split low_precision").split()


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def attention(q, k, v, mask, empty="zeros"):
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    z = e.sum(-1, keepdims=True)
    out = (e / np.where(z > 0, z, 1)) @ v
    if empty == "mean":  # transformers' eager path: a row of equal (masked) scores averages the values
        out = np.where(z > 0, out, v.mean(-2, keepdims=True))
    return out


def test_a_verdict_is_a_bool_a_check_and_a_sentence():
    good = compare.operation("softmax", softmax)
    assert good.ok is True and bool(good) and good.mistake is None and good.where is None and good.inputs == ()
    good.check()
    assert re.match(r"^softmax: matches the reference on all \d+ cases \(largest relative error .* in float64,"
                    r" R-ratio .* in float32\)\.$", str(good))
    bad = compare.operation("softmax", lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True))
    assert not bad and bad.mistake == "softmax_overflow" and bad.where == "max subtraction"
    assert bad.inputs == ("scores beyond exp's range",)
    with pytest.raises(AssertionError) as raised:
        bad.check()
    assert str(raised.value) == str(bad)
    assert "Mistake: softmax_overflow (docs/compare.md)" in str(bad) and "wrong: exp(x) / sum(exp(x))" in str(bad)


@pytest.mark.parametrize("name, fn, where", [
    ("softmax", lambda x: softmax(x / 2), "softmax's output (no input feature separates the wrong cases from the"
                                          " right ones)"),  # a temperature: no mistake of the catalogue
    ("layer_norm", lambda x, w, b, eps: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, ddof=1, keepdims=True)
                                                                                    + eps) * w + b,
     "variance"),  # the unbiased variance; with weight 1 and bias 0 it is still wrong: the variance step
    ("rms_norm", lambda x, w, eps: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w * w, "weight"),
    ("rope", lambda x, p: x, "angles"),  # no rotation at all: right at position 0
    ("rope", lambda x, p: -x, "pairs"),  # wrong even where every angle is 0
    ("scaled_dot_product_attention", lambda q, k, v, m: 2 * attention(q, k, v, m), "weighted sum"),
    ("scaled_dot_product_attention", lambda q, k, v, m: attention(q + 0.1, k, v, m), "softmax"),
    ("swiglu", lambda x, g, u, d: (np.maximum(x @ g, 0) * (x @ u)) @ d, "gate"),  # ReLU for SiLU
    ("swiglu", lambda x, g, u, d: (x @ g / (1 + np.exp(-(x @ g))) * (x @ u)) @ (d / np.linalg.norm(d, axis=-1,
                                                                                               keepdims=True)),
     "down"),  # w_down's rows normalised: invisible when w_down is the identity
])
def test_a_difference_no_variant_explains_is_located_not_named(name, fn, where):
    verdict = compare.operation(name, fn)
    assert not verdict.ok and verdict.mistake is None, str(verdict)
    assert "No mistake of the catalogue reproduces it on every case; located only." in str(verdict)
    assert verdict.error > 1e-4 and "Largest relative error" in verdict.detail
    if where is not None:
        assert verdict.where == where


def test_the_features_that_show_a_difference():
    """A RoPE that ignores the positions of every row but the first: wrong only on per-row positions."""
    def first_row_only(x, positions):
        from attention_ref import rope_forward
        return rope_forward(x, np.broadcast_to(positions[:1], positions.shape)[:, None, :])[0]
    verdict = compare.operation("rope", first_row_only)
    assert verdict.mistake == "rope_position_offset" and verdict.inputs == ("positions per batch row",)


def test_padding_rows_are_judged_only_for_nan_and_inf():
    compare.operation("scaled_dot_product_attention", attention).check()
    compare.operation("scaled_dot_product_attention", lambda *a: attention(*a, empty="mean")).check()

    def nan_rows(q, k, v, mask):
        out = attention(q, k, v, mask)
        if mask is not None:
            empty = ~np.broadcast_to(mask, q.shape[:-1] + (k.shape[-2],)).any(-1)
            out = np.where(empty[..., None], np.nan, out)
        return out
    verdict = compare.operation("scaled_dot_product_attention", nan_rows)
    assert verdict.mistake == "masked_row_nan" and verdict.inputs == ("fully masked rows",)


def test_a_feature_that_raises_on_every_case_is_left_out_and_named():
    def no_grouped_heads(q, k, v, mask):
        if k.shape[1] != q.shape[1]:
            raise ValueError("grouped heads are not supported")
        return attention(q, k, v, mask)
    verdict = compare.operation("scaled_dot_product_attention", no_grouped_heads)
    assert verdict.ok and verdict.unsupported == ("grouped heads",), str(verdict)
    assert str(verdict).endswith("Not supported (it raised on every such case; judged on the others): grouped heads.")


def test_an_exception_on_some_cases_of_a_feature_is_a_failure_with_the_users_line():
    def flaky(x):
        if np.isinf(x).any():
            raise ValueError("cannot handle -inf")
        return softmax(x)
    verdict = compare.operation("softmax", flaky)
    assert not verdict.ok and verdict.where == "the call raised" and verdict.mistake is None
    assert verdict.inputs == ("-inf entries",) and verdict.failed == 2
    assert (f"{__file__}, line" in verdict.detail
            and 'raise ValueError("cannot handle -inf"): ValueError: cannot handle -inf' in verdict.detail)


def test_a_function_that_raises_everywhere():
    verdict = compare.operation("gelu", lambda x: 1 / 0)
    assert not verdict.ok and verdict.where == "the call raised" and "ZeroDivisionError" in verdict.detail


def test_a_wrong_shape_is_a_verdict():
    verdict = compare.operation("softmax", lambda x: softmax(x)[..., :-1])
    assert not verdict.ok and verdict.where == "the output's shape" and "returned shape" in verdict.detail


def test_float32_is_judged_by_the_r_ratio_and_float16_work_is_named():
    careful = compare.operation("softmax", lambda x: softmax(x.astype(np.float64)).astype(x.dtype))
    assert careful.ok and careful.r_ratio <= compare.R_LIMIT
    half = compare.operation("softmax", lambda x: softmax(x.astype(np.float16)).astype(x.dtype))
    assert half.mistake == "low_precision" and half.r_ratio > compare.R_LIMIT, str(half)
    assert "computed in float16" in half.detail


def test_the_users_arrays_and_numpy_settings_are_left_alone():
    seen = []

    def scribbler(x, w, eps):
        seen.append(x)
        x *= 2  # the user's code writes into its argument: a copy, never the case's own array
        return x
    before = np.geterr()
    compare.operation("rms_norm", scribbler)
    assert np.geterr() == before
    first = seen[0]
    again = []
    compare.operation("rms_norm", lambda x, w, eps: again.append(x.copy()) or x)
    assert not np.array_equal(first, again[0] * 2) or True  # draws are seeded: the same cases each time
    np.testing.assert_array_equal(again[0] * 2, first)


def test_the_seed_changes_the_draw_and_the_verdict_holds():
    for seed in (1, 2):
        compare.operation("swiglu", lambda x, g, u, d: ((x @ g) / (1 + np.exp(-(x @ g))) * (x @ u)) @ d,
                          seed=seed).check()


@pytest.mark.parametrize("call, error, message", [
    (lambda: compare.operation("softmaxx", softmax), ValueError, r"^name must be one of \('softmax', "),
    (lambda: compare.operation("softmax", 3), TypeError, r"^fn must be callable \(fn\(x\), along the last axis\),"
                                                        r" got int$"),
    (lambda: compare.operation("softmax", softmax, scale=2.0), TypeError,
     r"^compare.operation\('softmax'\) has no setting 'scale'; its settings are atol, rtol, seed$"),
    (lambda: compare.operation("rope", softmax, layout="rotate"), ValueError,
     r"^layout must be one of \('half', 'interleaved'\), got 'rotate'$"),
    (lambda: compare.operation("rope", softmax, rotary_dim=5), ValueError,
     r"^rotary_dim must be an even integer >= 2 or None, got 5$"),
    (lambda: compare.operation("rope", softmax, theta=-1.0), ValueError,
     r"^theta must be a positive real number, got -1.0$"),
    (lambda: compare.operation("gelu", softmax, approximate="erf"), ValueError,
     r"^approximate must be 'none' or 'tanh', got 'erf'$"),
    (lambda: compare.operation("softmax", softmax, rtol=-1), ValueError,
     r"^rtol must be a non-negative real number, got -1$"),
    (lambda: compare.operation("rope", softmax, scaling={"rope_type": "llama3"}), ValueError, r"factor"),
])
def test_bad_settings_are_refused_by_name(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_every_variant_shows_on_some_case(name):
    """The cases reach where each mistake shows: every variant differs from the reference somewhere."""
    spec = OPERATIONS[name]
    settings = {**spec.settings, "rtol": 1e-10, "atol": 0.0, "seed": 0,
                **({"rotary_dim": 8, "theta": 500000.0,
                    "scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
                   if name == "rope" else {}), **({"softcap": 50.0} if name.startswith("scaled") else {})}
    cases = spec.cases(settings, np.random.default_rng(0))
    judged = [_Judged(spec, settings, c, spec.reference(c, settings, np.float64) if c.dtype is not None
                      else spec.reference(c, settings)) for c in cases]
    for variant in spec.variants(settings, cases[0]):
        shows = False
        for j in judged:
            value, dont_care = variant.compute(j.case, settings)
            shows |= j.against(value, dont_care) > j.allow
        assert shows, variant.key


def test_the_catalogue_has_the_issues_ids_and_docs_compare_md_describes_each():
    assert sorted(compare.MISTAKES) == sorted(ISSUE_IDS)
    text = (ROOT / "docs" / "compare.md").read_text(encoding="utf-8")
    headings = re.findall(r"^### `(\w+)`", text, flags=re.M)
    assert headings == list(compare.MISTAKES), "docs/compare.md lists the mistakes in the catalogue's order"
    for mistake in compare.MISTAKES.values():
        section = text.split(f"### `{mistake.id}`", 1)[1].split("\n### ", 1)[0]
        for thread in mistake.threads:
            assert thread in section, (mistake.id, thread)
        level = "operation" if mistake.operations else "module and model"
        assert f"Level: {level}" in section, mistake.id


def test_the_line_shown_is_the_users_when_the_package_raises_below_it():
    from attention_ref import rope_forward

    def calls_the_package(x, positions):
        return rope_forward(x, positions[:, None, :], base=-1.0)[0]
    verdict = compare.operation("rope", calls_the_package)
    assert not verdict.ok and verdict.where == "the call raised"
    assert f"{__file__}, line" in verdict.detail and "return rope_forward(x, positions[:, None, :], base=-1.0)[0]" \
        in verdict.detail and "ValueError: base must be" in verdict.detail


def test_the_rope_trap_shape_is_a_feature_not_supported():
    """(B, T) positions handed on to rope_forward against (B, H, T, D): refused on every case with more
    than one batch row, so those cases are left out and named; B = 1 broadcasts and is judged."""
    from attention_ref import rope_forward
    verdict = compare.operation("rope", lambda x, positions: rope_forward(x, positions)[0])
    assert verdict.ok and verdict.unsupported == ("batch axes",), str(verdict)


def test_compare_stands_apart_and_imports_no_torch():
    """import attention_ref does not import compare; compare itself imports torch only to call torch code."""
    import subprocess
    import sys
    code = ("import sys, attention_ref\n"
            "assert 'attention_ref.compare' not in sys.modules\n"
            "from attention_ref import compare\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "compare.operation('gelu', lambda x: x * 0.5 * (1 + __import__('numpy').tanh(0.7978845608028654"
            " * (x + 0.044715 * x ** 3))), approximate='tanh').check()\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_mask_of_numbers_is_a_verdict_on_its_dtype():
    verdict = compare.operation("causal_mask", lambda Tq, Tk, w: np.tril(np.ones((Tq, Tk)), Tk - Tq))
    assert not verdict.ok and verdict.where == "the output's dtype" and "float64" in verdict.detail


def test_rope_theta_may_come_in_the_scaling_dict():
    from attention_ref.nn.rope_scaling import scaled_rope_forward
    parameters = {"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0}  # transformers 5's rope_parameters
    right = compare.operation("rope", lambda x, p: scaled_rope_forward(x, p[:, None, :], 500000.0,
                                                                         {"rope_type": "linear", "factor": 4.0})[0],
                              scaling=parameters)
    assert right.ok, str(right)
    with pytest.raises(ValueError, match=r"^theta = 10000.0 and scaling\['rope_theta'\] = 500000.0 disagree"):
        compare.operation("rope", softmax, theta=10000.0, scaling=parameters)
