"""The module and model levels name ``low_precision`` under the operation level's rule (STYLE item
28): only when the reference run in the port's own precision reproduces the port's error in size
(within compare.PRECISION_FACTOR = 10) on every case. A port that computes in float32 with no
mistake is named low_precision; one with a real mistake is named by that mistake (the mistaken
variant run in float32 too: the port within 10 times that run's own error of it), never precision;
a float64 port with a real mistake is never called precision either."""
import types

import pytest

from attention_ref import compare
from attention_ref.interop import random_model_config, write_random_model

torch = pytest.importorskip("torch")
import _torch_ports as P  # noqa: E402  (needs torch)

try:  # imported, transformers' float32 steps are patched while compare runs a port: a port's own stay float32
    import transformers  # noqa: F401
except ImportError:
    pass


def in_float32(module):
    """The port as a user who computes in float32 writes it: its forward casts itself and its
    floating inputs to float32 (compare hands it a float64 copy), and returns float32."""
    forward = type(module).forward

    def forward32(self, *args):
        self.float()
        return forward(self, *(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args))
    module.forward = types.MethodType(forward32, module)
    return module


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("llama"), "llama", seed=1)


def test_a_float32_model_with_no_mistake_is_low_precision(llama):
    verdict = compare.model(in_float32(P.load(llama)), llama)
    assert not verdict.ok and verdict.mistake == "low_precision", str(verdict)
    assert "float32" in verdict.detail and 1e-9 < verdict.error < 1e-3


@pytest.mark.parametrize("planted, where", [("rope_theta", "model.layers.0.self_attn"),
                                            ("norm_offset", "model.layers.0.input_layernorm")])
def test_a_float32_model_with_a_mistake_is_named_by_it(llama, planted, where):
    verdict = compare.model(in_float32(P.load(llama, {planted})), llama)
    assert verdict.mistake == planted and verdict.where == where, str(verdict)


def test_a_float64_model_with_a_mistake_is_not_precision(llama):
    verdict = compare.model(P.load(llama, {"rope_theta"}), llama)
    assert verdict.mistake == "rope_theta", str(verdict)


@pytest.mark.parametrize("kind", ["attention", "decoder_layer"])
def test_a_float32_module_with_no_mistake_is_low_precision(kind):
    cfg = random_model_config("llama")
    verdict = compare.module(in_float32(P.Attention(cfg, 0) if kind == "attention" else P.DecoderLayer(cfg, 0)),
                             cfg, kind)
    assert not verdict.ok and verdict.mistake == "low_precision", str(verdict)


@pytest.mark.parametrize("kind, planted", [("attention", "gqa_head_order"), ("attention", "rope_layout"),
                                           ("decoder_layer", "rms_norm_eps")])
def test_a_float32_module_with_a_mistake_is_named_by_it(kind, planted):
    cfg = random_model_config("llama")
    cls = P.Attention if kind == "attention" else P.DecoderLayer
    verdict = compare.module(in_float32(cls(cfg, 0, mistakes={planted})), cfg, kind)
    assert verdict.mistake == planted, str(verdict)
