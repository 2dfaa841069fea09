"""Real models' weights in this package's parameter dicts, pure NumPy (no torch needed).

``mappings``: where each tensor of ``torch.nn.MultiheadAttention``, GPT-2, BERT and Llama goes,
as tables (``docs/model_mappings.md`` is rendered from them); ``converters``: the functions
that apply them to a state dict, an ``.npz`` or a ``.safetensors`` file; ``pretrained``: whole
models of every family (:data:`attention_ref.FAMILIES`) from a ``save_pretrained`` directory (:func:`load_pretrained`) and our
params or gradients under transformers' names (:func:`to_transformers`); ``model_folder``: a
``save_pretrained`` folder read as hostile input (config.json's fields checked, shards only inside
the folder, each tensor's shape against the config); ``safetensors``: the file format in plain
NumPy, every offset of its header checked; ``random_model``: a small model folder of any family with
random weights (:func:`write_random_model`), for examples and tests; ``sampling``: :func:`torch_draw`,
``generate``'s draw as transformers' sampled ``generate`` makes it (needs torch).
"""
from .converters import (
    from_bert_layer,
    from_gpt2_attention,
    from_gpt2_block,
    from_llama_attention,
    from_llama_block,
    from_torch_multihead_attention,
    load_state,
)
from .mappings import MAPPINGS, render_markdown
from .float64 import (deepseek_v3_in_float64, gemma2_in_float64, gemma3_in_float64, gpt_oss_in_float64,
                      llama_in_float64, moe_models_in_float64, qwen3_next_in_float64)
from .pretrained import from_transformers_state, load_pretrained, read_state_dir, to_transformers
from .random_model import random_model_config, write_random_model
from .sampling import torch_draw
from .safetensors import read_safetensors, write_safetensors

__all__ = ["from_bert_layer", "from_gpt2_attention", "from_gpt2_block", "from_llama_attention", "from_llama_block",
           "from_torch_multihead_attention", "load_state", "MAPPINGS", "render_markdown",
           "from_transformers_state", "load_pretrained", "read_state_dir", "to_transformers", "read_safetensors",
           "write_safetensors", "llama_in_float64", "gemma3_in_float64", "gemma2_in_float64", "qwen3_next_in_float64",
           "moe_models_in_float64", "gpt_oss_in_float64", "deepseek_v3_in_float64",
           "write_random_model",
           "random_model_config", "torch_draw"]
