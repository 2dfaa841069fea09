"""Shared test helpers: strict gradient checks and comparisons that say why they failed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from attention_ref import gradcheck

#: The project's bar: every gradient agrees with finite differences in float64 to within
#: 1e-7 of the largest gradient entry of that input (atol covers gradients that are zero
#: up to rounding, such as b_k's, where finite differences give ~1e-9 noise).
STRICT = {"atol": 1e-8, "rtol": 1e-7}

ROOT = Path(__file__).resolve().parents[1]


def run_package(*args, cwd, env=None, timeout=120):
    """``python -m attention_ref ARGS`` in a child process, this checkout first on the path."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "attention_ref", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def check_gradients(forward, backward, *inputs, names=None, seed=0, **tol):
    """Run :func:`gradcheck` at the project's tolerance and fail with its table."""
    report = gradcheck(forward, backward, *inputs, seed=seed, names=names, **{**STRICT, **tol})
    report.raise_if_failed()
    return report


def assert_close(ours, reference, *, rtol=1e-12, atol=1e-12, what="result"):
    """Assert two arrays agree; on failure show both side by side (numpy-ml's err_fmt)."""
    ours, reference = np.asarray(ours), np.asarray(reference)
    assert ours.shape == reference.shape, f"{what}: shape {ours.shape} != reference {reference.shape}"
    if not np.allclose(ours, reference, rtol=rtol, atol=atol):
        err = np.abs(ours - reference)
        i = np.unravel_index(int(np.argmax(err)), err.shape) if err.size else ()
        raise AssertionError(
            f"{what}: max abs error {err.max():.3e} at index {i}\n"
            f"ours:\n{ours}\nreference:\n{reference}"
        )


def random_params(rng, d_model, num_heads, d_k, d_v, *, kdim=None, vdim=None, d_out=None,
                  num_kv_heads=None, bias=True, dtype=np.float64):
    """A params dict with random weights and (optionally) random, non-zero biases."""
    kdim = d_model if kdim is None else kdim
    vdim = d_model if vdim is None else vdim
    d_out = d_model if d_out is None else d_out
    hkv = num_heads if num_kv_heads is None else num_kv_heads
    shapes = {"q": (d_model, num_heads * d_k), "k": (kdim, hkv * d_k),
              "v": (vdim, hkv * d_v), "o": (num_heads * d_v, d_out)}
    p = {}
    for name, (fan_in, fan_out) in shapes.items():
        p["W_" + name] = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(dtype)
        if bias:
            p["b_" + name] = (0.1 * rng.standard_normal(fan_out)).astype(dtype)
    return p
