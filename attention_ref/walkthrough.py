"""The command-line walkthrough (placeholder until the documents' walkthrough lands)."""
from __future__ import annotations

import numpy as np

from . import gradcheck, multi_head_attention_backward, multi_head_attention_forward


def main(argv=None) -> int:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6))
    params = {n: rng.standard_normal((6, 6)) / 3 for n in ("W_q", "W_k", "W_v", "W_o")}
    out, cache = multi_head_attention_forward(x, x, x, params, 2)
    print("multi-head attention output:\n", np.round(out, 4))
    report = gradcheck(multi_head_attention_forward, multi_head_attention_backward,
                       x, x, x, params, 2, names=["query", "key", "value", "params"])
    print(report)
    return 0 if report.ok else 1
