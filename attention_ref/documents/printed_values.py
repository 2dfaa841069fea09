"""The five source documents' printed values, with citations (data only, no computation).

Every number here is copied exactly as the documents print it, *including the wrong
ones*: :mod:`attention_ref.documents.claims` recomputes each one and says which hold. Nothing
in the project reads the documents themselves; they are cited by file name and section.

Reading conventions (the documents' own):

* vectors are printed as columns (``[...]^T``) but multiplied as rows (``x W``), so each
  vector here is a plain tuple and ``x @ W`` is the product the documents intend;
* matrices are tuples of rows, in the order they are typeset;
* ``W_1^Q`` etc. are ``(d_model, d_k)`` blocks, as declared in 004 section 4.2.
"""
from __future__ import annotations

__all__ = [
    "DOCUMENTS", "Citation",
    "SINGLE_TOKEN", "TWO_HEAD", "HULL", "PARAMS", "COST", "HEAD_DIM", "PRINTED_VERBAL",
    "CODE_AND_MISC", "NOT_COMPUTED", "MORE",
    "D000", "D001", "D002", "D003", "D004",
]

from typing import NamedTuple


class Citation(NamedTuple):
    """Where a value is printed: document file name and section heading."""

    document: str
    section: str

    def __str__(self) -> str:
        return f"{self.document[:3]} {self.section}"


#: File name -> English title of the five documents.
DOCUMENTS = {
    "000_7d159d832ba1b073.txt": "Multi-head self-attention: principles, design, implementation, complexity",
    "001_067d56cd77247a25.txt": "Self-attention and multi-head attention (lecture notes)",
    "002_546deef644bc7d75.txt": "Multi-head attention from first principles (variance, convex hull, parameters)",
    "003_d23c45164b76cecd.txt": "Self-attention: definition, multi-head, complexity and optimisations",
    "004_14594f7960591ad1.txt": "Transformer in practice: the multi-head attention layer (worked examples)",
}

D000, D001, D002, D003, D004 = sorted(DOCUMENTS)

# ---------------------------------------------------------------------------------------
# 004, section 4.1 (scaled dot-product attention): a single query, key and value.
# ---------------------------------------------------------------------------------------
SINGLE_TOKEN = {
    "cite": Citation(D004, "4.1 (scaled dot-product attention)"),
    "q": (0.1, 0.2, 0.3),
    "k": (0.4, 0.5, 0.6),
    "v": (1.0, 2.0, 3.0),
    "d_k": 3,  # the example divides by sqrt(3)
    "printed_score": 0.2598,
    "printed_alpha": 1.0,
    "printed_output": (1.0, 2.0, 3.0),
}

# ---------------------------------------------------------------------------------------
# 004, section 4.2 (multi-head attention): x in R^3, h = 2, d_k = d_v = 2, d_model = 3.
# The text declares W_i^Q, W_i^K in R^{d_model x d_k}, W_i^V in R^{d_model x d_v} and
# W^O in R^{h d_v x d_model} (4 x 3 here), but typesets W^O as a 3 x 4 matrix.
# ---------------------------------------------------------------------------------------
TWO_HEAD = {
    "cite": Citation(D004, "4.2 (multi-head attention)"),
    "x": (1.0, 2.0, 3.0),
    "h": 2,
    "d_k": 2,
    "d_v": 2,
    "d_model": 3,
    "W_Q": (((0.1, 0.2), (0.3, 0.4), (0.5, 0.6)),   # W_1^Q
            ((1.9, 2.0), (2.1, 2.2), (2.3, 2.4))),  # W_2^Q
    "W_K": (((0.7, 0.8), (0.9, 1.0), (1.1, 1.2)),
            ((2.5, 2.6), (2.7, 2.8), (2.9, 3.0))),
    "W_V": (((1.3, 1.4), (1.5, 1.6), (1.7, 1.8)),
            ((3.1, 3.2), (3.3, 3.4), (3.5, 3.6))),
    "printed_Q": ((2.3, 3.5), (13.7, 14.3)),    # Q_1, Q_2
    "printed_K": ((6.6, 7.8), (17.1, 17.7)),    # K_1, K_2
    "printed_V": ((10.9, 12.1), (20.5, 21.1)),  # V_1, V_2
    "printed_head": ((11.8, 13.2), (20.9, 21.5)),  # head_1, head_2
    "printed_concat": (11.8, 13.2, 20.9, 21.5),
    "W_O_as_printed": ((3.7, 3.8, 3.9, 4.0),    # 3 rows x 4 columns as typeset
                       (4.1, 4.2, 4.3, 4.4),
                       (4.5, 4.6, 4.7, 4.8)),
    "W_O_declared_shape": (4, 3),  # R^{h d_v x d_model}
    "printed_output": (197.5, 208.7, 220.0),
}

