"""The catalogue of porting mistakes: one entry per id, shared by every level of ``compare``.

Each :class:`Mistake` says what users saw (``symptom``), the wrong formula, the right one, and
where users met it (threads from ``docs/compare.md``'s sources). ``operations`` lists the
operations of :func:`attention_ref.compare.operation` that try a mistaken variant for it (empty
for a mistake that lives in a layer or a whole model: those are documented here for the module
and model levels). The ids are a contract: tests and users match on them.
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["Mistake", "MISTAKES", "OPERATION_MISTAKES"]


class Mistake(NamedTuple):
    """One real porting mistake: its id, the operations that try it, and what it looks like."""

    id: str
    operations: tuple  # the operation names whose mistaken variants reproduce it; () = layer or model level
    step: str  # the step of the computation it changes
    symptom: str
    wrong: str
    right: str
    threads: tuple


_R, _S, _C = "rope", "scaled_dot_product_attention", "causal_mask"

MISTAKES = {m.id: m for m in (
    Mistake("rope_layout", (_R,), "pairs",
            "exact at position 0, the error grows with the position; gibberish after conversion",
            "pairs (x_{2i}, x_{2i+1}) (GPT-J, Meta's complex form) where the weights expect (x_i, x_{i+D/2}), or "
            "the reverse; a q/k permutation missing or applied twice when converting",
            "the layout the checkpoint was trained with: transformers' Llama, GPT-NeoX, Gemma, Phi-3 pair "
            "(x_i, x_{i+D/2}) (rotate_half)",
            ("huggingface/transformers#25199", "Dao-AILab/flash-attention#288", "jzhang38/TinyLlama#24",
             "rasbt/LLMs-from-scratch#746", "huggingface/transformers#39687")),
    Mistake("rope_theta", (_R,), "frequencies",
            "short prompts fine, incoherent after about 1000 tokens (Llama 3 with base 10000)",
            "theta_i = 10000^(-2i/D) when the config says rope_theta = 5e5 or 1e6",
            "theta_i = rope_theta^(-2i/D) with the config's rope_theta",
            ("lyogavin/airllm#368", "marin-community/levanter#649", "ggml-org/llama.cpp#3090",
             "LostRuins/koboldcpp#426")),
    Mistake("rope_scaling_ignored", (_R,), "frequencies",
            "cosine to the right output 1.000 at position 0, 0.959 at 1000, 0.503 at 60000",
            "the unscaled frequencies base^(-2i/D) when the config has rope_scaling (linear, llama3)",
            "the frequencies of the config's rope_scaling (llama3: slow pairs divided by factor, smooth between)",
            ("unslothai/unsloth#6197", "Blaizzy/mlx-vlm#1710", "sbryngelson/ANEForge#58",
             "HabanaAI/vllm-fork#356")),
    Mistake("rope_position_offset", (_R,), "positions",
            "the longest row of a batch is right, shorter (left-padded) ones are garbage; wrong after a cache",
            "positions 0..T-1 (or off by one, or the first row's) instead of each token's own position id",
            "each token rotated by its own position id (per batch row, counting from the first real token)",
            ("unslothai/unsloth#3699", "ndif-team/nnsight#672", "huggingface/transformers#18478",
             "huggingface/transformers#20761")),
    Mistake("partial_rotary", (_R,), "frequencies",
            "agrees at position 0, drifts with distance; 112 of 128 dims wrong while cos/sin tests passed",
            "the frequencies or the pair partner computed over head_dim, or every feature rotated, when only "
            "rotary_dim = head_dim * partial_rotary_factor turn",
            "RoPE over the first rotary_dim features, theta_i = base^(-2i/rotary_dim), pairs within them; "
            "the other features passed through",
            ("pie-project/pie#603", "labscommunity/cascadia#69", "ml-explore/mlx-lm#1698",
             "huggingface/transformers#48652", "OpenNMT/OpenNMT-py#2548")),
    Mistake("gqa_head_order", (_S,), "grouped heads",
            "right with one key/value head or H = Hkv, wrong with grouped heads",
            "key/value heads tiled ([h0, h1, h0, h1], torch .repeat): query head h reads h % Hkv",
            "each key/value head repeated for its group ([h0, h0, h1, h1], repeat_interleave): query head h "
            "reads h // (H / Hkv)",
            ("onnx/onnx#7274", "apple/axlearn#842", "PrimeIntellect-ai/prime-rl#2681", "state-spaces/mamba#462")),
    Mistake("head_dim", (), "projections",
            "shape error (cos [7, 80] against [1, 32, 7, 128]) or wrong output for Mistral-Nemo, Gemma",
            "head_dim = hidden_size / num_heads when the config gives head_dim",
            "the config's head_dim (q_proj has num_heads * head_dim outputs)",
            ("huggingface/candle#2358", "InternLM/lmdeploy#2761", "aws-neuron/neuronx-distributed-inference#9",
             "eole-nlp/eole#78")),
    Mistake("attention_scale", (_S,), "scale",
            "fluent and silent: scores 1.146x too large, perplexity 11.92 -> 11.985, worse at long context",
            "1/sqrt(d_model), 1/D, no scale, or 1/sqrt(head_dim) where Gemma says query_pre_attn_scalar",
            "the scale the model uses: 1/sqrt(head_dim) unless the config says otherwise (Gemma 2's "
            "query_pre_attn_scalar^-1/2)",
            ("huggingface/transformers#31891", "ggml-org/llama.cpp#8444", "ggml-org/llama.cpp#13951",
             "keras-team/keras-hub#1701", "Lightning-AI/litgpt#1545")),
    Mistake("softcap_missing", (_S,), "soft-capping",
            "unexpected results with a kernel that has no soft-capping (Gemma 2)",
            "softmax(q k^T * scale)",
            "softmax(cap * tanh(q k^T * scale / cap)) with the config's attn_logit_softcapping (50 for Gemma 2)",
            ("Dao-AILab/flash-attention#1016", "vllm-project/vllm#7022", "ggml-org/llama.cpp#8197")),
    Mistake("mask_inverted", (_S, _C), "mask",
            "future tokens leak into earlier outputs; left padding breaks",
            "True read as 'ignore' (nn.MultiheadAttention's key_padding_mask / attn_mask) where it means "
            "'may attend', or the reverse",
            "a boolean mask with True = may attend (torch's scaled_dot_product_attention, this package)",
            ("huggingface/transformers#38094", "pytorch/pytorch#170400", "rasbt/LLMs-from-scratch#1061",
             "openvinotoolkit/openvino#32046")),
    Mistake("causal_off_by_one", (_C,), "causal",
            "a token sees itself not at all, or the next one too; with a cache (Tq < Tk) queries see too little",
            "j < p (no self), j <= p + 1, or query i at position i when the queries are the last Tq of Tk keys",
            "query i at position p = i + Tk - Tq sees keys j <= p",
            ("rasbt/LLMs-from-scratch#1061", "huggingface/transformers#38094")),
    Mistake("window_off_by_one", (_C,), "window",
            "eager attention sees 2048 keys where FlashAttention sees 2049; a rotating cache keeps W or W + 1",
            "W + 1 keys (p - W <= j <= p, FlashAttention's window_size=(W, 0)) or W - 1",
            "W keys: p - W < j <= p (transformers' sliding_window)",
            ("huggingface/transformers#29623", "huggingface/transformers#39408", "vllm-project/vllm#3385",
             "ml-explore/mlx-lm#390", "elixir-nx/bumblebee#341")),
    Mistake("window_wrong_layers", (), "layers",
            "logits differ after 4096 tokens (DeepSeek-R1-Distill-Qwen); full history attended",
            "the sliding window on every layer, on none, or on the wrong ones (use_sliding_window, "
            "max_window_layers, Gemma's alternation)",
            "the window on exactly the layers the config names",
            ("huggingface/transformers#38002", "huggingface/transformers#35896", "unslothai/unsloth#8253",
             "InternLM/lmdeploy#3614")),
    Mistake("padding_ignored", (_S,), "mask",
            "batched shorter sequences produce garbage while the longest is fine",
            "the attention (padding) mask not applied: every key attended",
            "padded keys masked out (and, for a left-padded batch, positions counted from the first real token)",
            ("unslothai/unsloth#3699", "ndif-team/nnsight#672", "huggingface/transformers#48161")),
    Mistake("masked_row_nan", (_S,), "softmax",
            "NaNs from attention with padding",
            "softmax over a row with no allowed key: exp(-inf - (-inf)) = NaN",
            "a finite value for a query with no allowed key (zeros here and in torch's SDPA; the mean of the "
            "values in transformers' eager path); such rows are judged only for NaN and infinity",
            ("pytorch/pytorch#103963", "pytorch/pytorch#103749")),
    Mistake("softmax_axis", ("softmax", _S), "softmax",
            "every row wrong; the weights of each key (column) sum to one instead of each query's",
            "softmax along the queries (dim=-2, or dim=0 of a 2-D array)",
            "softmax along the last axis (the keys)",
            ("no thread in the review: a classic of from-scratch courses (softmax(dim=0) on (T, T) scores)",)),
    Mistake("softmax_overflow", ("softmax", _S), "max subtraction",
            "NaN (inf / inf) on large scores; fine on small ones",
            "exp(x) / sum(exp(x))",
            "exp(x - max x) / sum(exp(x - max x)) (the same value, no overflow)",
            ("huggingface/transformers#17437", "pytorch/pytorch#123911")),
    Mistake("rms_norm_eps", ("rms_norm", "layer_norm"), "eps",
            "random words at top_k=1; a residual of 1e-5 that looked like float32 noise",
            "a fixed eps (1e-5, 1e-6, 0) instead of the config's, or eps added outside the square root",
            "x / sqrt(mean(x^2) + eps) (layer norm: (x - mean) / sqrt(var + eps)) with the config's eps",
            ("meta-llama/llama#771", "huggingface/candle#271", "Lightning-AI/lit-llama#322", "apache/tvm#15856",
             "huggingface/transformers#48762")),
    Mistake("norm_offset", ("rms_norm",), "weight",
            "garbage, or a probability difference of about 1 (TransformerLens: 'missing Gemma +1')",
            "x_hat * w for Gemma's stored weights, or (1 + w) applied twice (a converter already folded it)",
            "Gemma: x_hat * (1 + w); Llama: x_hat * w",
            ("utensils/mold#1074", "Blaizzy/mlx-vlm#2041", "huggingface/transformers#40796")),
    Mistake("qk_norm_placement", (), "qk-norm",
            "small differences that matter only with learned per-dimension weights",
            "the query/key norm after RoPE, or over the whole projection instead of per head (or the reverse)",
            "the model's own placement: Qwen3, Gemma 3 per head before RoPE; OLMo 2 over the whole projection",
            ("allenai/OLMo#806", "karpathy/nanochat#743", "marin-community/marin#5114")),
    Mistake("post_norm_missing", (), "post-norms",
            "module outputs differ from the residual contribution; Gemma 2/3 sandwich norms missing",
            "only the pre-norms (Llama's post_attention_layernorm read as a post-norm, or Gemma's ignored)",
            "Gemma 2/3: a norm after each sub-layer before the residual, besides the pre-norms",
            ("ndif-team/nnterp#53", "tenstorrent/tt-metal#22808", "TransformerLensOrg/TransformerLens#650")),
    Mistake("embedding_scale", (), "embedding",
            "loss mismatch against the reference (Gemma)",
            "the embeddings unscaled, or scaled by sqrt(d) rounded in bf16 (55.5 instead of 55.4256)",
            "Gemma: embeddings times sqrt(hidden_size) in the model's dtype",
            ("huggingface/transformers#29402", "huggingface/transformers#37109", "google/gemma_pytorch#67")),
    Mistake("tied_head", (), "lm_head",
            "gibberish (lm_head left at its random initialisation)",
            "a separate, untrained lm_head when tie_word_embeddings is true (or tied when it is false)",
            "logits = h E^T with the embedding matrix when the config ties them",
            ("huggingface/transformers#43429", "huggingface/candle#2930", "huggingface/transformers#46456")),
    Mistake("conv1d_transpose", (), "projections",
            "size mismatch c_attn [2304, 768] vs [768, 2304]; with square weights, wrong silently",
            "GPT-2's Conv1D weights (in, out) used as torch Linear weights (out, in) without a transpose",
            "Conv1D weights transposed for Linear (or used as x @ W directly)",
            ("karpathy/nanoGPT#190", "huggingface/transformers#311", "AutoGPTQ/AutoGPTQ#139")),
    Mistake("gelu_variant", ("gelu",), "activation",
            "slightly wrong activations and logits (passes 1e-4 with one, fails 1e-2 with the other)",
            "the exact GELU where the model uses the tanh approximation (gelu_new, gelu_pytorch_tanh), the "
            "reverse, or x * sigmoid(1.702 x)",
            "the activation the config names: 'gelu' exact x Phi(x); 'gelu_new'/'gelu_pytorch_tanh' "
            "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))",
            ("huggingface/transformers#29402", "vllm-project/vllm#3411", "OpenNMT/CTranslate2#1658",
             "karpathy/nanoGPT#274")),
    Mistake("qkv_bias_missing", (), "projections",
            "mojibake, wrong-language tokens (Qwen2 without its q/k/v biases)",
            "q, k, v projections without bias when the checkpoint has them (or a loader that drops them)",
            "x W + b for the projections that have a bias (Qwen2: q, k and v)",
            ("sbryngelson/ANEForge#253", "EricLBuehler/candle-vllm#167", "OminiX-ai/OminiX-MLX#7")),
    Mistake("parallel_residual", (), "residual",
            "RedPajama-INCITE (use_parallel_residual false) treated as parallel; hooks missing",
            "x + attn(ln1(x)) + mlp(ln2(x)) where the model is sequential, or the reverse",
            "GPT-NeoX's use_parallel_residual as the config says",
            ("huggingface/transformers#18695", "TransformerLensOrg/TransformerLens#1644",
             "deepspeedai/DeepSpeed#2446")),
    Mistake("gate_up_swapped", ("swiglu",), "gate",
            "every output wrong (70000 times the tolerance in a course's test)",
            "silu(x W_up) * (x W_gate): the activation on the up projection (w1/w3 swapped)",
            "(silu(x W_gate) * (x W_up)) W_down",
            ("Stanford CS336 assignment 1: run_swiglu(w1, w2, w3) against this package's (gate, up, down)",)),
    Mistake("fused_qkv_split", (), "projections",
            "wrong output from the first layer; fused checkpoints (GPT-NeoX, Phi-3, Falcon) read in the wrong order",
            "a fused qkv weight split as [q | k | v] where it is interleaved per head (GPT-NeoX), or the reverse",
            "the checkpoint's own layout of the fused weight",
            ("no thread in the review: GPT-NeoX's query_key_value is per head [q_h | k_h | v_h]",)),
    Mistake("low_precision", (_R, _S, "softmax", "rms_norm", "layer_norm", "gelu", "swiglu"), "precision",
            "fp16 angle 1044.27 -> 1045 gives a cos error of 0.78; systematic small differences growing with depth",
            "a step (RoPE's inv_freq or angles, the softmax, the norm) computed in a lower precision than the "
            "rest",
            "the reference's precision: angles and norms in at least the input's precision",
            ("huggingface/transformers#29285", "EleutherAI/gpt-neox#1003", "vllm-project/vllm#863",
             "huggingface/transformers#17437", "huggingface/transformers#33133")),
)}

#: The ids whose mistaken variants are tried at the operation level
OPERATION_MISTAKES = tuple(k for k, m in MISTAKES.items() if m.operations)
