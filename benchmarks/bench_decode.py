"""Decoding speed of the whole models: attention_ref's ``generate`` against transformers'.

Run from the repository root::

    python benchmarks/bench_decode.py              # every model, 5 rounds, prints a markdown table
    python benchmarks/bench_decode.py --quick      # tiny models, 1 round: checks that it runs
    python benchmarks/bench_decode.py --rounds 3 --out table.md   # also writes the table to a file
    python benchmarks/bench_decode.py --model Pythia --model Gemma  # the rows whose name holds a word

What is timed: GPT-2 small (124M), a SmolLM-135M-shaped Llama (30 layers, 9 query heads, 3
key/value heads), a Pythia-160M-shaped GPT-NeoX (12 layers, 12 heads, rotary_pct 0.25, untied
head), a 134M Phi-3-shaped model (Phi-3-mini's vocabulary, fused projections and 2047-token
window, 768 wide, 12 layers), a Gemma-3-270M-shaped Gemma 3 (18 layers, every sixth global, the
others sliding over 512 keys; 4 query heads of 256, 1 key/value head; vocabulary 262144), a small
Gemma-2-shaped model of the same sizes (not a released Gemma 2: layers alternating sliding and
global, scores and logits soft-capped at 50 and 30, vocabulary 256000), and the Llama-like families
at SmolLM-135M's sizes with their own piece switched on (Llama 3.2's ``llama3`` RoPE scaling,
Qwen2's q/k/v biases, Qwen3's q/k norms, Mistral's window, OLMo 2's norms, SmolLM3's layers without
RoPE; not released models), all with random
weights built from their configs
(:func:`attention_ref.init_lm_params`, seed 0, float32), a 16-token prompt, 32 greedy tokens
(``generate(ids, params, config, 32)`` against transformers' ``model.generate(ids,
max_new_tokens=32, do_sample=False)`` on the same weights).

What is reported, per row:

* the **prefill** apart: the time of ``generate`` asked for 1 new token (the prompt's forward,
  whose last logits give the first token), in milliseconds;
* the **decode steps** apart: tokens per second of the 31 steps after it, from the same process's
  call for 32 tokens minus its call for 1 (``31 / (t_32 - t_1)``);
* the **weights read per token**: the bytes of every weight a decode step reads once (an embedding
  table looked up reads one row; a tied table is read whole as the head; every expert counted, so
  a mixture-of-experts row overstates what one step reads);
* the **bandwidth bound**: a single-thread read bandwidth measured in the same run (a float32
  matrix-vector product ``x @ W`` over a matrix far larger than the caches, in its own one-thread
  process: what a decode step's products do) over the bytes per token, and the fraction of it each
  library reaches.

Each of ``--rounds`` rounds runs three fresh processes back to back: the bandwidth, ours and
transformers' (the two libraries' order swapped every round), one thread each
(``OMP_NUM_THREADS=1`` and friends set before NumPy or torch is imported, and
``torch.set_num_threads(1)``). The ratio ours / transformers is taken pair by pair, within a round,
and each round's fraction of the bound against that round's bandwidth; the table gives the median of
each over the rounds, and the range of the ratios (on a shared machine a neighbour's load slows
every absolute figure, but the two processes of a pair much alike). The load average at the start
and the end of the run is written beside the table. Both workers print their tokens, and the
script refuses to report a table whose tokens differ. transformers is timed only when it is
installed; it is never a dependency. Nothing is written unless ``--out`` is given (through a
temporary file in the same folder, renamed into place).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT, NEW_TOKENS = 16, 32
BANDWIDTH_MEGABYTES = 512  # the matrix the read bandwidth is measured on: far beyond any cache
ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                               "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")}

_GEMMA3_LAYERS = ["sliding_attention"] * 5 + ["full_attention"]  # Gemma 3's pattern: every sixth layer global
#: SmolLM-135M's sizes (a Llama), shared by the rows of the Llama-like families
_SMOL = {"vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
         "num_key_value_heads": 3, "intermediate_size": 1536, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "tie_word_embeddings": True, "hidden_act": "silu"}
#: transformers' config.json of each model (random weights: only the shapes matter).
MODELS = {
    "GPT-2 small": {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
                    "n_positions": 1024, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"},
    "SmolLM-135M-shaped Llama": {
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": True, "hidden_act": "silu"},
    # the Llama-like families at SmolLM-135M's sizes, each with its own piece switched on
    "Llama-3.2-style (llama3 RoPE scaling) at SmolLM-135M sizes": {
        **_SMOL, "model_type": "llama", "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}},
    "Qwen2-style (q/k/v biases) at SmolLM-135M sizes": {**_SMOL, "model_type": "qwen2"},
    "Qwen3-style (q/k norms, 64-wide heads) at SmolLM-135M sizes": {**_SMOL, "model_type": "qwen3", "head_dim": 64},
    "Mistral-style (window 4096) at SmolLM-135M sizes": {**_SMOL, "model_type": "mistral", "sliding_window": 4096},
    "OLMo-2-style (norms after attention and MLP, q/k norms) at SmolLM-135M sizes": {**_SMOL, "model_type": "olmo2"},
    "SmolLM3-style (no RoPE on every fourth layer) at SmolLM-135M sizes": {**_SMOL, "model_type": "smollm3",
                                                                            "pad_token_id": 0},  # in the vocabulary
    "Pythia-160M-shaped GPT-NeoX": {
        "model_type": "gpt_neox", "vocab_size": 50304, "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "intermediate_size": 3072, "rotary_pct": 0.25, "rotary_emb_base": 10000,
        "max_position_embeddings": 2048, "layer_norm_eps": 1e-5, "use_parallel_residual": True,
        "tie_word_embeddings": False, "hidden_act": "gelu"},
    # Phi-3-mini's vocabulary, layout and 4k window at 768 wide and 12 layers: 134.2M parameters
    "Phi-3-shaped 134M (12 layers, 768 wide)": {
        "model_type": "phi3", "vocab_size": 32064, "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "num_key_value_heads": 12, "intermediate_size": 2048,
        "max_position_embeddings": 4096, "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False, "hidden_act": "silu",
        "pad_token_id": 32000},
    "Gemma-3-270M-shaped": {
        "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640, "num_hidden_layers": 18,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 2048,
        "sliding_window": 512, "query_pre_attn_scalar": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "layer_types": _GEMMA3_LAYERS * 3,
        "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh"},
    "small Gemma-2-shaped (Gemma 3 270M's sizes)": {
        "model_type": "gemma2", "vocab_size": 256000, "hidden_size": 640, "num_hidden_layers": 18,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 2048,
        "sliding_window": 512, "query_pre_attn_scalar": 256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
        "layer_types": ["sliding_attention", "full_attention"] * 9, "tie_word_embeddings": True,
        "hidden_activation": "gelu_pytorch_tanh"},
    # bloom-560m's vocabulary and layout at 640 wide and 12 layers (10 heads: ALiBi's rule for a head count that
    # is not a power of two): 219.6M parameters, 160.6M of them the tied embedding table
    "small BLOOM-shaped (ALiBi, 10 heads)": {
        "model_type": "bloom", "vocab_size": 250880, "hidden_size": 640, "n_layer": 12, "n_head": 10,
        "layer_norm_epsilon": 1e-5, "apply_residual_connection_post_layernorm": False, "tie_word_embeddings": True},
    # gpt-oss's pieces (a sink per head, a 128-token window on every other layer, YaRN as gpt-oss-20b's, biases;
    # 32 experts, each token takes 4, as gpt-oss-20b) at SmolLM-135M's attention widths, 12 layers, experts 192 wide
    "gpt-oss-style (sinks, window 128, YaRN, 32 experts top 4) at SmolLM-135M widths, 12 layers": {
        "model_type": "gpt_oss", "vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 12,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 192,
        "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 6, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "rope_theta": 150000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4096},
        "tie_word_embeddings": False, "attention_bias": True},
    # Qwen3-MoE's pieces (q/k norms, 64-wide heads, the first layer dense by mlp_only_layers, softmax routing with the
    # top 8 normalised, as Qwen3-30B-A3B's) at SmolLM-135M's attention widths, 12 layers, 32 experts 192 wide
    "Qwen3-MoE-style (q/k norms, layer 0 dense, 32 experts top 8) at SmolLM-135M widths, 12 layers": {
        "model_type": "qwen3_moe", "vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 12,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536,
        "moe_intermediate_size": 192, "num_experts": 32, "num_experts_per_tok": 8, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [0], "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "use_sliding_window": False, "tie_word_embeddings": False, "hidden_act": "silu"},
    # Qwen3-Next's pieces (three Gated DeltaNet layers to one gated-attention layer, RoPE on a quarter of each head,
    # 32 experts of which each token takes 4, renormalised, and a gated shared expert) at SmolLM-135M's width,
    # 12 layers, experts 192 wide: a linear layer's decoding state is constant in the context (no KV cache)
    "Qwen3-Next-style (3 DeltaNet : 1 gated attention, 32 experts top 4 + shared) at SmolLM-135M width, 12 layers": {
        "model_type": "qwen3_next", "vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 12,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128, "partial_rotary_factor": 0.25,
        "full_attention_interval": 4, "linear_num_key_heads": 4, "linear_num_value_heads": 8,
        "linear_key_head_dim": 64, "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "intermediate_size": 1536,
        "num_experts": 32, "num_experts_per_tok": 4, "moe_intermediate_size": 192, "shared_expert_intermediate_size": 192,
        "norm_topk_prob": True, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": False},
    # DeepSeek-V3's pieces (MLA with a query compression and a latent cache, RoPE on 32 of each head's 96 key features,
    # layer 0 dense, 32 experts in 8 groups of which 4 are kept, top 8 and a shared expert, YaRN with mscale and
    # mscale_all_dim 1 as DeepSeek-V3's) at SmolLM-135M's width, 9 heads, 12 layers, experts 192 wide
    "DeepSeek-V3-style (MLA latent cache, layer 0 dense, 32 experts in 8 groups top 8) at SmolLM-135M width, 12 layers": {
        "model_type": "deepseek_v3", "vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 12,
        "num_attention_heads": 9, "num_key_value_heads": 9, "q_lora_rank": 192, "kv_lora_rank": 128,
        "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "intermediate_size": 1536,
        "moe_intermediate_size": 192, "n_routed_experts": 32, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
        "n_shared_experts": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
        "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
        "tie_word_embeddings": False, "hidden_act": "silu"},
}
QUICK = {
    "tiny GPT-2": {"model_type": "gpt2", "vocab_size": 300, "n_embd": 32, "n_layer": 2, "n_head": 4,
                   "n_positions": 64, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"},
    "tiny Llama": {"model_type": "llama", "vocab_size": 300, "hidden_size": 36, "num_hidden_layers": 2,
                   "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 64,
                   "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                   "tie_word_embeddings": True, "hidden_act": "silu"},
    "tiny GPT-NeoX": {"model_type": "gpt_neox", "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "intermediate_size": 64, "rotary_pct": 0.25,
                      "rotary_emb_base": 10000, "max_position_embeddings": 128, "layer_norm_eps": 1e-5,
                      "use_parallel_residual": True, "tie_word_embeddings": False, "hidden_act": "gelu"},
    "tiny Phi-3": {"model_type": "phi3", "vocab_size": 300, "hidden_size": 36, "num_hidden_layers": 2,
                   "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 64,
                   "max_position_embeddings": 128, "original_max_position_embeddings": 128, "rms_norm_eps": 1e-5,
                   "rope_theta": 10000.0, "sliding_window": 20, "tie_word_embeddings": False, "hidden_act": "silu",
                   "pad_token_id": 0},
    "tiny Gemma 3": {"model_type": "gemma3_text", "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 6,
                     "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 64,
                     "sliding_window": 8, "query_pre_attn_scalar": 16, "max_position_embeddings": 128,
                     "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                     "layer_types": _GEMMA3_LAYERS, "tie_word_embeddings": True,
                     "hidden_activation": "gelu_pytorch_tanh"},
    "tiny Gemma 2": {"model_type": "gemma2", "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 4,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64,
                     "sliding_window": 8, "query_pre_attn_scalar": 16, "max_position_embeddings": 128,
                     "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "attn_logit_softcapping": 50.0,
                     "final_logit_softcapping": 30.0, "layer_types": ["sliding_attention", "full_attention"] * 2,
                     "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh"},
}


def _model(config_dict):
    """Our config and random float32 params, and the 16-token prompt (1, 16)."""
    import numpy as np

    import attention_ref as ar

    config = ar.LMConfig.from_dict(config_dict)
    params = ar.init_lm_params(config, seed=0, dtype=np.float32)
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (1, PROMPT))
    return config, params, ids


def weight_bytes_per_token(params, config) -> int:
    """Bytes of the weights one decode step reads: every array once, except an embedding table
    outside the layers (a name without a layer number) that is looked up, of which one row is read,
    and a mixture's expert arrays (in a layer, one slice per expert: a first axis of
    ``config.num_experts``), of which the ``experts_per_token`` chosen experts' slices are read; the
    token table of a tied head is read whole (the logits)."""
    total = 0
    for name, w in params.items():
        in_layer = any(part.isdigit() for part in name.split("."))
        lookup = not in_layer and w.ndim == 2 and not name.startswith("lm_head")
        experts = in_layer and config.num_experts and w.ndim >= 2 and w.shape[0] == config.num_experts
        if lookup and not (config.tie_word_embeddings and w.shape[0] == config.vocab_size):
            total += w.nbytes // w.shape[0]  # one row per token
        elif experts:
            total += w.nbytes // w.shape[0] * config.experts_per_token  # the chosen experts' slices
        else:
            total += w.nbytes
    return total


def bandwidth_worker(megabytes: int) -> dict:
    """Bytes per second a one-thread float32 ``x @ W`` reads, ``W`` of ``megabytes``: the best of 7."""
    import numpy as np

    cols = 4096
    W = np.ones((megabytes * 2 ** 20 // (4 * cols), cols), dtype=np.float32)  # written once: its pages exist
    x = np.ones(W.shape[0], dtype=np.float32)
    best = float("inf")
    for _ in range(8):  # the first is a warm-up
        start = time.perf_counter()
        x @ W
        best = min(best, time.perf_counter() - start)
    return {"bytes_per_s": W.nbytes / best, "megabytes": W.nbytes / 2 ** 20}


def worker(library: str, config_dict: dict) -> dict:
    """Timed ``generate`` calls (after one warm-up call) in this process: the prefill (1 new token,
    best of 3), the whole call for 32 tokens, the tokens, and the weights' bytes read per token."""
    config, params, ids = _model(config_dict)
    if library == "attention_ref":
        import attention_ref as ar

        def run(new_tokens=NEW_TOKENS):
            return ar.generate(ids, params, config, new_tokens)[0, PROMPT:]
    else:
        import torch
        import transformers

        from attention_ref.interop import to_transformers

        torch.set_num_threads(1)
        family = config_dict["model_type"]
        hf_config = transformers.AutoConfig.for_model(**config_dict)
        model = transformers.AutoModelForCausalLM.from_config(hf_config).eval().float()  # the family's class
        state = {k: torch.from_numpy(v) for k, v in to_transformers(params, config).items()}  # state_dict()'s names
        model.load_state_dict(state, strict=True)
        prompt = torch.from_numpy(ids)

        def run(new_tokens=NEW_TOKENS):
            with torch.inference_mode():
                out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                     attention_mask=torch.ones_like(prompt), pad_token_id=0)
            return out[0, PROMPT:].numpy()
    run()  # warm-up: first-call costs (imports, allocations) are not decoding
    prefill = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        run(1)
        prefill = min(prefill, time.perf_counter() - start)
    start = time.perf_counter()
    tokens = run()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "prefill": prefill, "tokens": [int(t) for t in tokens],
            "weight_bytes": weight_bytes_per_token(params, config)}