# ---------------------------------------------------------------------------------------
# 002, sections "the tyranny of a single perspective" and "committee of experts":
# the convex-hull thought experiment.
# ---------------------------------------------------------------------------------------
HULL = {
    "cite": Citation(D002, "the tyranny of a single perspective"),
    "cite_heads": Citation(D002, "a committee of experts: the power of many heads"),
    "keys": ((10.0, 0.0), (0.0, 10.0), (5.0, 5.0), (2.0, 2.0)),  # k_1 .. k_4
    "printed_min": (0.0, 0.0, 5.0, 2.0),   # min{k_1, k_2} of each key; k_3 wins with 5
    "printed_winner": 3,                   # "k_3 should win"
    "head_queries": ((1.0, 0.0), (0.0, 1.0)),  # q^(1) ~ (1, 0), q^(2) ~ (0, 1)
    "printed_token3_scores": (5.0, 5.0),   # token 3: 5 from head 1, 5 from head 2
    "printed_token1_scores": (10.0, 0.0),  # token 1: 10 from head 1, 0 from head 2
}

# ---------------------------------------------------------------------------------------
# Parameter counts. 002 "the subtle efficiency of the multi-head design": 4 d_model^2 for
# one head and for H heads with d_k = d_v = d_model / H. 001 section 3 (comparison
# table): multi-head has *more* parameters than single-head.
# ---------------------------------------------------------------------------------------
PARAMS = {
    "cite": Citation(D002, "the subtle efficiency of the multi-head design"),
    "printed_single": "4 d_model^2",
    "printed_multi_qkv": "3 d_model^2",
    "printed_multi": "4 d_model^2",
    "cite_001": Citation(D001, "3 (single-head vs multi-head table)"),
    "printed_001": "multi-head has more parameters (the projections add parameters)",
}

# ---------------------------------------------------------------------------------------
# Cost. 000 section 6.1: time and space O(N^2 D); 1,000 tokens -> 1 million pairs,
# 10,000 tokens -> 100 million pairs; local windows O(N W D). 001 section 4.1: O(n^2).
# 003 section 3.1: time O(n^2 d), space O(n^2); 3.2: sparse O(n sqrt n) or O(n log n),
# linearised phi(Q)(phi(K)^T V).
# ---------------------------------------------------------------------------------------
COST = {
    "cite_000": Citation(D000, "6.1 (complexity analysis)"),
    "printed_pairs": {1_000: 1_000_000, 10_000: 100_000_000},
    "printed_time_000": "O(N^2 D)",
    "printed_space_000": "O(N^2 D)",
    "cite_003": Citation(D003, "3.1 (complexity analysis)"),
    "printed_time_003": "O(n^2 d)",
    "printed_space_003": "O(n^2)",
    "cite_003_linear": Citation(D003, "3.2 (optimisation methods)"),
    "cite_001": Citation(D001, "4.1 (computational cost)"),
    "printed_001": "O(n^2)",
}

# ---------------------------------------------------------------------------------------
# Head width. 001 section 2.2: 8 heads, 512 -> 64 per head. 003 section 2.1: each head
# has width d_k / h (with d_k the projection width of section 1.1).
# ---------------------------------------------------------------------------------------
HEAD_DIM = {
    "cite_001": Citation(D001, "2 (multi-head attention), implementation steps"),
    "d_model": 512, "h": 8, "printed_head_dim": 64,
    "cite_003": Citation(D003, "2.1 (implementation steps)"),
    "printed_003": "d_k / h",
}

# ---------------------------------------------------------------------------------------
# Checkable statements without a printed number (paraphrased, never quoted).
# ---------------------------------------------------------------------------------------
PRINTED_VERBAL = {
    "variance": (Citation(D002, "the art of listening: why scaling matters"),
                 "Var(q.k) = d_k Var(q_l k_l); after dividing by sqrt(d_k) the variance is 1"),
    "saturation": (Citation(D002, "the art of listening: why scaling matters"),
                   "unscaled, large d_k saturates the softmax (one weight near 1) and the"
                   " gradients vanish; the scale keeps it responsive"),
    "strategies": (Citation(D000, "3.2 (two implementation strategies)"),
                   "separate single heads and the weight-split parallel form are two"
                   " implementations of the same layer"),
    "low_rank": (Citation(D000, "4.4 (low-rank property)"),
                 "after the softmax the attention matrix is clearly low-rank: the top few"
                 " singular values carry most of the information"),
    "sum_formula": (Citation(D001, "2 (multi-head attention), mathematical expression"),
                    "MultiHead = sum over heads of softmax(Q_i K_i^T / sqrt d_k) V_i W^O"),
    "mqa": (Citation(D002, "the subtle efficiency of the multi-head design"),
            "multi-query attention trades a little expressiveness for much less inference"
            " memory traffic"),
}

