"""``to_transformers`` gives the names of transformers' ``model.state_dict()``, so that
``load_state_dict(state, strict=True)`` takes it, for every family, tied head or not, on the
installed transformers (the CI runs this file on 4.57.1 and on the newest 5.x); and the folders of
``write_random_model`` load in ``from_pretrained`` with our logits.

The names differ between the two releases for one tensor only (GPT-NeoX's head: ``embed_out.weight``
in 4.x, ``lm_head.weight`` in 5.x; found by building every family's model on both): ``version=``
picks them, and the other release's names are refused by ``strict=True`` here.
"""
import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import deepseek_v3_in_float64, load_pretrained, to_transformers, write_random_model  # noqa: E402
from attention_ref.models import FAMILIES  # noqa: E402

MAJOR = int(transformers.__version__.split(".")[0])


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("family", FAMILIES)
def test_strict_load_of_every_family(tmp_path, family, tie):
    write_random_model(tmp_path, family, seed=1, dtype=np.float64, tie_word_embeddings=tie)
    params, config = load_pretrained(tmp_path)
    # 5.x's default experts kernel (grouped_mm: gpt-oss, Qwen3-MoE) refuses float64: its loop over the experts (4.57
    # has only that)
    eager = {"experts_implementation": "eager"} if MAJOR >= 5 and config.num_experts is not None else {}
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float64, **eager).eval()
    rng = np.random.default_rng(2)  # params unlike the file's, so the load is seen in the logits
    changed = {k: v + 0.05 * rng.standard_normal(v.shape) for k, v in params.items()}
    state = to_transformers(changed, config)
    model = transformers.AutoModelForCausalLM.from_config(reference.config).double().eval()
    assert sorted(state) == sorted(model.state_dict())
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    ids = np.array([[3, 9, 4, 60, 5, 7]])
    # 4.57's DeepSeek-V3 router returns float32 weights, which its experts' index_add_ into float64 refuses: its
    # float32 steps run in float64 (deepseek_v3_in_float64) for this family (5.x casts the experts' outputs itself)
    patch = deepseek_v3_in_float64() if family == "deepseek_v3" and MAJOR < 5 else contextlib.nullcontext()
    with torch.no_grad(), patch:
        theirs = model(torch.from_numpy(ids)).logits.numpy()
        stored = reference(torch.from_numpy(ids)).logits.numpy()
    ours_changed, ours_stored = (ar.lm_forward(ids, p, config)[0] for p in (changed, params))
    # transformers keeps a few steps in float32 inside a float64 model (RMSNorm, RoPE angles): 1e-5, not
    # 1e-10, is enough to tell the loaded weights from the random ones (0.05 apart: logits 1e-2 apart)
    np.testing.assert_allclose(theirs, ours_changed, rtol=0, atol=1e-5 * np.abs(theirs).max())
    np.testing.assert_allclose(stored, ours_stored, rtol=0, atol=1e-5 * np.abs(stored).max())
    assert np.abs(theirs - stored).max() > 1e-3  # the strict load replaced every weight the logits read


@pytest.mark.parametrize("family", ["gpt_neox", "llama"])
def test_the_other_release_names_are_refused_where_they_differ(tmp_path, family):
    """version= of the other major release: GPT-NeoX's head name is wrong for this model (strict refuses),
    every other family's names are the same."""
    write_random_model(tmp_path, family, seed=0)
    params, config = load_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tmp_path))
    other = {k: torch.from_numpy(v) for k, v in to_transformers(params, config, version=9 - MAJOR).items()}
    if family == "gpt_neox":
        with pytest.raises(RuntimeError, match="embed_out.weight|lm_head.weight"):
            model.load_state_dict(other, strict=True)
    else:
        model.load_state_dict(other, strict=True)
    installed = to_transformers(params, config, version=transformers.__version__)
    assert sorted(installed) == sorted(to_transformers(params, config)) == sorted(model.state_dict())
