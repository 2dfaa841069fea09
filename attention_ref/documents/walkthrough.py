"""``python -m attention_ref``: the documents' two-head example one formula at a time,
then the claims table, then a gradient check of every operation.

Sections (``--section``, default all): ``example`` walks through 004 section 4.2 (inputs,
projections, scores, weights, heads, concatenation, ``W^O``), printing the document's
value beside ours wherever they differ; ``claims`` prints every checked claim of the five
documents (:mod:`attention_ref.documents.claims`); ``gradcheck`` checks every forward/backward pair
against finite differences and exits with status 1 if any fails. ``--plots DIR`` also
writes the figures of :mod:`attention_ref.plot` as PNGs. Output fits 80 columns.
"""
from __future__ import annotations

import argparse
import math
import sys
import textwrap
from pathlib import Path

import numpy as np

from .._checks import as_generator
from ..core.attention import scaled_dot_product_attention_backward, scaled_dot_product_attention_forward
from ..core.heads import merge_heads, merge_heads_backward, split_heads, split_heads_backward
from ..core.linear import linear_backward, linear_forward
from ..core.masks import causal_mask, padding_mask
from ..variants.grouped_heads import multi_head_attention_backward, multi_head_attention_forward
from ..core.separate_heads import (
    multi_head_attention_separate_heads_backward,
    multi_head_attention_separate_heads_forward,
)
from ..core.softmax import softmax_backward, softmax_forward
from ..gradcheck import gradcheck
from ..nn.decoder_block import decoder_block_backward, decoder_block_forward, init_decoder_block_params
from ..nn.encoder_block import encoder_block_backward, encoder_block_forward, init_encoder_block_params
from ..nn.feed_forward import feed_forward_backward, feed_forward_forward
from ..nn.gpt2_block import gpt2_block_backward, gpt2_block_forward, init_gpt2_block_params
from ..nn.layer_norm import layer_norm_backward, layer_norm_forward
from ..nn.llama_block import init_llama_block_params, llama_block_backward, llama_block_forward
from ..nn.rms_norm import rms_norm_backward, rms_norm_forward
from ..nn.swiglu import swiglu_backward, swiglu_forward
from ..variants.blockwise import flash_attention_backward, flash_attention_forward
from ..variants.linear_attention import linear_attention_backward, linear_attention_forward
from ..variants.rope import rope_backward, rope_forward
from . import printed_values as documents
from .claims.claim import fmt
from .claims.table import render_summary, render_text
from .worked_examples import W_O_READINGS, single_token_example, two_head_example

__all__ = ["main", "example_section", "summary_section", "claims_section", "gradcheck_section", "gradcheck_cases",
           "SECTIONS", "WIDTH"]

WIDTH = 80
#: The tolerance of the gradient check table (the test suite's strict bar).
TOLERANCE = {"atol": 1e-8, "rtol": 1e-7}


def _heading(title: str) -> list[str]:
    return ["", title, "-" * min(len(title), WIDTH)]


def _value_line(label: str, ours, printed=None) -> str:
    """``label = ours``, plus the document's value (saying whether it agrees) when printed."""
    line = f"  {label:<14} = {fmt(ours)}"
    if printed is not None:
        agrees = np.allclose(np.ravel(ours), np.ravel(printed), atol=1e-9)
        note = f"document: {fmt(printed)} ({'agrees' if agrees else 'differs'})"
        if len(line) < 42 and 44 + len(note) <= WIDTH:
            return f"{line:<44}{note}"
        return f"{line}\n{'':<19}{note}"
    return line


def _matrix(label: str, M) -> list[str]:
    rows = [fmt(r) for r in np.asarray(M)]
    return [f"  {label:<14} = {rows[0]}"] + [f"  {'':<14}   {r}" for r in rows[1:]]


