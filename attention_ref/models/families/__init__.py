"""The registry of model families: one module per family, each exporting its ``FAMILY``
(:class:`attention_ref.models.family.Family`).

A family is added by writing its module (its reader, parameter table, block steps and hooks)
and its name in :data:`FAMILY_NAMES`; everything that lists families is derived from them:
``LMConfig``'s accepted ``model_type`` s (:data:`attention_ref.models.config.FAMILIES`), the
parameter names and shapes (:mod:`attention_ref.models.params`), the whole model's steps
(:mod:`attention_ref.models.lm`, :mod:`attention_ref.models.generate`), transformers' names
(:data:`attention_ref.interop.mappings.MAPPINGS`, ``docs/model_mappings.md``), the loader's
field checks (:mod:`attention_ref.interop.model_folder`) and the float32 steps the transformers
tests patch (:mod:`attention_ref.interop.float64`).
"""
import importlib

from ..config import register_families

#: the family modules of this folder (each named by its transformers ``model_type``), in order
FAMILY_NAMES = ("gpt2", "llama", "qwen2", "qwen3", "mistral", "gpt_neox", "phi3", "gemma2", "gemma3_text",
                "olmo2",
                "smollm3",
                "bloom", "gpt_oss", "qwen3_moe", "qwen3_next", "deepseek_v3")
FAMILY_MODULES = tuple(importlib.import_module(f"{__name__}.{name}") for name in FAMILY_NAMES)
#: model_type -> Family
FAMILY = {module.FAMILY.model_type: module.FAMILY for module in FAMILY_MODULES}
#: the model_types, in order
FAMILIES = register_families(FAMILY.values())

__all__ = ["FAMILY_NAMES", "FAMILY_MODULES", "FAMILY", "FAMILIES"]
