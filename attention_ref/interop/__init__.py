"""Real models' weights in this package's parameter dicts, pure NumPy (no torch needed).

``mappings``: where each tensor of ``torch.nn.MultiheadAttention``, GPT-2, BERT and Llama goes,
as tables (``docs/model_mappings.md`` is rendered from them); ``converters``: the functions
that apply them to a state dict, an ``.npz`` or a ``.safetensors`` file.
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

__all__ = ["from_bert_layer", "from_gpt2_attention", "from_gpt2_block", "from_llama_attention", "from_llama_block",
           "from_torch_multihead_attention", "load_state", "MAPPINGS", "render_markdown"]