def example_section() -> str:
    """The two-head example of 004 section 4.2, formula by formula."""
    d, r = documents.TWO_HEAD, two_head_example()
    out = [f"The two-head example of document {d['cite']}, recomputed.",
           "One token x, h = 2 heads, d_k = d_v = 2, d_model = 3, no biases. Where the",
           "document prints another value it is shown on the right."]
    out += _heading("Step 0. Inputs")
    out.append(_value_line("x", d["x"]))
    for i in range(d["h"]):
        for name in ("Q", "K", "V"):
            out += _matrix(f"W_{i + 1}^{name}", d[f"W_{name}"][i])
    out += _heading("Step 1. Projections   Q_i = x W_i^Q,  K_i = x W_i^K,  V_i = x W_i^V")
    for i in range(d["h"]):
        out.append(_value_line(f"Q_{i + 1}", r.Q[i], d["printed_Q"][i]))
        out.append(_value_line(f"K_{i + 1}", r.K[i], d["printed_K"][i]))
        out.append(_value_line(f"V_{i + 1}", r.V[i], d["printed_V"][i]))
    out += _heading("Step 2. Scores   s_i = Q_i K_i^T / sqrt(d_k)")
    for i in range(d["h"]):
        out.append(f"  head {i + 1}: Q_{i + 1} K_{i + 1}^T = {fmt(r.dots[i].item())}, / sqrt(2) ="
                   f" {fmt(r.scores[i].item())}   (not printed)")
    out += _heading("Step 3. Weights   a_i = softmax(s_i) over the keys")
    for i in range(d["h"]):
        out.append(f"  head {i + 1}: a_{i + 1} = {fmt(r.weights[i].item())}")
    out.append("  One token means one key: a softmax over one score is exactly 1.")
    out += _heading("Step 4. Heads   head_i = a_i V_i")
    for i in range(d["h"]):
        out.append(_value_line(f"head_{i + 1}", r.heads[i], d["printed_head"][i]))
    out += _heading("Step 5. Concatenation   Concat(head_1, head_2)")
    out.append(_value_line("concat", r.concat, d["printed_concat"]))
    out += _heading("Step 6. Output projection   MultiHead = Concat(...) W^O")
    out += _matrix("W^O as printed", d["W_O_as_printed"])
    out += textwrap.wrap(
        "The printed W^O is 3 x 4 but the concatenation is 1 x 4: the product is undefined."
        f" Our reading: {W_O_READINGS['transpose']}. Alternative: {W_O_READINGS['row-major']}.",
        WIDTH, initial_indent="  ", subsequent_indent="  ")
    out += _matrix("W^O (ours)", r.W_o)
    out.append(_value_line("output", r.output, d["printed_output"]))
    out.append(f"  other reading, W^O refilled row by row: {fmt(r.output_row_major)}")
    out.append(f"  the document's concat times our W^O:    {fmt(r.output_from_printed_concat)}")
    out.append(f"  ... times W^O refilled row by row:      {fmt(r.output_from_printed_concat_row_major)}")
    out.append("  No reading of W^O reproduces the document's output.")
    out.append("")
    out.append("  The whole layer at once, multi_head_attention_forward(x, x, x, params, 2):")
    out.append(_value_line("output", r.layer_output))
    t, printed = single_token_example(), documents.SINGLE_TOKEN
    out += _heading(f"Also: the single-token example of {printed['cite']}")
    out.append(f"  q.k = {' + '.join(fmt(p) for p in t.products)} = {fmt(t.dot)}")
    out.append(_value_line("q.k / sqrt(3)", t.score, printed["printed_score"]))
    out.append(_value_line("alpha", t.alpha, printed["printed_alpha"]))
    out.append(_value_line("output", t.output, printed["printed_output"]))
    numerator = printed["printed_score"] * np.sqrt(printed["d_k"])
    out.append(f"  The printed score is {fmt(numerator, 2)} / sqrt({printed['d_k']}); with one key alpha is 1"
               " regardless.")
    return "\n".join(out)


def claims_section() -> str:
    """Every checked claim of the five documents, with its note."""
    return "Every checkable claim of the five documents (docs/claims.md).\n" + render_text(WIDTH)


def summary_section() -> str:
    """Every checked claim of the five documents, one line each."""
    return ("Every checkable claim of the five documents, one line each; the notes (how each\n"
            "mistake arises) are in --section claims and docs/claims.md.\n" + render_summary(WIDTH))


NEXT_STEPS = """\
Where next:
  python -m attention_ref --section claims     every claim with its note
  python -m attention_ref exercise list        derive a backward yourself; the
                                               checker names the classic mistake
  python -m attention_ref --plots figures/     the figures, as PNG files
  notebooks/                                   20 notebooks, one topic each
  docs/reading_guide.md                        which five files to read first"""


