"""Rows of the claims table: direct paths, the cost of separate heads, blockwise and linear
attention, RoPE, the softmax's weights, convex combinations, head width, Add & Norm.

One function per claim, named after the row's id (``000-direct-path`` is
:func:`claim_000_direct_path`): it computes what the row states and returns its Claim. The
group's tuple lists them in table order. See :mod:`attention_ref.documents.claims` for the
verdicts and the rendering.
"""
from __future__ import annotations

from .. import experiments as ex
from .. import printed_values as docs
from .claim import Claim, _readings, _verdict, fmt, rows_of, tiny

__all__ = ["paths_and_variants_claims", "more_claims", "PATHS_AND_VARIANTS_CLAIMS"]


def claim_000_direct_path() -> Claim:
    """000: the first output of one self-attention depends on the last token (its gradient)."""
    path = ex.direct_path()
    return Claim("000-direct-path", "any two positions are connected directly, whatever their distance",
                 str(docs.MORE["cite_000_direct"]), "path length 1",
                 f"one self-attention (q = k = v = x, N=16): sum |d out_0 / d x_15| = {fmt(path, 3)}",
                 _verdict(path > 1e-6),
                 "The output at the first position depends on the token at the last through a single"
                 " layer (nonzero gradient from scaled_dot_product_attention_backward).")


def claim_000_strategy_speed() -> Claim:
    """000: multiply-adds and matrix products of separate heads against the split parallel form."""
    t = ex.strategies_work()
    return Claim(
        "000-strategy-speed", "separate single-head modules are less efficient than the split"
        " parallel form", str(docs.MORE["cite_000_strategies"]), "less efficient",
        f"same multiply-adds ({t['madds_separate']:,} each; B={t['batch']}, N={t['n']},"
        f" D={t['d_model']}, H={t['h']}) in {t['products_separate']} matrix products"
        f" instead of {t['products_parallel']}",
        _readings({"more arithmetic": t["madds_separate"] > t["madds_parallel"],
                   "more, smaller products (call overhead, poorer BLAS use)":
                   t["products_separate"] > t["products_parallel"]}),
        "Not more arithmetic: the same products, split h ways. What costs is issuing 5h + 1"
        " small products instead of 6 large ones; the measured wall-time ratio is machine"
        " dependent (benchmarks/bench_mha.py).")


def _blockwise_is_exact(b: dict) -> bool:
    """Whether blockwise attention equals exact attention without holding an N x N array."""
    return b["flash_error"] < 1e-12 and b["flash_largest"] < b["n"] * b["n"]


def claim_000_blockwise() -> Claim:
    """000: blockwise (flash) attention against exact attention, and the largest array it holds."""
    b = ex.blockwise_and_linear()
    return Claim("000-blockwise", "memory-efficient blockwise attention", str(docs.MORE["cite_000_opt"]),
                 "(no number)", f"flash_attention_forward, N={b['n']}, blocks of {b['block']}: max |difference|"
                 f" from exact attention {tiny(b['flash_error'])}; largest array held {b['flash_largest']:,}"
                 f" numbers (N x N = {b['n'] * b['n']:,})", _verdict(_blockwise_is_exact(b)))


def claim_000_linear() -> Claim:
    """000: linear attention is cheaper than, and different from, softmax attention."""
    b, lin = ex.blockwise_and_linear(), ex.linear_attention_check()
    return Claim(
        "000-linear", "linear attention via the kernel trick", str(docs.MORE["cite_000_opt"]),
        "(no number)", f"linear_attention_forward (phi = elu + 1) vs softmax attention, N={b['n']}:"
        f" max |difference| {fmt(b['linear_difference'], 2)}",
        _readings({"cheaper (n d^2 instead of n^2 d work)": lin["madds_right"] < lin["madds_left"],
                   "the same attention, computed faster": b["linear_difference"] < 1e-6}),
        "Linear attention is a different model (a positive feature map instead of exp), not an"
        " exact rewriting of softmax attention; blockwise attention, by contrast, is exact.")


def claim_001_rope() -> Claim:
    """001: without positions attention is permutation-equivariant; with RoPE scores depend on m - n."""
    perm, rope = ex.permutation_equivariance(), ex.rope_relative()
    return Claim(
        "001-rope", "rotary position embeddings remedy the order-insensitivity", str(docs.MORE["cite_001_rope"]),
        "(no number)", f"without positions max |A(P X) - P A(X)| {tiny(perm)}; with rope_forward the"
        f" score of a fixed q at m and k at n depends on m - n only (deviation {tiny(rope['toeplitz_error'])},"
        f" spread {fmt(rope['spread'], 3)}) and permuting changes the output by"
        f" {fmt(rope['permuted_difference'], 3)}",
        _verdict(perm < 1e-12 and rope["toeplitz_error"] < 1e-12 and rope["spread"] > 0.1
                 and rope["permuted_difference"] > 1e-3))


def _weights_are_convex(cc: dict) -> bool:
    """Whether every attention weight is non-negative and every row sums to 1."""
    return cc["min_weight"] >= 0 and cc["sum_error"] < 1e-12


