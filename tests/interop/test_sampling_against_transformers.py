"""Sampled ``generate`` with ``draw=torch_draw(seed)`` against transformers' ``model.generate(do_sample=True)``
after ``torch.manual_seed(seed)``: token for token, every family, on a left-padded batch, with the
processors on and off and several sequences per prompt (the CI runs this file on transformers
4.57.1 and the newest 5.x). The model is ``write_random_model``'s float32 folder, read by both.

transformers 4.57's generate counts the left padding in the repetition penalty (it does not pass
``prompt_ignore_length``; ours leaves padding out, as 5.x): there the case with the penalty runs on
prompts of one length.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import load_pretrained, torch_draw, write_random_model  # noqa: E402
from attention_ref.models import FAMILIES  # noqa: E402
from _transformers_api import penalty_skips_padding  # noqa: E402

#: name -> (torch seed, generate's settings)
SETTINGS = {"plain": (0, dict(top_k=0, temperature=1.0)),
            "processors": (5, dict(top_k=10, top_p=0.9, temperature=0.7, repetition_penalty=1.3)),
            "three-each": (2, dict(top_k=20, temperature=1.5, num_return_sequences=3))}


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request, tmp_path_factory):
    folder = write_random_model(tmp_path_factory.mktemp(request.param), request.param, seed=0)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    params, config = load_pretrained(folder)
    return model, params, config


@pytest.mark.parametrize("name", list(SETTINGS))
def test_sampled_tokens_equal_transformers(saved, name):
    model, params, config = saved
    seed, settings = SETTINGS[name]
    ids, mask = ar.left_pad([[5, 6, 7, 8], [3, 4, 5, 6, 7, 9], [11, 12]], pad_token_id=0)
    if "repetition_penalty" in settings and not penalty_skips_padding():
        ids, mask = ids[1:2], mask[1:2]  # 4.57 penalises the padding: one prompt, unpadded
    torch.manual_seed(seed)
    with torch.no_grad():
        theirs = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), do_sample=True,
                                max_new_tokens=12, pad_token_id=0, eos_token_id=None, **settings).numpy()
    ours = ar.generate(ids, params, config, 12, attention_mask=mask, do_sample=True, draw=torch_draw(seed),
                       **{**settings, "top_k": settings["top_k"] or None})
    np.testing.assert_array_equal(ours, theirs)
    assert len(np.unique(ours[:, ids.shape[1]:])) > 3  # a real sample, not one token repeated


def test_numpy_draws_are_not_transformers_tokens(saved):
    """The default draw (seed=, NumPy's generator) samples the same distribution with another stream."""
    model, params, config = saved
    ids = np.array([[5, 6, 7, 8]])
    torch.manual_seed(0)
    with torch.no_grad():
        theirs = model.generate(torch.from_numpy(ids), do_sample=True, top_k=0, max_new_tokens=12,
                                pad_token_id=0, eos_token_id=None).numpy()
    ours = ar.generate(ids, params, config, 12, do_sample=True, seed=0)
    assert not np.array_equal(ours, theirs)
