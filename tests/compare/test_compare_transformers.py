"""transformers' own models through compare: their float32 steps (RMSNorm, RoPE angles) run in
float64 while compare runs them (levels.transformers_in_float64), so transformers' LlamaForCausalLM
matches at the float64 tolerance through `python -m attention_ref compare` whether or not the
loader wraps the loading in interop.llama_in_float64() (a patch a loader enters and leaves before
returning the model no longer applies when the model runs: that was the 1.5e-7 difference)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attention_ref import compare
from attention_ref.interop import write_random_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]

LOADERS = """
import transformers
from attention_ref.interop import llama_in_float64


def wrapped(folder):
    with llama_in_float64():  # left before the model runs
        return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa")


def plain(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa")
"""


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("llama"), "llama", seed=3)


def test_the_command_on_transformers_own_llama_matches(llama, tmp_path, capsys):
    """As a reader runs it (a subprocess), with the loader that wrapped the loading in
    llama_in_float64() (exit 1 before); the plain loader through the command's main()."""
    from attention_ref.compare.command import main

    loaders = tmp_path / "hf_loader.py"
    loaders.write_text(LOADERS)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "attention_ref", "compare", str(llama), f"{loaders}:wrapped"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0 and "matches the reference" in run.stdout, (run.stdout, run.stderr)
    assert main([str(llama), f"{loaders}:plain"]) == 0
    assert "matches the reference" in capsys.readouterr().out


def test_transformers_float32_steps_are_what_differed(llama, monkeypatch):
    """The difference the command showed is transformers' float32 RMSNorm and RoPE: with the patches
    off (compare's own hook replaced by a no-op) the same model differs by about 1e-7 at layer 0's
    input norm, named low_precision (the reference run in float32 differs by as much there and at the
    logits), and with them on it matches at 1e-10 (and the patches are gone afterwards)."""
    import contextlib

    from attention_ref.compare import levels

    model = transformers.AutoModelForCausalLM.from_pretrained(llama, attn_implementation="sdpa")
    on = compare.model(model, llama)
    assert on.ok and on.error < 1e-12, str(on)
    with monkeypatch.context() as patch:
        patch.setattr(levels, "transformers_in_float64", contextlib.nullcontext)
        off = compare.model(model, llama)
    assert not off.ok and off.where == "model.layers.0.input_layernorm" and 1e-9 < off.error < 1e-5, str(off)
    # a float64 model with float32 steps: the reference run in float32 reproduces the error's size
    assert off.mistake == "low_precision" and "float32" in off.detail, str(off)
    # eager attention without the patches: a left-padded row's fully masked queries give NaN (float32's
    # softmax of float64's minimum), which reach the real positions: not precision, located only
    eager = transformers.AutoModelForCausalLM.from_pretrained(llama, attn_implementation="eager")
    with monkeypatch.context() as patch:
        patch.setattr(levels, "transformers_in_float64", contextlib.nullcontext)
        nan = compare.model(eager, llama)
    assert not nan.ok and nan.mistake is None, str(nan)
    from transformers.models.llama import modeling_llama
    assert modeling_llama.LlamaRMSNorm.forward.__module__ == "transformers.models.llama.modeling_llama"


def test_transformers_own_decoder_layer_without_the_patches_is_low_precision(monkeypatch):
    """The module level's float64 fallback: transformers' LlamaDecoderLayer (behind the wrapper of
    docs/compare.md) with compare's patches off computes its RMSNorm and RoPE angles in float32: its
    error is the size of the reference run in float32 on every case (low_precision); with them on it
    matches."""
    import contextlib

    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    from attention_ref.compare import levels
    from attention_ref.interop import random_model_config

    class Layer(LlamaDecoderLayer):
        def __init__(self, config):
            super().__init__(config, layer_idx=0)
            self.rotary = LlamaRotaryEmbedding(config)

        def forward(self, x, positions, attention_mask=None):
            T = x.shape[1]
            allowed = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
            if attention_mask is not None:
                allowed = allowed & attention_mask[:, None, None, :].bool()
            mask = torch.zeros(allowed.shape, dtype=x.dtype).masked_fill(~allowed, torch.finfo(x.dtype).min)
            out = super().forward(x, position_embeddings=self.rotary(x, positions), attention_mask=mask)
            return out[0] if isinstance(out, tuple) else out

    config = LlamaConfig(**random_model_config("llama"))
    config._attn_implementation = "sdpa"
    assert compare.module(Layer(config), config, "decoder_layer").ok
    with monkeypatch.context() as patch:
        patch.setattr(levels, "transformers_in_float64", contextlib.nullcontext)
        off = compare.module(Layer(config), config, "decoder_layer")
    assert not off.ok and off.mistake == "low_precision" and "float32" in off.detail, str(off)
