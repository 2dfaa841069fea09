"""``load_pretrained`` and the safetensors reader on broken and hostile model folders built by hand.

Every case ends in the right result or in one error, one line, that names the file and the field
or tensor; nothing outside the folder is read; devices and FIFOs are refused without being
opened for reading; the header's offsets are checked as the format states (the safetensors
package, when installed, refuses the same files); loading takes at most 1.2x the file's size.
"""
import json
import os
import struct
import threading
import tracemalloc

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.interop import load_pretrained, read_safetensors, to_transformers, write_safetensors
from attention_ref.interop.safetensors import MAX_HEADER_BYTES

GPT2 = {"model_type": "gpt2", "vocab_size": 11, "n_embd": 8, "n_layer": 2, "n_head": 2, "n_positions": 16,
        "n_inner": 12}
LLAMA = {"model_type": "llama", "vocab_size": 13, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "intermediate_size": 12, "tie_word_embeddings": False}


def _folder(tmp_path, hf=GPT2, seed=0):
    config = ar.LMConfig.from_dict(hf)
    params = ar.init_lm_params(config, seed=seed, dtype=np.float32)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf))
    state = to_transformers(params, config)
    if config.tie_word_embeddings:  # save_pretrained writes a tied weight once
        del state["lm_head.weight"]
    write_safetensors(state, folder / "model.safetensors")
    return folder, params, config


def _raw(header: dict, data: bytes, n=None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if n is None else n) + text + data


def _one_line_error(exc_info, *words):
    message = str(exc_info.value).strip("'\"")
    assert "\n" not in message, message
    for word in words:
        assert word in message, f"{word!r} not in: {message}"
    return message


# ------------------------------------------------------------------ the folder's bounds
@pytest.mark.parametrize("name", ["../outside.safetensors", "/ABS/outside.safetensors", "sub/model.safetensors", "",
                                  "..", "a\x00b.safetensors", "..\\outside.safetensors", 7])
def test_shard_names_are_plain_file_names_in_the_folder(tmp_path, name):
    folder, params, config = _folder(tmp_path)
    state = to_transformers(params, config)
    outside = tmp_path / "outside.safetensors"
    write_safetensors(state, outside)  # a valid file: loading it would succeed silently
    (folder / "sub").mkdir()
    write_safetensors(state, folder / "sub" / "model.safetensors")
    (folder / "model.safetensors").unlink()
    if isinstance(name, str):
        name = name.replace("/ABS", str(tmp_path))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(state, name)}))
    with pytest.raises(ValueError) as e:
        load_pretrained(folder)
    _one_line_error(e, "model.safetensors.index.json", "weight_map", "plain file name")


def test_an_absolute_system_file_is_never_read(tmp_path):
    folder, params, config = _folder(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"wte": "/etc/passwd"}}))
    with pytest.raises(ValueError) as e:
        load_pretrained(folder)
    assert "root:" not in str(e.value)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
@pytest.mark.parametrize("how", ["symlink", "index"])
def test_devices_are_refused_without_reading(tmp_path, how):
    folder, _, _ = _folder(tmp_path)
    (folder / "model.safetensors").unlink()
    if how == "symlink":
        os.symlink("/dev/zero", folder / "model.safetensors")
    else:
        os.symlink("/dev/zero", folder / "zero.safetensors")
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"wte": "zero.safetensors"}}))
    with pytest.raises(ValueError) as e:
        load_pretrained(folder)
    _one_line_error(e, "must be a regular file, found a device")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("which", ["model.safetensors", "config.json"])
def test_a_fifo_is_refused_and_never_hangs(tmp_path, which):
    folder, _, _ = _folder(tmp_path)
    (folder / which).unlink()
    os.mkfifo(folder / which)
    outcome = []

    def load():
        try:
            load_pretrained(folder)
        except ValueError as e:
            outcome.append(str(e))

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():  # unblock the reader so the test process can end
        fd = os.open(folder / which, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("load_pretrained hung on a FIFO")
    assert outcome and "found a FIFO" in outcome[0] and which in outcome[0]


def test_a_symlink_to_a_regular_file_loads(tmp_path):
    """The Hugging Face cache's snapshots are symlinks to blobs."""
    folder, params, _ = _folder(tmp_path)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).rename(blobs / name)
        os.symlink(blobs / name, folder / name)
    loaded, _ = load_pretrained(folder)
    for k, v in params.items():
        np.testing.assert_array_equal(loaded[k], v, err_msg=k)