def _spawn(library: str, config_dict: dict) -> dict:
    """:func:`worker` (or, for ``library="bandwidth"``, :func:`bandwidth_worker`) in a fresh Python
    process with one thread."""
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, __file__, "--worker", library, json.dumps(config_dict)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"the {library} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _has_transformers() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None


def _median(values):
    """The middle value (the mean of the two middle ones for an even count)."""
    values = sorted(values)
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def measure(models: dict, rounds: int, bandwidth_megabytes: int = BANDWIDTH_MEGABYTES) -> list:
    """For each model, ``rounds`` rounds of three fresh processes run back to back: the read
    bandwidth, ours and transformers' (the order of the two libraries swapped every round, so a
    drift of the machine's speed does not favour one). Each round gives its own ratio and its own
    fractions of the bound (its decode rate over its bandwidth's bound); the row keeps the median of
    each over the rounds and the range of the ratios, the spread the load caused."""
    libraries = ["attention_ref"] + (["transformers"] if _has_transformers() else [])
    rows = []
    for name, config_dict in models.items():
        decode, prefill, tokens, bandwidth = {lib: [] for lib in libraries}, {lib: [] for lib in libraries}, {}, []
        for r in range(rounds):
            print(f"{name}: round {r + 1} of {rounds}", file=sys.stderr, flush=True)  # progress
            bandwidth.append(_spawn("bandwidth", {"megabytes": bandwidth_megabytes})["bytes_per_s"])
            for library in (libraries if r % 2 == 0 else libraries[::-1]):
                result = _spawn(library, config_dict)
                decode[library].append(max(result["seconds"] - result["prefill"], 1e-9))  # the 31 steps after the first
                prefill[library].append(result["prefill"])
                tokens.setdefault(library, result["tokens"])
                if result["tokens"] != tokens[library]:
                    raise RuntimeError(f"{name}: {library} gave different tokens in two rounds")
        if len({tuple(t) for t in tokens.values()}) != 1:
            raise RuntimeError(f"{name}: the libraries' tokens differ: {tokens}")
        weight_bytes = result["weight_bytes"]
        rates = {lib: [(NEW_TOKENS - 1) / s for s in decode[lib]] for lib in libraries}  # tokens/s per round
        row = {"model": name, "tokens_per_s": {lib: _median(rates[lib]) for lib in libraries},
               "prefill_s": {lib: _median(prefill[lib]) for lib in libraries}, "weight_bytes": weight_bytes,
               "bytes_per_s": _median(bandwidth), "tokens": tokens["attention_ref"],
               "of_bound": {lib: _median([rate * weight_bytes / bw for rate, bw in zip(rates[lib], bandwidth)])
                            for lib in libraries}}
        if "transformers" in rates:
            ratios = [ours / theirs for ours, theirs in zip(rates["attention_ref"], rates["transformers"])]
            row["ratio"] = (_median(ratios), min(ratios), max(ratios))  # ours / transformers, pair by pair
        rows.append(row)
    return rows


