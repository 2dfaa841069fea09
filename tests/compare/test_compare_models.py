"""compare.model and `python -m attention_ref compare`: whole-model ports (tests/compare/_torch_ports.py,
loaded by their own loader from a write_random_model folder; and transformers' own LlamaForCausalLM)
match; each planted model-level mistake is located at the right layer and sub-layer and named;
names= maps other module names; the command's exit codes 0, 1 and 2."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attention_ref import compare
from attention_ref.interop import read_safetensors, write_random_model, write_safetensors

torch = pytest.importorskip("torch")
import _torch_ports as P  # noqa: E402  (needs torch)

ROOT = Path(__file__).resolve().parents[2]
EXTRA = {"gemma2": {"sliding_window": 4}}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """write_random_model's folders with weights of a trained model's size (std 0.3, not 0.02: at
    0.02 the scores are so small that a missing soft cap changes the output by less than 1e-12)."""
    out = {}
    for family in ("gpt2", "llama", "gemma2", "gpt_neox", "phi3"):
        folder = write_random_model(tmp_path_factory.mktemp(family), family, seed=1, **EXTRA.get(family, {}))
        state = read_safetensors(folder / "model.safetensors")
        write_safetensors({k: (v * 15 if v.ndim == 2 else v) for k, v in state.items()},
                          folder / "model.safetensors", metadata={"format": "pt"})
        out[family] = folder
    return out


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2", "gpt_neox", "phi3"])
def test_correct_whole_models_match(folders, family):
    verdict = compare.model(P.load(folders[family]), folders[family])
    assert verdict.ok, str(verdict)
    assert verdict.cases == 2 and verdict.error < 1e-12  # a plain batch and a left-padded one


# (family, planted mistake, id, where: the sub-layer of the first module that differs)
PLANTED = [
    ("llama", "rope_theta", "rope_theta", "model.layers.0.self_attn"),
    ("llama", "gqa_head_order", "gqa_head_order", "model.layers.0.self_attn"),
    ("llama", "norm_offset", "norm_offset", "model.layers.0.input_layernorm"),
    ("llama", "padding_ignored", "padding_ignored", "model.layers.0.self_attn"),
    ("llama", "tied_head", "tied_head", "lm_head"),
    ("gpt2", "tied_head", "tied_head", "lm_head"),
    ("gpt2", "gelu_variant", "gelu_variant", "transformer.h.0.mlp"),
    ("gpt2", "conv1d_transpose", "conv1d_transpose", "transformer.h.0.attn"),
    ("gemma2", "embedding_scale", "embedding_scale", "model.layers.0.input_layernorm"),
    ("gemma2", "post_norm_missing", "post_norm_missing", "model.layers.0.pre_feedforward_layernorm"),
    ("gemma2", "window_wrong_layers", "window_wrong_layers", "model.layers.1.self_attn"),
    ("gemma2", "softcap_missing", "softcap_missing", "model.layers.0.self_attn"),
    ("gemma2", "tied_head", "tied_head", "lm_head"),
    ("gemma2", "final_softcap_missing", "softcap_missing", "logits"),
    ("gpt_neox", "parallel_residual", "parallel_residual", "gpt_neox.layers.0.post_attention_layernorm"),
    ("gpt_neox", "fused_qkv_split", "fused_qkv_split", "gpt_neox.layers.0.attention"),
    ("gpt_neox", "tied_head", "tied_head", "lm_head"),
    ("phi3", "gate_up_swapped", "gate_up_swapped", "model.layers.0.mlp"),
    ("phi3", "rope_layout", "rope_layout", "model.layers.0.self_attn"),
]


@pytest.mark.parametrize("family, planted, named, where", PLANTED, ids=[f"{f}-{p}" for f, p, _, _ in PLANTED])
def test_planted_model_mistakes_are_located_and_named(folders, family, planted, named, where):
    verdict = compare.model(P.load(folders[family], {planted}), folders[family])
    assert not verdict.ok
    assert verdict.mistake == named, str(verdict)
    assert verdict.where == where, str(verdict)


def test_a_mistake_in_one_module_alone_is_named_there(folders):
    """The final norm alone with Llama's weight read as Gemma's 1 + w: located at model.norm, named by the
    variant restricted to it (the variant on every norm would change layer 0 first)."""
    model = P.load(folders["llama"])
    wrong = P.RMSNorm(model.s["D"], model.s["eps"], False, {"norm_offset"})
    wrong.weight = model.model.norm.weight
    model.model.norm = wrong
    verdict = compare.model(model, folders["llama"])
    assert verdict.mistake == "norm_offset" and verdict.where == "model.norm", str(verdict)


def test_padding_is_separated_and_padded_positions_left_out(folders):
    verdict = compare.model(P.load(folders["llama"], {"padding_ignored"}), folders["llama"])
    assert verdict.inputs == ("left padding",) and verdict.failed == 1


def test_other_names_are_mapped_or_the_logits_alone_compared(folders):
    folder = folders["llama"]

    class Renamed(torch.nn.Module):  # the same model under other names
        def __init__(self, inner):
            super().__init__()
            self.core = inner.model
            self.head = inner.lm_head

        def forward(self, ids, attention_mask=None):
            return self.head(self.core(ids, attention_mask))
    good, bad = Renamed(P.load(folder)), Renamed(P.load(folder, {"norm_offset"}))
    alone = compare.model(bad, folder)
    assert not alone.ok and alone.where == "logits" and "logits alone" in alone.detail
    assert compare.model(good, folder).ok
    mapped = compare.model(bad, folder, names={"core": "model", "head": "lm_head"})
    assert mapped.mistake == "norm_offset" and mapped.where == "model.layers.0.input_layernorm"


def test_transformers_own_model_matches(folders):
    """Another style: transformers' LlamaForCausalLM from the folder, in float64 through
    interop.llama_in_float64, sdpa attention (eager's softmax is float32)."""
    transformers = pytest.importorskip("transformers")
    from attention_ref.interop import llama_in_float64

    model = transformers.AutoModelForCausalLM.from_pretrained(folders["llama"], attn_implementation="sdpa")
    with llama_in_float64():
        verdict = compare.model(model, folders["llama"])
    assert verdict.ok, str(verdict)


def test_a_model_that_raises_is_a_verdict(folders):
    def broken(ids, attention_mask=None):
        raise RuntimeError("no cache")
    verdict = compare.model(broken, folders["llama"])
    assert verdict.where == "the call raised" and "no cache" in verdict.detail


def test_bad_arguments_are_refused_by_name(folders, tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        compare.model(P.load(folders["llama"]), tmp_path)
    with pytest.raises(TypeError, match="names"):
        compare.model(P.load(folders["llama"]), folders["llama"], names={"a": 1})


LOADERS = """
import sys
sys.path.insert(0, {tests!r})
import _torch_ports as P

def good(folder):
    return P.load(folder)

def wrong(folder):
    return P.load(folder, {{"rope_theta"}})

def broken(folder):
    raise ValueError("cannot read " + folder)

def forever(folder):
    while True:
        pass
"""


def test_the_command_line_exit_codes(folders, tmp_path, capsys, monkeypatch):
    """Two runs as a reader runs them (the subcommand's dispatch, no traceback of ours); the other
    exit codes through the command's main() in this process (as the command runs the user's code)."""
    from attention_ref.compare.command import main

    loaders = tmp_path / "my_port.py"
    loaders.write_text(LOADERS.format(tests=str(Path(__file__).resolve().parent)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "attention_ref", "compare", *map(str, args)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=240)
    ok = run(folders["llama"], f"{loaders}:good")
    assert ok.returncode == 0 and "matches the reference" in ok.stdout, ok.stderr
    broken = run(folders["llama"], f"{loaders}:broken", "--time-limit", "60")
    assert broken.returncode == 2 and "ValueError: cannot read" in broken.stderr
    assert "Traceback" not in broken.stderr and "my_port.py, line" in broken.stderr

    assert main([str(folders["llama"]), f"{loaders}:wrong"]) == 1
    assert "Mistake: rope_theta" in capsys.readouterr().out
    assert main([str(folders["llama"]), f"{loaders}:forever", "--time-limit", "0.5"]) == 2
    assert "time limit (0.5 s)" in capsys.readouterr().err
    assert main([str(tmp_path), f"{loaders}:good"]) == 2
    assert "no config.json" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)  # package.module:FUNCTION, imported from the current folder
    assert main([str(folders["llama"]), "my_port:nothing"]) == 2
    assert "has no 'nothing'" in capsys.readouterr().err
    assert main([str(folders["llama"]), "my_port"]) == 2
    assert "FILE.py:FUNCTION" in capsys.readouterr().err