# ------------------------------------------------------------------ the safetensors header
F32_2x2 = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
DATA = np.arange(8, dtype="<f4").tobytes()  # two 2x2 tensors' bytes


def _second(offsets, shape=(2, 2), dtype="F32"):
    return {"a": F32_2x2, "b": {"dtype": dtype, "shape": list(shape), "data_offsets": offsets}}


def _repeated() -> bytes:
    """Two entries named 'a' (JSON parsers keep the last one silently: an aliasing trick)."""
    body = ('{"a": %s, "a": %s}' % (json.dumps(F32_2x2), json.dumps(F32_2x2))).encode()
    return struct.pack("<Q", len(body)) + body + DATA[:16]


HOSTILE = {
    "negative offset": (_raw(_second([-16, 0]), DATA), ["'b'", "data_offsets", "[-16, 0]"]),
    "overlapping": (_raw(_second([8, 24]), DATA), ["'b'", "overlaps tensor 'a'"]),
    "aliased": (_raw(_second([0, 16]), DATA), ["overlaps tensor"]),
    "a gap": (_raw(_second([20, 36]), DATA + b"\0" * 4), ["'b'", "leaves a gap"]),
    "truncated": (_raw(_second([16, 32]), DATA[:20]), ["'b'", "truncated", "ends at byte 32"]),
    "trailing bytes": (_raw(_second([16, 32]), DATA + b"\0" * 8), ["cover 32 bytes", "has 40"]),
    "size and shape disagree": (_raw(_second([16, 32], shape=(3, 2)), DATA), ["'b'", "needs 24 bytes", "hold 16"]),
    "unknown dtype": (_raw(_second([16, 32], dtype="F8_E4M3"), DATA), ["'b'", "F8_E4M3", "does not know"]),
    "negative dimension": (_raw(_second([16, 32], shape=(-2, -2)), DATA), ["'b'", "shape", "[-2, -2]"]),
    "boolean dimension": (_raw({"a": {**F32_2x2, "shape": [True, 4]}}, DATA[:16]), ["'a'", "shape"]),
    "missing field": (_raw({"a": {"dtype": "F32", "shape": [4]}}, DATA[:16]), ["'a'", "data_offsets"]),
    "not an object": (_raw([1, 2], b""), ["JSON object", "list"]),
    "not JSON": (struct.pack("<Q", 5) + b"{oops" + DATA, ["not valid JSON"]),
    "not UTF-8": (struct.pack("<Q", 4) + b"{\xff\xfe}" + DATA, ["not valid JSON"]),
    "a repeated name": (_repeated(), ["'a'", "more than once"]),
    "huge header length": (struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}", ["more than the 100000000 allowed"]),
    "header past the end": (struct.pack("<Q", 1000) + b"{}", ["a header of 1000 bytes in a file of 10"]),
    "too short": (b"abc", ["3 bytes"]),
    "metadata not strings": (_raw({"__metadata__": {"format": 1}, "a": F32_2x2}, DATA[:16]), ["__metadata__"]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_header_is_refused_with_the_file_and_the_field(tmp_path, case):
    blob, words = HOSTILE[case]
    path = tmp_path / "x.safetensors"
    path.write_bytes(blob)
    with pytest.raises(ValueError) as e:
        read_safetensors(path)
    _one_line_error(e, str(path), *words)
    if case == "a repeated name":  # the safetensors package (0.8) keeps one of the two: we refuse both
        return
    try:  # the safetensors package refuses the same files
        from safetensors.numpy import load_file
    except ImportError:
        return
    with pytest.raises(Exception):  # noqa: B017 (its own error types)
        load_file(str(path))


def test_valid_files_of_both_writers_read_the_same(tmp_path):
    tensors = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "empty": np.zeros((0, 4), np.float64),
               "i": np.arange(3, dtype=np.int64)}
    write_safetensors(tensors, tmp_path / "ours.safetensors", metadata={"format": "np"})
    back = read_safetensors(tmp_path / "ours.safetensors")
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].flags.writeable
        np.testing.assert_array_equal(back[k], v)
    try:
        from safetensors.numpy import load_file, save_file
    except ImportError:
        return
    for k, v in load_file(str(tmp_path / "ours.safetensors")).items():
        np.testing.assert_array_equal(v, tensors[k])
    save_file(tensors, str(tmp_path / "theirs.safetensors"))
    for k, v in read_safetensors(tmp_path / "theirs.safetensors").items():
        np.testing.assert_array_equal(v, tensors[k])