# ---------------------------------------------------------------------------------------
# Sections of the remaining checked statements (the statements are paraphrased in claims).
# ---------------------------------------------------------------------------------------
CODE_AND_MISC = {
    "cite_004_code": Citation(D004, "5 (code example)"),
    "cite_000_heads": Citation(D000, "2.2 (the mathematics of multi-head attention)"),
    "cite_000_window": Citation(D000, "6.2 (optimisation techniques)"),
    "cite_000_spec": Citation(D000, "4.2 (specialisation and interpretability of heads)"),
    "cite_000_causal": Citation(D000, "5.2 (masked attention in the decoder)"),
    "cite_001_scale": Citation(D001, "1 (self-attention), computation steps"),
    "cite_001_order": Citation(D001, "4.2 (position information)"),
    "cite_003_sparse": Citation(D003, "3.2 (optimisation methods)"),
}

# ---------------------------------------------------------------------------------------
# Further checked statements (paraphrased in attention_ref.documents.claims.paths_and_variants).
# ---------------------------------------------------------------------------------------
MORE = {
    "cite_000_direct": Citation(D000, "1 (introduction: every position reaches every other directly)"),
    "cite_000_strategies": Citation(D000, "3.2 (two implementation strategies)"),
    "cite_000_opt": Citation(D000, "6.2 (optimisation techniques)"),
    "cite_001_rope": Citation(D001, "4.2 (position information)"),
    "cite_002_softmax": Citation(D002, "attention as a conversation: query, key and value"),
    "cite_002_moe": Citation(D002, "a committee of experts: the power of many heads"),
    "cite_002_eff": Citation(D002, "the subtle efficiency of the multi-head design"),
    "cite_003_block": Citation(D003, "3.2 (optimisation methods)"),
    "cite_003_ckpt": Citation(D003, "3.3 (practical advice)"),
    "cite_004_addnorm": Citation(D004, "3 (algorithm steps), step 4"),
    #: where the 1/sqrt(d_k) scale is motivated (besides 002)
    "cite_scale": (Citation(D000, "1 (introduction)"), Citation(D001, "1 (self-attention), computation steps"),
                   Citation(D003, "1.1 (mathematical definition)"), Citation(D004, "4.1 (scaled dot-product attention)")),
    #: listings whose head width is d_model // num_heads (besides 004)
    "cite_divisible": (Citation(D000, "3.1 (PyTorch implementation)"), Citation(D003, "2.2 (code example)")),
}

#: Statements checked by reading only (no computation can check them), paraphrased.
NOT_COMPUTED = (
    (Citation(D000, "3.1 (PyTorch implementation)"),
     "the listing calls math.sqrt but imports only torch and torch.nn, so its forward raises"
     " NameError; its forward takes no mask, so it cannot do the causal attention of section 5.2"),
    (Citation(D004, "5 (code example)"),
     "a comment announces a residual connection and layer normalisation, but the code only applies"
     " the output projection"),
    (Citation(D003, "2.2 (code example)"),
     "the code listing lost its line breaks (one long line) and cannot run as printed"),
    (Citation(D000, "4.1-4.3 (insights)"),
     "most heads keep nearly all content information; three head types (positional, syntactic,"
     " rare-word); pruning over 60% of encoder-decoder heads hurts most: empirical findings about"
     " trained models"),
    (Citation(D000, "5.3, 6.2, 7.1"),
     "the GPT lineage, the growth of context lengths and a 2025 medical-imaging result: history"
     " and literature, not computation"),
    (Citation(D001, "1 (self-attention), example"),
     "in 'The animal didn't cross the street because it was too tired', 'it' attends to 'animal':"
     " depends on a trained model"),
    (Citation(D001, "2 (multi-head attention), advantages"),
     "different heads specialise in different relations, and many heads make the model more robust"
     " (less reliance on one attention pattern, less overfitting): empirical claims about training"),
    (Citation(D001, "4.1 (computational cost)"),
     "local windows as in Longformer, chunked computation as in Reformer: attributions to published"
     " models (Reformer is better known for hashing-based attention), literature not computation"),
    (Citation(D004, "1 (background)"),
     "the Transformer was proposed in 2017 for machine translation: history"),
    (Citation(D004, "2.3 (Transformer architecture)"),
     "the Transformer is the first model built entirely on attention: history"),
)