def gradcheck_cases(seed: int = 0) -> list[tuple]:
    """(name, forward, backward, inputs, input names) for every operation of the core,
    on small float64 shapes with n_q != n_k, d_k != d_v, masks and biases where relevant."""
    rng = as_generator(seed)

    def rand(*shape):
        return rng.standard_normal(shape)

    def params(d_in, h, d_k, d_v, d_out, hkv=None):
        hkv = h if hkv is None else hkv
        shapes = {"q": (d_in, h * d_k), "k": (d_in, hkv * d_k), "v": (d_in, hkv * d_v), "o": (h * d_v, d_out)}
        p = {}
        for n, s in shapes.items():
            p["W_" + n] = rand(*s) / math.sqrt(s[0])
            p["b_" + n] = 0.1 * rand(s[1])
        return p

    def jitter(p):
        """Initial parameters plus noise, so no bias or gain sits at a special value."""
        return {n: a + 0.1 * rand(*a.shape) for n, a in p.items()}

    bool_mask = causal_mask(3, 4)  # (Nq=3, Nk=4)
    keep = rng.random((5, 5)) < 0.7  # a random keep-mask for the blockwise path, (5, 5)
    keep[np.arange(5), np.arange(5)] = True  # every query keeps itself
    pad = padding_mask(np.array([4, 2]), 4)  # (B=2, 1, Nk=4)
    # split and merge keep no cache: adapt them to the (out, cache) protocol
    def split_f(x, h):
        return split_heads(x, h), None

    def split_b(d, _):
        return split_heads_backward(d)

    def merge_f(x):
        return merge_heads(x), x.shape[-3]

    def merge_b(d, h):
        return merge_heads_backward(d, h)

    def head_mask_f(q, k, v, p, head_mask):
        return multi_head_attention_forward(q, k, v, p, 2, head_mask=head_mask)

    def head_mask_b(dout, cache):
        dq, dk, dv, grads = multi_head_attention_backward(dout, cache)
        return dq, dk, dv, {n: g for n, g in grads.items() if n != "head_mask"}, grads["head_mask"]

    return [
        ("linear  y = x W + b", linear_forward, linear_backward,
         (rand(2, 3, 4), rand(4, 5), rand(5)), ["x", "W", "b"]),
        ("softmax (rows)", softmax_forward, softmax_backward, (rand(2, 3, 5),), ["x"]),
        ("attention, causal mask", scaled_dot_product_attention_forward,
         scaled_dot_product_attention_backward,
         (rand(2, 3, 4), rand(2, 4, 4), rand(2, 4, 5), bool_mask), ["q", "k", "v"]),
        ("attention, padding mask", scaled_dot_product_attention_forward,
         scaled_dot_product_attention_backward,
         (rand(2, 3, 4), rand(2, 4, 4), rand(2, 4, 2), pad), ["q", "k", "v"]),
        ("attention, a blocked query", scaled_dot_product_attention_forward,
         scaled_dot_product_attention_backward,
         (rand(3, 4), rand(4, 4), rand(4, 2), np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], bool)),
         ["q", "k", "v"]),
        ("split heads", split_f, split_b, (rand(2, 3, 6), 2), ["x"]),
        ("merge heads", merge_f, merge_b, (rand(2, 2, 3, 3),), ["x"]),
        ("multi-head, parallel", multi_head_attention_forward, multi_head_attention_backward,
         (rand(2, 3, 6), rand(2, 4, 6), rand(2, 4, 6), params(6, 2, 3, 2, 5), 2, bool_mask),
         ["query", "key", "value", "params"]),
        ("multi-head, separate heads", multi_head_attention_separate_heads_forward,
         multi_head_attention_separate_heads_backward,
         (rand(2, 3, 6), rand(2, 4, 6), rand(2, 4, 6), params(6, 2, 3, 2, 5), 2, bool_mask),
         ["query", "key", "value", "params"]),
        ("multi-head, head mask", head_mask_f, head_mask_b,
         (rand(3, 6), rand(4, 6), rand(4, 6), params(6, 2, 3, 3, 6), np.array([0.5, 1.5])),
         ["query", "key", "value", "params", "head_mask"]),
        ("multi-query (1 kv head)",
         lambda q, k, v, p: multi_head_attention_forward(q, k, v, p, 2, num_kv_heads=1),
         multi_head_attention_backward,
         (rand(3, 6), rand(4, 6), rand(4, 6), params(6, 2, 3, 2, 6, hkv=1)),
         ["query", "key", "value", "params"]),
        ("grouped-query (2 of 4 kv)",
         lambda q, k, v, p: multi_head_attention_forward(q, k, v, p, 4, num_kv_heads=2),
         multi_head_attention_backward,
         (rand(2, 3, 6), rand(2, 4, 6), rand(2, 4, 6), params(6, 4, 2, 3, 6, hkv=2)),
         ["query", "key", "value", "params"]),
        ("blockwise, causal, block 2",
         lambda q, k, v: flash_attention_forward(q, k, v, causal=True, block_size=2),
         flash_attention_backward, (rand(2, 5, 3), rand(2, 5, 3), rand(2, 5, 2)), ["q", "k", "v"]),
        ("blockwise, window 1 + mask",
         lambda q, k, v: flash_attention_forward(q, k, v, mask=keep, block_size=2, window=1),
         flash_attention_backward, (rand(5, 3), rand(5, 3), rand(5, 4)), ["q", "k", "v"]),
        ("linear attention, causal",
         lambda q, k, v: linear_attention_forward(q, k, v, causal=True),
         linear_attention_backward, (rand(2, 4, 3), rand(2, 4, 3), rand(2, 4, 2)), ["q", "k", "v"]),
        ("rotary position embedding", lambda x: rope_forward(x, layout="interleaved"), rope_backward,
         (rand(2, 5, 4),), ["x"]),
        ("RoPE, rotate-half (Llama)", lambda x: rope_forward(x, layout="half"), rope_backward,
         (rand(2, 5, 4),), ["x"]),
        ("layer norm", layer_norm_forward, layer_norm_backward,
         (rand(2, 3, 5), 1 + 0.1 * rand(5), 0.1 * rand(5)), ["x", "gamma", "beta"]),
        ("RMSNorm", rms_norm_forward, rms_norm_backward, (rand(2, 3, 5), 1 + 0.1 * rand(5)), ["x", "weight"]),
        ("SwiGLU", swiglu_forward, swiglu_backward, (rand(2, 3, 4), rand(4, 6) / 2, rand(4, 6) / 2, rand(6, 4) / 2),
         ["x", "W_gate", "W_up", "W_down"]),
        ("feed-forward, GELU",
         lambda x, p: feed_forward_forward(x, p, activation="gelu"), feed_forward_backward,
         (rand(2, 3, 4), {"W_1": rand(4, 6) / 2, "b_1": 0.1 * rand(6), "W_2": rand(6, 4) / 2,
                          "b_2": 0.1 * rand(4)}), ["x", "params"]),
        ("encoder block, post-norm",
         lambda x, p: encoder_block_forward(x, p, 2, causal_mask(3)), encoder_block_backward,
         (rand(2, 3, 4), jitter(init_encoder_block_params(4, 2, 8, seed=seed))), ["x", "params"]),
        ("decoder block, pre-norm",
         lambda x, m, p: decoder_block_forward(x, m, p, 2, norm_first=True), decoder_block_backward,
         (rand(2, 3, 4), rand(2, 5, 4), jitter(init_decoder_block_params(4, 2, 8, seed=seed))),
         ["x", "memory", "params"]),
        ("GPT-2 block", lambda x, p: gpt2_block_forward(x, p, 2), gpt2_block_backward,
         (rand(2, 3, 4), jitter(init_gpt2_block_params(4, 2, seed=seed))), ["x", "params"]),
        ("Llama block (2 of 4 kv)", lambda x, p: llama_block_forward(x, p, 4, num_kv_heads=2), llama_block_backward,
         (rand(2, 3, 8), {k: 3 * v for k, v in jitter(init_llama_block_params(8, 4, 12, num_kv_heads=2,
                                                                             seed=seed)).items()}), ["x", "params"]),
    ]