def _megabytes(n: int) -> str:
    """``n`` bytes in MB: one decimal from 1 MB up, three below (the --quick models)."""
    return f"{n / 1e6:.1f}" if n >= 1e6 else f"{n / 1e6:.3f}"


def _load_average():
    """The machine's load average over the last minute (None where the system does not give it)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _load_note(before, after) -> str:
    """The load average at the start and the end of the run, as a sentence ("" where unknown)."""
    if before is None or after is None:
        return ""
    return f" Load average (1 minute) {before:.1f} at the start of the run, {after:.1f} at its end."


def render(rows: list, rounds: int, megabytes: int, command: str, load: str = "") -> str:
    """The markdown table, with the date, the machine, the bandwidth, the command and ``load`` (what
    the machine was doing, as the caller knows it)."""
    import numpy as np

    versions = f"NumPy {np.__version__}"
    if _has_transformers():
        import torch
        import transformers
        versions += f", torch {torch.__version__}, transformers {transformers.__version__}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gbs = _median([row["bytes_per_s"] for row in rows]) / 1e9
    lines = [f"Measured {datetime.date.today().isoformat()} on {cpu}, one thread, {versions}, float32, a"
             f" {PROMPT}-token prompt and {NEW_TOKENS} greedy tokens (the same tokens out of both), medians of"
             f" {rounds} rounds of fresh processes (each round: the read bandwidth, then both libraries back to back,"
             f" their order swapped every round): `{command}`.{load} Prefill: `generate` for 1 token; decode: the"
             f" {NEW_TOKENS - 1} steps after it. Read bandwidth in the same run: {gbs:.1f} GB/s (median of the rounds;"
             f" one thread, float32 `x @ W` over {megabytes} MB); bound = bandwidth / weights read per token,"
             " each round's rate over its own round's bound. The ratio is ours / transformers pair by pair (its"
             " median, then the range over the rounds: the spread the machine's load caused); a loaded machine slows"
             " every absolute figure, the paired ratios much less.", "",
             "| model | weights MB/token | bound tokens/s | prefill ms (ours, transformers) | decode tokens/s ours"
             " | decode tokens/s transformers | ratio | ratio range | ours % of bound | transformers % of bound |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        ours, theirs = row["tokens_per_s"]["attention_ref"], row["tokens_per_s"].get("transformers")
        bound = row["bytes_per_s"] / row["weight_bytes"]
        pre = row["prefill_s"]
        pre_text = f"{1e3 * pre['attention_ref']:.1f}, " + ("-" if "transformers" not in pre
                                                             else f"{1e3 * pre['transformers']:.1f}")
        ratio, low, high = row.get("ratio", (None, None, None))
        ours_share = f"{100 * row['of_bound']['attention_ref']:.0f}"
        theirs_share = "-" if theirs is None else f"{100 * row['of_bound']['transformers']:.0f}"
        lines.append(f"| {row['model']} | {_megabytes(row['weight_bytes'])} | {bound:.1f} | {pre_text} | {ours:.1f} |"
                     f" {'-' if theirs is None else f'{theirs:.1f}'} | {'-' if ratio is None else f'{ratio:.2f}'} |"
                     f" {'-' if ratio is None else f'{low:.2f}-{high:.2f}'} | {ours_share} | {theirs_share} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny models, 1 round: checks that it runs")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of fresh processes (bandwidth, then both libraries); medians kept")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    parser.add_argument("--model", action="append", default=[], metavar="WORD",
                        help="only the rows whose name contains WORD (repeatable; default: every row)")
    parser.add_argument("--worker", nargs=2, metavar=("LIBRARY", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        library, config = args.worker[0], json.loads(args.worker[1])
        print(json.dumps(bandwidth_worker(**config) if library == "bandwidth" else worker(library, config)))
        return 0
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    rounds = 1 if args.quick else args.rounds
    models = QUICK if args.quick else MODELS
    if args.model:
        models = {name: d for name, d in models.items() if any(word in name for word in args.model)}
        if not models:
            parser.error(f"--model {args.model}: no row's name contains these words; the rows: {list(MODELS)}")
    load_before = _load_average()
    megabytes = 32 if args.quick else BANDWIDTH_MEGABYTES
    rows = measure(models, rounds, megabytes)
    table = render(rows, rounds, megabytes, "python benchmarks/bench_decode.py" + (" --quick" if args.quick else "")
                   + ("" if args.quick or rounds == 5 else f" --rounds {rounds}")
                   + "".join(f" --model {word!r}" for word in args.model), _load_note(load_before, _load_average()))
    print(table, end="")
    if args.out:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))  # run as a script from a clone that is not installed
        from attention_ref._atomic import write_atomic  # the package's one atomic writer

        write_atomic(args.out, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
