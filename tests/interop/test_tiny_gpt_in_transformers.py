"""The tiny GPT kept in notebooks/data/tiny_gpt/ is a folder transformers reads: ``GPT2LMHeadModel.from_pretrained``
loads it with no missing or unexpected weight, and in float64 its logits on held-out text and its loss equal ours
at 1e-10 (GPT-2 computes every step in the model's dtype, so nothing needs patching to float64; the eager
attention is asked for so that the softmax runs in float64 too). Skipped without torch and transformers."""
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import load_pretrained  # noqa: E402

FOLDER = Path(__file__).resolve().parents[2] / "notebooks" / "data" / "tiny_gpt"


def test_transformers_loads_the_kept_model_and_agrees():
    meta = json.loads((FOLDER / "training.json").read_text())
    text = (FOLDER / "held_out.txt").read_bytes()
    model, info = transformers.GPT2LMHeadModel.from_pretrained(FOLDER, output_loading_info=True,
                                                                attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    model = model.double().eval()
    params, config = load_pretrained(FOLDER, dtype=np.float64)
    ids = np.stack([np.frombuffer(text[s:s + meta["window"]], np.uint8) for s in meta["held_out_starts"][:8]])
    ids = ids.astype(np.int64)
    ours, _ = ar.lm_forward(ids, params, config)
    with torch.no_grad():
        logits = model(torch.from_numpy(ids)).logits
        # transformers' own loss casts the logits to float32 first; the same loss in float64, by torch:
        their_loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                       torch.from_numpy(ids[:, 1:]).reshape(-1))
    theirs = logits.numpy()
    assert np.abs(ours - theirs).max() <= 1e-10 * np.abs(theirs).max()
    loss, _ = ar.cross_entropy_forward(ours, ar.next_token_targets(ids))
    assert float(loss) == pytest.approx(float(their_loss), rel=1e-10)
