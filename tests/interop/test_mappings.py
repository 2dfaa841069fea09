"""The converters on hand-made state dicts (no torch needed), and docs/model_mappings.md generated
from the same tables. ``python tests/interop/test_mappings.py --write`` regenerates the page."""
import sys
from pathlib import Path

import numpy as np
import pytest

from attention_ref.interop import (
    from_gpt2_attention,
    from_gpt2_block,
    from_llama_attention,
    from_llama_block,
    from_torch_multihead_attention,
    load_state,
    render_markdown,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "model_mappings.md"


def test_the_mapping_page_is_generated_from_the_tables():
    assert DOC.read_text() == render_markdown() + "\n", "run python tests/interop/test_mappings.py --write"


def test_torch_multihead_attention_splits_rows_then_transposes():
    E = 4
    W = np.arange(3 * E * E, dtype=float).reshape(3 * E, E)  # (3E, E): Q, K, V stacked, each (out, in)
    state = {"in_proj_weight": W, "in_proj_bias": np.arange(3 * E, dtype=float),
             "out_proj.weight": np.eye(E) * 2, "out_proj.bias": np.ones(E)}
    p = from_torch_multihead_attention(state)
    np.testing.assert_array_equal(p["W_k"], W[E:2 * E].T)
    np.testing.assert_array_equal(p["b_v"], np.arange(2 * E, 3 * E))
    np.testing.assert_array_equal(p["W_o"], np.eye(E) * 2)
    no_bias = from_torch_multihead_attention({"in_proj_weight": W, "out_proj.weight": np.eye(E)})
    assert no_bias["b_q"] is None and no_bias["b_o"] is None


def test_gpt2_conv1d_is_split_by_columns_and_not_transposed():
    E = 4
    c_attn = np.arange(E * 3 * E, dtype=float).reshape(E, 3 * E)  # Conv1D: (in, out), Q K V side by side
    state = {"h.1.attn.c_attn.weight": c_attn, "h.1.attn.c_attn.bias": np.arange(3 * E, dtype=float),
             "h.1.attn.c_proj.weight": np.ones((E, E)), "h.1.attn.c_proj.bias": np.zeros(E)}
    p = from_gpt2_attention(state, prefix="h.1.attn.")
    np.testing.assert_array_equal(p["W_q"], c_attn[:, :E])
    np.testing.assert_array_equal(p["W_v"], c_attn[:, 2 * E:])
    assert p["W_q"] is not c_attn and not np.shares_memory(p["W_q"], c_attn)  # ours to keep


def test_llama_weights_are_transposed_and_heads_checked():
    rng = np.random.default_rng(0)
    state = {f"self_attn.{n}_proj.weight": rng.standard_normal(s) for n, s in
             (("q", (8, 8)), ("k", (4, 8)), ("v", (4, 8)), ("o", (8, 8)))}
    p = from_llama_attention(state, num_heads=4, prefix="self_attn.")
    np.testing.assert_array_equal(p["W_k"], state["self_attn.k_proj.weight"].T)
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        from_llama_attention(state, num_heads=3, prefix="self_attn.")


def test_round_trip_through_a_block_state_dict():
    """Our params -> a GPT-2 state dict written by hand -> back: the same arrays."""
    from attention_ref import init_gpt2_block_params

    ours = init_gpt2_block_params(8, 2, seed=1)
    state = {"ln_1.weight": ours["ln1.gamma"], "ln_1.bias": ours["ln1.beta"],
             "attn.c_attn.weight": np.concatenate([ours[f"self_attn.W_{n}"] for n in "qkv"], axis=1),
             "attn.c_attn.bias": np.concatenate([ours[f"self_attn.b_{n}"] for n in "qkv"]),
             "attn.c_proj.weight": ours["self_attn.W_o"], "attn.c_proj.bias": ours["self_attn.b_o"],
             "ln_2.weight": ours["ln2.gamma"], "ln_2.bias": ours["ln2.beta"],
             "mlp.c_fc.weight": ours["ffn.W_1"], "mlp.c_fc.bias": ours["ffn.b_1"],
             "mlp.c_proj.weight": ours["ffn.W_2"], "mlp.c_proj.bias": ours["ffn.b_2"]}
    back = from_gpt2_block(state)
    assert set(back) == set(ours)
    for k in ours:
        np.testing.assert_array_equal(back[k], ours[k])


def test_missing_and_misshaped_tensors_are_named(tmp_path):
    present = ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "post_attention_layernorm", "mlp.gate_proj")  # mlp.up_proj is missing
    with pytest.raises(KeyError, match=r"the state has no tensor 'layers.0.mlp.up_proj.weight'"):
        from_llama_block({f"layers.0.{k}.weight": np.ones((4, 4)) for k in present}, 2, prefix="layers.0.")
    with pytest.raises(ValueError, match=r"c_attn.weight of shape \(4, 10\) does not split into 3 equal parts"):
        from_gpt2_attention({"c_attn.weight": np.ones((4, 10))})
    path = tmp_path / "state.npz"
    np.savez(path, **{"in_proj_weight": np.ones((6, 2)), "out_proj.weight": np.ones((2, 2))})
    assert from_torch_multihead_attention(load_state(path))["W_q"].shape == (2, 2)
    with pytest.raises(ValueError, match="an .npz or a .safetensors file"):
        load_state(tmp_path / "state.pt")


def test_safetensors_read_in_plain_numpy(tmp_path):
    """Our reader and writer round-trip every dtype they name, bfloat16 is read exactly, and
    files written by the safetensors package (when installed) read the same."""
    from attention_ref.interop import read_safetensors, write_safetensors

    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5).astype(np.float32),
               "c": np.arange(6, dtype=np.int64).reshape(2, 3), "d": np.float16([1.5, -2.25]),
               "e": np.zeros((0, 3))}
    write_safetensors(tensors, tmp_path / "m.safetensors", metadata={"format": "np"})
    back = load_state(tmp_path / "m.safetensors")
    assert sorted(back) == sorted(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        np.testing.assert_array_equal(back[k], v)
    # bfloat16: the high 16 bits of a float32; 1.5 and -2.25 are exact in it
    import json
    import struct
    bits = (np.float32([1.5, -2.25]).view(np.uint32) >> 16).astype("<u2").tobytes()
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    (tmp_path / "bf16.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bits)
    np.testing.assert_array_equal(read_safetensors(tmp_path / "bf16.safetensors")["w"], np.float32([1.5, -2.25]))
    with pytest.raises(ValueError, match="not a safetensors file"):
        (tmp_path / "bad.safetensors").write_bytes(b"abc")
        read_safetensors(tmp_path / "bad.safetensors")
    try:
        from safetensors.numpy import save_file
    except ImportError:
        return
    save_file({"in_proj_weight": np.ones((6, 2)), "out_proj.weight": np.ones((2, 2))}, str(tmp_path / "s.safetensors"))
    assert from_torch_multihead_attention(load_state(tmp_path / "s.safetensors"))["W_o"].shape == (2, 2)


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    from attention_ref._atomic import write_atomic

    write_atomic(DOC, render_markdown() + "\n")
    print(f"wrote {DOC}")