class _Pairs(dict):
    """A mapping whose items repeat a name (as a list of pairs converted by hand would)."""

    def items(self):
        return [("w", np.ones(2)), ("w", np.zeros(2))]


@pytest.mark.parametrize("tensors, match", [({"__metadata__": np.ones(2)}, "reserved"),
                                             (_Pairs(), "'w' appears more than once"),
                                             ({3: np.ones(2)}, "must be strings")])
def test_write_safetensors_refuses_reserved_and_repeated_names(tmp_path, tensors, match):
    with pytest.raises((ValueError, TypeError), match=match):
        write_safetensors(tensors, tmp_path / "x.safetensors")
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------ config.json and the shapes
CONFIGS = {
    "tie as a string": ({**GPT2, "tie_word_embeddings": "false"}, "'tie_word_embeddings'", "JSON boolean"),
    "zero heads": ({**GPT2, "n_head": 0}, "'n_head'", "positive integer, found 0"),
    "a float count": ({**GPT2, "n_layer": 2.0}, "'n_layer'", "found 2.0 (float)"),
    "a boolean count": ({**GPT2, "vocab_size": True}, "'vocab_size'", "found True (bool)"),
    "a missing count": ({k: v for k, v in GPT2.items() if k != "n_embd"}, "'n_embd'", "missing"),
    "eps as a string": ({**GPT2, "layer_norm_epsilon": "1e-5"}, "'layer_norm_epsilon'", "positive number"),
    "a negative eps": ({**LLAMA, "rms_norm_eps": -1e-6}, "'rms_norm_eps'", "positive number"),
    "width not a multiple": ({**GPT2, "n_head": 3}, "'n_embd' = 8", "multiple of 'n_head' = 3"),
    "kv heads not a divisor": ({**LLAMA, "num_key_value_heads": 3}, "num_kv_heads = 3", "divide"),
    "a bad pad id": ({**LLAMA, "pad_token_id": "0"}, "'pad_token_id'", "integer or null"),
    "rope as a list": ({**LLAMA, "rope_scaling": [1]}, "'rope_scaling'", "object or null"),
    "rope theta as a string": ({**LLAMA, "rope_parameters": {"rope_type": "default", "rope_theta": "1e4"}},
                               "'rope_parameters.rope_theta'", "positive number"),
    "an unknown family": ({"model_type": "bert"}, "model_type 'bert'", "not supported"),
}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_config_fields_are_checked_where_read(tmp_path, case):
    hf, field, words = CONFIGS[case]
    folder, _, _ = _folder(tmp_path, GPT2 if hf.get("model_type") != "llama" else LLAMA)
    (folder / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError) as e:
        load_pretrained(folder)
    _one_line_error(e, "config.json", field, words)


@pytest.mark.parametrize("text, words", [("{not json", "not valid JSON"), ("[1, 2]", "expected a JSON object")])
def test_a_malformed_config_is_named(tmp_path, text, words):
    folder, _, _ = _folder(tmp_path)
    (folder / "config.json").write_text(text)
    with pytest.raises(ValueError) as e:
        load_pretrained(folder)
    _one_line_error(e, "config.json", words)


