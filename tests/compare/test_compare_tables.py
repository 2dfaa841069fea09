"""compare reads what a family computes from the family's own file (its Tensor rows' ``how``, its
Features), never from its name: no family name is written in attention_ref/compare/, the fused
q/k/v layout it tries the other way round is the one the family's split uses, and a BLOOM port
with the per-head split read as [q | k | v] is named (BLOOM has GPT-NeoX's layout under another
name)."""
import ast
from pathlib import Path

import numpy as np
import pytest

from attention_ref import compare
from attention_ref.compare.layers import _layout, config_of, embedding_scale, offset_norms, qkv_layouts, stored_in_out
from attention_ref.interop import write_random_model
from attention_ref.models.families import FAMILY, FAMILY_NAMES
from attention_ref.models.params import block_params, init_lm_params
from attention_ref.nn.fused_qkv import QKV_LAYOUTS, FusedQKVCache

ROOT = Path(__file__).resolve().parents[2]
COMPARE = ROOT / "attention_ref" / "compare"


def _docstrings(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                yield first.value


def _family_names_in(folder):
    """String constants of ``folder``'s modules (docstrings aside) that are a family's model_type, or
    the start of one ("gemma" for gemma2 and gemma3_text): branches on a name."""
    found = []
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = {id(d) for d in _docstrings(tree)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                s = node.value
                if s in FAMILY_NAMES or (len(s) >= 4 and s.isidentifier()
                                         and any(n.startswith(s) and n != s for n in FAMILY_NAMES)):
                    found.append(f"{path.name}:{node.lineno}: {s!r}")
    return found


def test_compare_writes_no_family_name():
    """compare reads the family's table and Features, never its name."""
    found = _family_names_in(COMPARE)
    assert not found, "family names in attention_ref/compare/: " + "; ".join(found)


def test_the_check_finds_a_planted_family_name(tmp_path):
    """The check above can fail: a copy of compare/layers.py with branches on names planted is caught."""
    source = (COMPARE / "layers.py").read_text(encoding="utf-8")
    (tmp_path / "layers.py").write_text(source + '\n\ndef _planted(config):\n    return config.family == "bloom"'
                                        ' or config.family.startswith("gemma")\n', encoding="utf-8")
    found = _family_names_in(tmp_path)
    assert len(found) == 2 and "'bloom'" in found[0] and "'gemma'" in found[1], found


def _caches(value, seen=None):
    """Every FusedQKVCache inside ``value`` (tuples, lists, dicts, NamedTuples)."""
    if isinstance(value, FusedQKVCache):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _caches(v)
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _caches(v)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_fused_qkv_is_what_the_family_splits(name):
    """Features.fused_qkv is set exactly when the table fuses q, k and v in one tensor; it is the
    layout the family's own split uses (its FusedQKVCache's), or, for a table that splits at loading
    (GPT-2's "split columns": three equal column blocks), "blocks"."""
    family = FAMILY[name]
    config = config_of({"model_type": name, **family.example})
    fused_rows = [t for t in family.block if len(t.ours) == 3 or t.ours[0].rsplit(".", 1)[-1] in ("W_qkv", "b_qkv")]
    layout = family.features.fused_qkv
    assert (layout is not None) == bool(fused_rows), (name, layout, fused_rows)
    assert layout is None or layout in QKV_LAYOUTS
    params = init_lm_params(config, seed=0)
    prepared = family.prepare(block_params(params, config, 0), config)
    layouts = {c.layout for c in _caches(prepared)}
    assert layouts <= {layout}, (name, layouts, layout)
    if fused_rows and not layouts:  # split by the loader: the table's how says how
        assert all(t.how in ("split columns", "split") for t in fused_rows) and layout == "blocks"


def test_what_compare_reads_from_the_tables():
    """The fused layouts by family file, the (in, out) weights GPT-2's Conv1D stores, Gemma's (1 + w)
    norms and sqrt(D) embedding factor: each read from data the family files hold."""
    def config(name):
        return config_of({"model_type": name, **FAMILY[name].example})
    for name, layout in (("gpt_neox", "per_head"), ("bloom", "per_head"), ("phi3", "blocks"), ("gpt2", "blocks")):
        c = config(name)
        parts, _ = _layout({}, c)
        fused = [idx for _, _, idx in parts if set(idx) == {"q", "k", "v"}]
        assert fused and all(all(np.array_equal(idx[n], qkv_layouts(c)[layout][n]) for n in "qkv") for idx in fused)
    assert stored_in_out(config("gpt2")) == {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                                             "mlp.c_proj.weight"}
    assert stored_in_out(config("llama")) == set() == stored_in_out(config("bloom"))
    g = config("gemma2")
    assert offset_norms(g) and not offset_norms(config("llama"))
    assert embedding_scale(g) == pytest.approx(np.sqrt(g.d_model), rel=1e-15)
    assert embedding_scale(config("gpt2")) == embedding_scale(config("bloom")) == embedding_scale(config("llama")) == 1.0


# ------------------------------------------------------------ BLOOM's per-head split, read the wrong way
def _bloom_port(folder, misread):
    """transformers' BloomForCausalLM from ``folder``, its fused query_key_value read per head as
    transformers does, or (``misread``) as [q | k | v]: a port whose split takes q from the first D
    outputs of the fused projection computes what transformers' model computes on the weight whose
    per-head rows of q are the checkpoint's first D rows (and so for k, v): the loader below does
    that permutation, the rest is transformers' code."""
    import torch
    import transformers

    class Bloom(transformers.BloomForCausalLM):  # called model(ids, attention_mask), as compare.model calls it
        def forward(self, ids, attention_mask=None):
            return super().forward(input_ids=ids, attention_mask=attention_mask)

    model = Bloom.from_pretrained(folder)
    if misread:
        config = config_of(dict(model.config.to_dict()))
        right, wrong = qkv_layouts(config)["per_head"], qkv_layouts(config)["blocks"]
        source = np.arange(3 * config.d_model)
        for n in "qkv":
            source[right[n].ravel()] = wrong[n].ravel()
        index = torch.from_numpy(source)
        with torch.no_grad():
            for block in model.transformer.h:
                qkv = block.self_attention.query_key_value
                qkv.weight.copy_(qkv.weight[index])
                qkv.bias.copy_(qkv.bias[index])
    return model


def test_a_bloom_port_splitting_per_head_qkv_as_blocks_is_named(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    folder = write_random_model(tmp_path / "bloom", "bloom", seed=2)
    right = compare.model(_bloom_port(folder, False), folder)  # BLOOM's float32 steps in float64 (compare's patches)
    wrong = compare.model(_bloom_port(folder, True), folder)
    assert right.ok, str(right)
    assert not wrong.ok and wrong.mistake == "fused_qkv_split", str(wrong)
    assert wrong.where == "transformer.h.0.self_attention", str(wrong)


def test_a_reference_of_zeros_is_judged_without_overflow():
    """A variant whose reference is all zeros at a module (Gemma's final norm weights w - 1 = 0 when the
    folder's are 0): any difference is infinite, none is 0, and no overflow warning escapes (it made a
    model-level test fail when the user's logits passed about 4, their size over float64's tiny)."""
    from attention_ref.compare.levels import _compare

    zeros = np.zeros((2, 3, 4))
    assert _compare(np.full((2, 3, 4), 5.0), zeros, None, 1e-10) == (np.inf, False)
    assert _compare(zeros, zeros, None, 1e-10) == (0.0, False)
    assert _compare(np.full((2, 3, 4), 1.0), np.full((2, 3, 4), 1.25), None, 1e-10)[0] == pytest.approx(0.2)