def gradcheck_section() -> tuple[str, bool]:
    """The gradient-check table and whether every operation passed."""
    head = f"{'operation':<28}{'inputs':>7}{'max abs err':>13}{'max rel err':>13}  status"
    lines = ["Every backward against central finite differences in float64",
             f"(pass: abs err <= {TOLERANCE['atol']:g} + {TOLERANCE['rtol']:g} * max|grad| for each input).",
             "", head, "-" * len(head)]
    all_ok = True
    failures = []
    for name, f, b, inputs, names in gradcheck_cases():
        report = gradcheck(f, b, *inputs, names=names, **TOLERANCE)
        abs_err = max(r.max_abs_err for r in report.rows)
        rels = [r.rel_err for r in report.rows if not np.isnan(r.rel_err)]
        rel = f"{max(rels):.1e}" if rels else "-"
        lines.append(f"{name:<28}{len(report.rows):>7}{abs_err:>13.1e}{rel:>13}  "
                     f"{'ok' if report.ok else 'FAIL'}")
        if not report.ok:
            all_ok = False
            failures.append(f"{name}:")
            for row in report.rows:
                if not row.ok:
                    failures.append(f"  {row.name} {row.shape}: " + (row.message or (
                        f"max abs err {row.max_abs_err:.1e} at {row.worst_index},"
                        f" max|grad| {row.scale:.3g}")))
            failures += [f"  {e}" for e in report.errors]
    lines.append("")
    lines.append("all gradients agree" if all_ok else "GRADIENT CHECK FAILED")
    lines += failures
    return "\n".join(lines), all_ok


