"""Qwen3's and Gemma 3's RMSNorm of each head's query and key (before RoPE) is the RMSNorm pairs applied
to the split heads (..., H, N, Dh) over their last axis with a weight (Dh,) shared by the heads: no new
pair is needed. These tests hold that: a plain loop per head, gradcheck, the weight gradient summed
over heads and positions."""
import math

import numpy as np
import pytest

from attention_ref.core.heads import split_heads
from attention_ref.nn.gemma_rms_norm import gemma_rms_norm_backward, gemma_rms_norm_forward
from attention_ref.nn.rms_norm import rms_norm_backward, rms_norm_forward
from _helpers import assert_close, check_gradients

PAIRS = {"qwen3": (rms_norm_forward, rms_norm_backward, lambda w: w),
         "gemma3": (gemma_rms_norm_forward, gemma_rms_norm_backward, lambda w: 1 + w)}
SHAPES = [(1, 1, 2, 4), (2, 3, 5, 4), (1, 4, 3, 8)]  # (B, H, N, Dh)


@pytest.mark.parametrize("family", sorted(PAIRS))
@pytest.mark.parametrize("shape", SHAPES)
def test_per_head_norm_matches_loop(family, shape):
    forward, _, gain = PAIRS[family]
    rng = np.random.default_rng(0)
    B, H, N, Dh = shape
    q = split_heads(rng.standard_normal((B, N, H * Dh)), H)  # (B, H, N, Dh)
    w = rng.standard_normal(Dh)
    y, _ = forward(q, w, 1e-6)
    reference = np.empty(shape)
    for b, h, n in np.ndindex(B, H, N):
        row = q[b, h, n]
        rms = math.sqrt(sum(v * v for v in row) / Dh + 1e-6)
        reference[b, h, n] = [gain(w)[j] * row[j] / rms for j in range(Dh)]
    assert_close(y, reference, what=f"{family} q norm")


@pytest.mark.parametrize("family", sorted(PAIRS))
@pytest.mark.parametrize("shape", SHAPES)
def test_per_head_norm_gradcheck(family, shape):
    forward, backward, _ = PAIRS[family]
    rng = np.random.default_rng(1)
    check_gradients(forward, backward, rng.standard_normal(shape), rng.standard_normal(shape[-1]),
                    names=["q", "weight"])
