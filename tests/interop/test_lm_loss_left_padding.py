"""lm_loss on a left-padded batch against transformers' ``labels=`` loss (labels = ids where the mask
is 1, else -100: the usual ground truth), in float64 (transformers' float32 steps patched,
attention_ref/interop/float64.py; the loss itself recomputed with ``cross_entropy`` on the float64
logits, since ``labels=`` casts the logits to float32).

Which positions count is the same: position n counts when token n + 1 is real, so a row with P
left pads predicts its first real token from the last pad position (``next_token_targets`` ==
transformers' shifted labels, checked). That pad position's query has no real key, and its logits
are whatever a fully masked attention row computes: this package gives such a query zero weights
(as transformers' sdpa path does: Llama and GPT-2 agree at 1e-10), transformers' eager path (BLOOM's
only one, Gemma 2's) adds its mask's minimum to every score, so the row averages the values of every
key, future real tokens included. That one term is the whole difference there; over the positions whose query is real too, the two losses agree at 1e-10
for every family here.
"""
import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import gemma2_in_float64, llama_in_float64, load_pretrained, write_random_model  # noqa: E402
from attention_ref.interop.float64 import bloom_in_float64  # noqa: E402
from attention_ref.nn.cross_entropy import next_token_targets  # noqa: E402

RTOL = 1e-10
#: family -> (transformers' attention path, the float64 patch, whether the pad query's logits agree)
FAMILIES = {"llama": ("sdpa", llama_in_float64, True), "gpt2": ("sdpa", contextlib.nullcontext, True),
            "bloom": ("eager", bloom_in_float64, False), "gemma2": ("eager", gemma2_in_float64, False)}


def _loss(logits, targets):
    """Mean cross-entropy of ``logits`` (B, T, V) against ``targets`` (B, T), -100 ignored (float64)."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    keep = targets != -100
    return float(-np.take_along_axis(logp, np.where(keep, targets, 0)[..., None], axis=-1)[..., 0][keep].mean())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_lm_loss_on_left_padding_against_labels(family, tmp_path):
    attention, patch, pad_query_agrees = FAMILIES[family]
    folder = write_random_model(tmp_path, family, seed=5)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation=attention).double()
    params, config = load_pretrained(folder, dtype=np.float64)
    ids = np.random.default_rng(0).integers(3, config.vocab_size, (3, 9))
    mask = np.ones_like(ids)
    mask[1, :3] = 0  # left padding: 3 pads, then 1
    mask[2, :1] = 0
    ours, _, logits = ar.lm_loss(ids, params, config, attention_mask=mask)

    ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
    labels = ids_t.masked_fill(mask_t == 0, -100)
    with torch.no_grad(), patch():
        out = model(ids_t, attention_mask=mask_t, labels=labels)
    theirs_logits = out.logits.numpy()
    targets = next_token_targets(ids, mask)
    # the same positions: ours for the unshifted logits, transformers' labels shifted by one
    assert np.array_equal(targets[:, :-1], labels[:, 1:].numpy()) and (targets[:, -1] == -100).all()
    theirs = _loss(theirs_logits, targets)
    assert abs(theirs - out.loss.item()) <= 1e-6 * theirs  # labels= computes it in float32
    real = mask.astype(bool)
    assert np.abs(logits[real] - theirs_logits[real]).max() <= RTOL * np.abs(theirs_logits[real]).max()
    # over the positions whose query is real too, the two agree whatever a fully masked query computes
    both_real = np.where(real, targets, -100)
    assert abs(_loss(logits, both_real) - _loss(theirs_logits, both_real)) <= RTOL * theirs
    last_pad = [(b, int((mask[b] == 0).sum()) - 1) for b in range(len(ids)) if not mask[b].all()]
    rows, cols = np.array(last_pad).T
    if pad_query_agrees:  # sdpa: a fully masked query attends to nothing, as here
        assert abs(ours - theirs) <= RTOL * theirs, (ours, theirs)
        assert np.abs(logits[rows, cols] - theirs_logits[rows, cols]).max() <= RTOL
    else:  # eager: the pad query's logits differ, and they are the whole difference
        assert np.abs(logits[rows, cols] - theirs_logits[rows, cols]).max() > 1e-6
        spliced = logits.copy()
        spliced[rows, cols] = theirs_logits[rows, cols]
        assert abs(_loss(spliced, targets) - theirs) <= RTOL * theirs
        assert abs(ours - theirs) > 1e-9