SECTIONS = ("example", "summary", "claims", "gradcheck")
DEFAULT = ("example", "summary", "gradcheck")  # the full claims are one flag away


def main(argv=None, save_figures=None) -> int:
    """The command line; ``save_figures(directory)`` writes the figures for ``--plots`` and
    returns their paths (``python -m attention_ref`` passes :func:`attention_ref.plot.save_all`;
    this layer never imports the plot layer above it)."""
    parser = argparse.ArgumentParser(
        prog="python -m attention_ref",
        description="Walk through the documents' two-head example, the claims table and the"
                    " gradient checks.",
        epilog="Exercises: python -m attention_ref exercise list | start NAME [PATH] | hint NAME [N] |"
               " check PATH (see python -m attention_ref exercise --help). The lessons as a website:"
               " python -m attention_ref book [OUT]. Your own port against the reference: python -m"
               " attention_ref compare FOLDER FILE.py:FUNCTION (see its --help).")
    parser.add_argument("--section", choices=SECTIONS + ("all",), default=None,
                        help="print one section only, or all four: the example, the claims one line each,"
                             " the claims with their notes (claims) and the gradient checks (default: all"
                             " but the claims with their notes)")
    parser.add_argument("--plots", metavar="DIR", help="also write the figures (PNG) into DIR")
    args = parser.parse_args(argv)
    if args.plots:  # the folder made (or refused, by name) before any work
        try:
            Path(args.plots).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            print(f"{parser.prog}: error: --plots {args.plots}: {e.strerror or e}", file=sys.stderr)
            return 2
    ok = True
    chosen = {None: DEFAULT, "all": SECTIONS}.get(args.section, (args.section,))
    for i, section in enumerate(chosen):
        title = {"example": "THE TWO-HEAD EXAMPLE", "summary": "THE CLAIMS, ONE LINE EACH",
                 "claims": "THE CLAIMS TABLE", "gradcheck": "GRADIENT CHECKS"}[section]
        title = f"{i + 1}. {title}"
        if i:
            print()
        print("=" * WIDTH)
        print(title)
        print("=" * WIDTH)
        if section == "example":
            print(example_section())
        elif section == "claims":
            print(claims_section())
        elif section == "summary":
            print(summary_section())
        else:
            text, ok = gradcheck_section()
            print(text)
    if args.plots:
        if save_figures is None:
            parser.error("--plots needs the figures: run python -m attention_ref --plots DIR")
        for path in save_figures(args.plots):
            print(f"wrote {path}")
    if args.section is None:
        print()
        print(NEXT_STEPS)
    return 0 if ok else 1
