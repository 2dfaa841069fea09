"""The public pairs pick the path by size, and one switch puts everything on the reference."""
import os
import subprocess
import sys

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.core import attention as core_attention
from attention_ref.fast import attention as fast_attention
from attention_ref.fast import dispatch


@pytest.fixture
def paths_taken(monkeypatch):
    """Record which path's attention forward and backward each call runs."""
    taken = []
    for name, module in (("core", core_attention), ("fast", fast_attention)):
        for step in ("_attention_forward", "_attention_backward"):
            original = getattr(module, step)

            def recording(*args, _original=original, _name=name, **kwargs):
                taken.append(_name)
                return _original(*args, **kwargs)

            monkeypatch.setattr(module, step, recording)
    return taken


def _attend(n_q, n_k, batch=()):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(batch + (n, 4)) for n in (n_q, n_k, n_k))
    out, cache = ar.scaled_dot_product_attention_forward(q, k, v)
    ar.scaled_dot_product_attention_backward(np.ones_like(out), cache)


def test_the_size_rule(paths_taken):
    n = int(np.sqrt(dispatch.FAST_MIN_ELEMENTS))  # 512: n x n probabilities at the threshold
    _attend(n - 1, n - 1)
    _attend(n, n)
    _attend(n // 2, n, batch=(2,))  # the batch axes count
    assert paths_taken == ["core", "core", "fast", "fast", "fast", "fast"]


def test_multi_head_counts_the_heads(monkeypatch):
    monkeypatch.setattr(dispatch, "FAST_MIN_ELEMENTS", 4 * 5 * 5)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 8))
    params = {n: rng.standard_normal((8, 8)) for n in ("W_q", "W_k", "W_v", "W_o")}
    calls = []
    monkeypatch.setattr(dispatch.fast_multi_head, "_multi_head_attention_forward",
                        lambda *a, **kw: calls.append("fast") or ("out", "cache"))
    monkeypatch.setattr(dispatch.core_multi_head, "_multi_head_attention_forward",
                        lambda *a, **kw: calls.append("core") or ("out", "cache"))
    ar.multi_head_attention_forward(x, x, x, params, 2)  # 2 x 5 x 5 probabilities: below
    ar.multi_head_attention_forward(x, x, x, params, 4)  # 4 x 5 x 5: at the threshold
    assert calls == ["core", "fast"]


def test_reference_only_as_a_context_and_as_a_switch(paths_taken):
    n = int(np.sqrt(dispatch.FAST_MIN_ELEMENTS))
    with ar.reference_only():
        _attend(n, n)
    _attend(n, n)
    ar.reference_only()
    try:
        _attend(n, n)
    finally:
        ar.reference_only(False)
    _attend(n, n)
    assert paths_taken == ["core", "core", "fast", "fast", "core", "core", "fast", "fast"]


def test_reference_only_comes_back_after_an_exception():
    before = dispatch.uses_fast_path(1 << 40)
    with pytest.raises(ValueError), ar.reference_only():
        assert not dispatch.uses_fast_path(1 << 40)
        ar.scaled_dot_product_attention_forward(np.ones((2, 3)), np.ones((2, 4)), np.ones((2, 3)))
    assert dispatch.uses_fast_path(1 << 40) == before


def test_the_environment_variable_switches_to_the_reference():
    code = "import attention_ref.fast.dispatch as d; print(d.uses_fast_path(1 << 40))"
    for value, expected in (("1", "False"), ("0", "True"), ("", "True")):
        env = {**os.environ, "ATTENTION_REF_REFERENCE_ONLY": value}
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
        assert result.stdout.strip() == expected, (value, result.stderr)


def test_the_public_pairs_document_the_reference():
    for name in ("scaled_dot_product_attention_forward", "multi_head_attention_backward", "linear_forward"):
        doc = getattr(ar, name).__doc__
        assert "Parameters" in doc or "Returns" in doc
        assert "reference_only()" in doc