def claim_002_softmax_sum() -> Claim:
    """002: the softmax weights are non-negative and sum to 1."""
    cc = ex.convex_combination()
    return Claim("002-softmax-sum", "the softmax weights sum to 100%", str(docs.MORE["cite_002_softmax"]), "100%",
                 f"min weight {fmt(cc['min_weight'], 4)}, max |row sum - 1| {tiny(cc['sum_error'])}",
                 _verdict(_weights_are_convex(cc)))


def claim_002_convex() -> Claim:
    """002: each output lies inside the values' bounding box."""
    cc = ex.convex_combination()
    return Claim("002-convex", "each head's output is a weighted mixture (convex combination) of the values",
                 str(docs.MORE["cite_002_moe"]), "(no number)",
                 f"weights >= 0, rows sum to 1; outputs inside the values' bounding box (largest excess"
                 f" {fmt(cc['outside_box'], 3)}, negative = inside)",
                 _verdict(_weights_are_convex(cc) and cc["outside_box"] <= 0))


def claim_002_width() -> Claim:
    """002: h heads of width d_model/h: the weights, the concatenation's width and the attention's work."""
    w = ex.head_width_efficiency()
    return Claim(
        "002-width", "h heads of width d_model/h: Q, K, V weights 3 d_model^2, concatenation"
        " d_model wide, computation not h times larger", str(docs.MORE["cite_002_eff"]),
        docs.PARAMS["printed_multi_qkv"],
        f"d_model=64, h=8, N=32: Q, K, V weights {w['qkv']:,} (3 d^2 = {3 * 64 * 64:,}); concatenation"
        f" {w['concat_width']} wide; attention multiply-adds {w['madds_split']:,} (one full-width head:"
        f" {w['madds_one_head']:,}; 8 full-width heads: {w['madds_full']:,})",
        _verdict(w["qkv"] == 3 * 64 * 64 and docs.PARAMS["printed_multi_qkv"] == "3 d_model^2"
                 and w["concat_width"] == 64 and w["madds_split"] == w["madds_one_head"]
                 and w["madds_full"] == 8 * w["madds_split"]))


def claim_003_blockwise() -> Claim:
    """003: block-by-block attention is exact (the computation of 000-blockwise)."""
    return Claim("003-blockwise", "compute attention block by block, within and between blocks",
                 str(docs.MORE["cite_003_block"]), "(no number)", "as 000-blockwise",
                 _verdict(_blockwise_is_exact(ex.blockwise_and_linear())))


def claim_003_checkpointing() -> Claim:
    """003: flash attention's backward recomputes P: a smaller cache, the same gradients."""
    b = ex.blockwise_and_linear()
    return Claim(
        "003-checkpointing", "gradient checkpointing saves memory", str(docs.MORE["cite_003_ckpt"]),
        "(no number)", f"flash attention's backward recomputes P instead of storing it: cache"
        f" {b['flash_cache_bytes']:,} bytes vs {b['exact_cache_bytes']:,} for exact attention"
        f" (N={b['n']}); gradients agree (max |difference| {tiny(b['flash_grad_error'])})",
        _verdict(b["flash_cache_bytes"] < b["exact_cache_bytes"] and b["flash_grad_error"] < 1e-12),
        "Recomputing the probabilities in the backward is checkpointing applied to P; whole-layer"
        " checkpointing is not implemented here.")


def claim_004_add_norm() -> Claim:
    """004: LN(x + MHA(x)) has rows of mean 0 and variance 1 (gamma = 1, beta = 0)."""
    an = ex.add_norm_statistics()
    return Claim("004-add-norm", "after multi-head attention: residual connection and layer normalisation",
                 str(docs.MORE["cite_004_addnorm"]), "LN(x + MHA(x))",
                 f"add_norm_forward with gamma = 1, beta = 0: max |row mean| {tiny(an['max_abs_mean'])},"
                 f" max |row variance - 1| {an['max_var_error']:.1e} (the eps of the norm)",
                 _verdict(an["max_abs_mean"] < 1e-12 and an["max_var_error"] < 1e-3))


#: The claim functions of :func:`paths_and_variants_claims`, in table order.
PATHS_AND_VARIANTS_CLAIMS = (claim_000_direct_path, claim_000_strategy_speed, claim_000_blockwise, claim_000_linear,
                             claim_001_rope, claim_002_softmax_sum, claim_002_convex, claim_002_width,
                             claim_003_blockwise, claim_003_checkpointing, claim_004_add_norm)


def paths_and_variants_claims() -> list[Claim]:
    """000 sections 1, 3.2, 6.2; 001 section 4.2; 002 on weights, experts and width;
    003 sections 3.2-3.3; 004 section 3 step 4."""
    return rows_of(PATHS_AND_VARIANTS_CLAIMS)


more_claims = paths_and_variants_claims  # its 0.1 name (attention_ref.claims_more; CHANGELOG.md says where it went)
