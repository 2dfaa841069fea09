"""The interop tables' ``"stack experts, transpose"``: a checkpoint's one ``nn.Linear`` per expert
(``mlp.experts.{e}.gate_proj.weight`` (F, D), as 4.57's and 5.x's ``save_pretrained`` write them) read into
our stacked (E, D, F), and back; transformers 5.x's fused ``model.state_dict()`` names
(``mlp.experts.gate_up_proj`` (E, 2F, D), ``mlp.experts.down_proj`` (E, D, F)) read and written by
``version=5``. Qwen3-MoE's table is the example (one dense layer by ``mlp_only_layers``, two with experts).

The first tests need no torch; the last ones read files written by the installed transformers' own
``save_pretrained`` (the CI runs them on 4.57.1 and on 5.x) and its ``model.state_dict()``."""
import numpy as np
import pytest

from attention_ref.interop import from_transformers_state, load_pretrained, to_transformers, write_random_model
from attention_ref.interop.mappings import HOW, MAPPINGS
from attention_ref.models import init_lm_params
from attention_ref.models.config import LMConfig
from attention_ref.models.families.qwen3_moe import EXAMPLE

PREFIX = "model.layers.1.mlp.experts."


def _model(seed=0):
    config = LMConfig.from_dict({**EXAMPLE, "model_type": "qwen3_moe"})
    return init_lm_params(config, seed=seed, dtype=np.float64), config


def test_the_how_is_in_the_table_and_its_words():
    rules = MAPPINGS["transformers Qwen3MoeDecoderLayer (layers.<i>.)"]
    stacked = [r for r in rules if r.how == "stack experts, transpose"]
    assert [r.theirs for r in stacked] == [f"mlp.experts.{{e}}.{n}_proj.weight" for n in ("gate", "up", "down")]
    assert "stack experts, transpose" in HOW


@pytest.mark.parametrize("version", [4, 5])
def test_round_trip_per_expert_and_fused(version):
    params, config = _model()
    state = to_transformers(params, config, version=version)
    E, D, F = config.num_experts, config.d_model, config.setting("moe_d_ff")
    if version == 4:
        assert state[PREFIX + "2.gate_proj.weight"].shape == (F, D)
        assert np.array_equal(state[PREFIX + "2.gate_proj.weight"], params["layers.1.mlp.experts.W_gate"][2].T)
        assert np.array_equal(state[PREFIX + "3.down_proj.weight"], params["layers.1.mlp.experts.W_down"][3].T)
        assert not any(k.startswith(PREFIX + "gate_up") for k in state)
    else:  # transformers 5.x: gate rows then up rows, per expert
        gate_up, down = state[PREFIX + "gate_up_proj"], state[PREFIX + "down_proj"]
        assert gate_up.shape == (E, 2 * F, D) and down.shape == (E, D, F)
        assert np.array_equal(gate_up[2, :F], params["layers.1.mlp.experts.W_gate"][2].T)
        assert np.array_equal(gate_up[2, F:], params["layers.1.mlp.experts.W_up"][2].T)
        assert np.array_equal(down[3], params["layers.1.mlp.experts.W_down"][3].T)
        assert not any(".experts.0." in k for k in state)
    assert "model.layers.0.mlp.gate_proj.weight" in state and not any("layers.0.mlp.experts" in k for k in state)
    back = from_transformers_state(state, config)
    assert sorted(back) == sorted(params)
    for name, value in params.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_a_missing_extra_or_odd_expert_is_refused_by_name():
    params, config = _model()
    state = to_transformers(params, config, version=4)
    missing = {k: v for k, v in state.items() if k != PREFIX + "3.up_proj.weight"}
    with pytest.raises(KeyError, match=r"mlp\.experts\.3\.up_proj\.weight"):
        from_transformers_state(missing, config)
    extra = {**state, PREFIX + "4.up_proj.weight": state[PREFIX + "3.up_proj.weight"]}
    with pytest.raises(ValueError, match=r"mlp\.experts\.4\.up_proj\.weight"):
        from_transformers_state(extra, config)
    odd = {**state, PREFIX + "1.down_proj.weight": state[PREFIX + "1.down_proj.weight"][:, :-1]}
    with pytest.raises(ValueError, match=r"mlp\.experts\.1\.down_proj\.weight has shape"):
        from_transformers_state(odd, config)
    fused = to_transformers(params, config, version=5)
    fused[PREFIX + "gate_up_proj"] = fused[PREFIX + "gate_up_proj"][:3]
    with pytest.raises(ValueError, match=r"mlp\.experts\.gate_up_proj has shape \(3, 24, 16\)"):
        from_transformers_state(fused, config)
    assert state[PREFIX + "1.down_proj.weight"].shape == (16, 12)  # the caller's state untouched


def test_a_file_with_a_wrong_expert_width_names_the_tensor(tmp_path):
    params, config = _model()
    write_random_model(tmp_path, "qwen3_moe", seed=0, dtype=np.float64)
    import json
    d = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**d, "moe_intermediate_size": 10}))
    with pytest.raises(ValueError, match=r"mlp\.experts\.0\.gate_proj\.weight' has shape \(12, 16\)"):
        load_pretrained(tmp_path)


def _transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return torch, transformers


def test_files_written_by_transformers_load(tmp_path):
    """A model built by the installed transformers, its weights ours; its ``save_pretrained`` folder and its
    ``model.state_dict()`` (5.x: fused) both read back into exactly our params."""
    torch, transformers = _transformers()
    params, config = _model(seed=3)
    cfg = transformers.Qwen3MoeConfig(**{k: v for k, v in EXAMPLE.items() if k != "num_experts"},
                                      num_experts=EXAMPLE["num_experts"])
    model = transformers.Qwen3MoeForCausalLM(cfg).double()
    state = to_transformers(params, config)
    assert sorted(state) == sorted(model.state_dict())
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    theirs = {k: v.numpy() for k, v in model.state_dict().items()}
    from_state = from_transformers_state(theirs, config)
    model.save_pretrained(tmp_path)
    loaded, loaded_config = load_pretrained(tmp_path)
    assert loaded_config.settings == config.settings and loaded_config.num_experts == config.num_experts
    for got in (from_state, loaded):
        assert sorted(got) == sorted(params)
        for name, value in params.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