@pytest.mark.parametrize("field, value, tensor, expected, found", [
    ("n_inner", 16, "h.0.mlp.c_fc.weight", "(8, 16)", "(8, 12)"),  # a d_ff mismatch: once silently accepted
    ("vocab_size", 12, "wte.weight", "(12, 8)", "(11, 8)"),
    ("n_positions", 32, "wpe.weight", "(32, 8)", "(16, 8)"),
])
def test_each_tensor_is_checked_against_config_json_at_load(tmp_path, field, value, tensor, expected, found):
    folder, _, _ = _folder(tmp_path)
    (folder / "config.json").write_text(json.dumps({**GPT2, field: value}))
    with pytest.raises(ValueError) as e:
        load_pretrained(folder)
    _one_line_error(e, "model.safetensors", tensor, expected, found)


def test_llama_shapes_and_dtypes_are_checked(tmp_path):
    folder, params, config = _folder(tmp_path, LLAMA)
    (folder / "config.json").write_text(json.dumps({**LLAMA, "num_key_value_heads": 2}))
    with pytest.raises(ValueError) as e:
        load_pretrained(folder)
    _one_line_error(e, "model.safetensors", "k_proj.weight", "(8, 8)", "(4, 8)")
    state = to_transformers(params, config)
    state["model.norm.weight"] = np.arange(8)  # integers where a weight belongs
    write_safetensors(state, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(LLAMA))
    with pytest.raises(TypeError) as e:
        load_pretrained(folder)
    _one_line_error(e, "model.safetensors", "'model.norm.weight'", "int64", "floating")


def test_the_tie_flag_as_a_boolean_keeps_lm_head(tmp_path):
    folder, params, config = _folder(tmp_path, LLAMA)
    loaded, loaded_config = load_pretrained(folder)
    assert loaded_config.tie_word_embeddings is False
    np.testing.assert_array_equal(loaded["lm_head.W"], params["lm_head.W"])


def test_shard_index_problems_are_named(tmp_path):
    folder, params, config = _folder(tmp_path)
    state = to_transformers(params, config)
    names = sorted(state)
    write_safetensors({k: state[k] for k in names[::2]}, folder / "a.safetensors")
    write_safetensors({k: state[k] for k in names}, folder / "b.safetensors")
    (folder / "model.safetensors").unlink()
    index = folder / "model.safetensors.index.json"
    for text, words in [("{", ["not valid JSON"]), ('{"weight_map": []}', ["weight_map", "list"]),
                        (json.dumps({"weight_map": {names[1]: "a.safetensors"}}), [names[1], "a.safetensors",
                                                                                   "no such tensor"]),
                        (json.dumps({"weight_map": {names[0]: "a.safetensors", names[1]: "b.safetensors"}}),
                         [names[0], "also in"])]:
        index.write_text(text)
        with pytest.raises(ValueError) as e:
            load_pretrained(folder)
        _one_line_error(e, *words)


# ------------------------------------------------------------------ memory
def test_loading_takes_at_most_1_2x_the_file(tmp_path):
    hf = {**GPT2, "vocab_size": 4096, "n_embd": 256, "n_inner": 1024, "n_positions": 64, "n_layer": 1}
    folder, params, _ = _folder(tmp_path, hf)
    size = (folder / "model.safetensors").stat().st_size
    del params
    tracemalloc.start()
    try:
        loaded, _ = load_pretrained(folder, dtype=np.float32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum(v.nbytes for v in loaded.values()) > 0.9 * size
    assert peak <= 1.2 * size, f"peak {peak / 2**20:.1f} MiB for a file of {size / 2**20:.1f} MiB"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_load_state_refuses_a_fifo_npz(tmp_path):
    from attention_ref.interop import load_state

    np.savez(tmp_path / "a.npz", w=np.ones(3))
    np.testing.assert_array_equal(load_state(tmp_path / "a.npz")["w"], np.ones(3))
    os.mkfifo(tmp_path / "b.npz")
    with pytest.raises(ValueError) as e:
        load_state(tmp_path / "b.npz")
    _one_line_error(e, "b.npz", "found a FIFO")
