"""``write_random_model``: a save_pretrained-style folder of every family, from a seed; and
``to_transformers``' names by transformers version, without torch (the strict loads into
transformers' models are in ``test_state_dict_against_transformers.py``)."""
import json

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.interop import load_pretrained, read_safetensors, to_transformers, write_random_model
from attention_ref.models import FAMILIES
from attention_ref.models.config import family_of


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_writes_a_folder_that_loads(tmp_path, family):
    folder = write_random_model(tmp_path / "m", family, seed=0)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((folder / "config.json").read_text())["model_type"] == family
    params, config = load_pretrained(folder)
    assert config.family == family
    assert {v.dtype for v in params.values()} == {np.dtype(np.float32)}  # stored float32, kept
    expected = ar.init_lm_params(config, seed=0, dtype=np.float32)
    assert sorted(params) == sorted(expected)
    for name in params:
        np.testing.assert_array_equal(params[name], expected[name], err_msg=name)
    # nn.Linear's (out, in) weights are moved into our (in, out) in place, rows contiguous (C order):
    # a decoding step's x @ W then runs the faster matrix-vector kernel (docs/performance.md)
    transposed = [name for name, v in params.items()
                  if v.ndim == 2 and not v.flags.c_contiguous and v.flags.f_contiguous]
    assert transposed == [], transposed
    params64, _ = load_pretrained(folder, dtype=np.float64)
    assert {v.dtype for v in params64.values()} == {np.dtype(np.float64)}
    state = read_safetensors(folder / "model.safetensors")
    assert ("lm_head.weight" in state or "embed_out.weight" in state) == (not config.tie_word_embeddings)


def test_seed_none_int_or_generator(tmp_path):
    def weights(name, **kw):
        return read_safetensors(write_random_model(tmp_path / name, "qwen3", **kw) / "model.safetensors")

    a, b, c = weights("a", seed=3), weights("b", seed=3), weights("c", seed=np.random.default_rng(3))
    d = weights("d", seed=4)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
        np.testing.assert_array_equal(a[name], c[name])  # a Generator seeded 3 draws as seed 3
    assert any(not np.array_equal(a[n], d[n]) for n in a if a[n].std() > 0)
    weights("e")  # seed=None: fresh entropy
    assert weights("f", dtype=np.float64)["model.norm.weight"].dtype == np.float64


def test_fields_override_the_config(tmp_path):
    folder = write_random_model(tmp_path, "llama", seed=0, vocab_size=100, tie_word_embeddings=True)
    params, config = load_pretrained(folder)
    assert config.vocab_size == 100 and config.tie_word_embeddings
    assert params["embed_tokens"].shape == (100, 16)


@pytest.mark.parametrize("call, error, words", [
    (dict(family="bert"), ValueError, ["family must be one of", "'bert'"]),
    (dict(family="llama", dtype=np.float16), TypeError, ["float16"]),
    (dict(family="llama", seed=-1), ValueError, ["seed"]),
    (dict(family="llama", seed=1.5), TypeError, ["seed", "1.5"]),
    (dict(family="llama", hidden_act="relu"), ValueError, ["hidden_act", "relu"]),
])
def test_bad_arguments_are_refused_by_name_and_nothing_is_written(tmp_path, call, error, words):
    with pytest.raises(error) as e:
        write_random_model(tmp_path / "m", **call)
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)
    assert not (tmp_path / "m").exists()


def test_a_file_in_the_way_is_refused(tmp_path):
    (tmp_path / "m").write_text("mine")
    with pytest.raises(ValueError, match="m: path must be a folder"):
        write_random_model(tmp_path / "m", "gpt2", seed=0)
    assert (tmp_path / "m").read_text() == "mine"


@pytest.mark.parametrize("family", FAMILIES)
def test_state_dict_names_by_version(tmp_path, family):
    """A tied head under the head's name (the very array of the token table); GPT-NeoX's head by version; the
    experts one tensor per expert in 4.x (``mlp.experts.{e}.gate_proj.weight``), fused in 5.x."""
    for tie in (False, True):
        params, config = load_pretrained(write_random_model(tmp_path / str(tie), family, seed=0,
                                                            tie_word_embeddings=tie))
        four, five = to_transformers(params, config, version="4.57.1"), to_transformers(params, config, version=5)
        head4 = "embed_out.weight" if family == "gpt_neox" else "lm_head.weight"
        per_expert = {k for k in four if ".mlp.experts." in k and k.split(".mlp.experts.")[1].split(".")[0].isdigit()}
        fused = {name for name, _ in family_of(config).experts_5x} if per_expert else set()
        assert {"mlp." + k.split(".mlp.", 1)[1] for k in set(five) - set(four) if ".mlp." in k} == fused
        assert set(four) - set(five) - per_expert == ({head4} - {"lm_head.weight"})
        assert head4 in four and "lm_head.weight" in five
        if tie:
            table = [k for k in five if k.endswith(("wte.weight", "embed_tokens.weight", "embed_in.weight",
                                                             "word_embeddings.weight"))]
            assert len(table) == 1 and five["lm_head.weight"] is five[table[0]] and four[head4] is four[table[0]]


@pytest.mark.parametrize("version", ["three", "3.0", 3, True, 4.5, "", int])
def test_a_bad_version_is_refused_by_name(version):
    config = ar.LMConfig.from_dict({"model_type": "gpt2", "vocab_size": 5, "n_embd": 4, "n_layer": 1, "n_head": 1,
                                    "n_positions": 4})
    with pytest.raises(ValueError, match=r"^version must be .*, got "):
        to_transformers(ar.init_lm_params(config, seed=0), config, version=version)
