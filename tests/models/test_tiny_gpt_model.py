"""The tiny GPT kept in notebooks/data/tiny_gpt/ (``python examples/train_tiny_gpt.py --write``): the folder
loads with ``load_pretrained``, is small, says how it was made, holds the held-out text byte for byte, and its
held-out loss recomputed now from the committed files is the one recorded at training time. Nothing here
retrains, and nothing depends on the Python running the test (the held-out text is in the folder)."""
import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.documents import head_scores as hs
from attention_ref.interop import load_pretrained

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "notebooks" / "data" / "tiny_gpt"


def _script():
    spec = importlib.util.spec_from_file_location("train_tiny_gpt", ROOT / "examples" / "train_tiny_gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kept():
    meta = json.loads((FOLDER / "training.json").read_text())
    params, config = load_pretrained(FOLDER, dtype=np.float64)
    text = (FOLDER / meta["held_out_file"]).read_bytes()
    return meta, params, config, text


def test_the_folder_is_small_and_says_how_it_was_made(kept):
    meta, params, config, text = kept
    script = _script()
    assert MODEL_FILES <= {p.name for p in FOLDER.iterdir()}
    assert sum(p.stat().st_size for p in FOLDER.iterdir()) < 2_000_000  # a few MB at most: about 0.5 MB
    assert config == script.CONFIG and json.loads((FOLDER / "config.json").read_text()) == script.hf_config()
    assert (FOLDER / "README.md").read_text() == script.render_model_readme(meta)
    assert meta["command"].endswith("python examples/train_tiny_gpt.py --write") and meta["steps"] == 3000
    assert meta["python"].count(".") == 2 and len(meta["date"]) == 10 and meta["corpus"] == list(script.CORPUS)
    assert sum(p.size for p in params.values()) == meta["parameters"]
    # the held-out text is the one the loss was measured on, byte for byte
    assert len(text) == meta["held_out_bytes"] and hashlib.sha256(text).hexdigest() == meta["held_out_sha256"]


MODEL_FILES = {"config.json", "model.safetensors", "held_out.txt", "training.json", "README.md"}


def test_held_out_loss_recomputed_from_the_committed_files(kept):
    """The loss the package computes now on the committed weights and text, against the one recorded when the
    weights were written (both float64 on the float32 weights: they differ only by the BLAS's rounding)."""
    meta, params, config, text = kept
    script = _script()
    val = np.frombuffer(text, np.uint8).astype(np.int64)
    loss = script.held_out_loss(params, val, np.array(meta["held_out_starts"]), config)
    assert loss == pytest.approx(meta["held_out_loss"], rel=1e-9)
    assert loss < 2.0 < np.log(256)  # it learned: far below a uniform guess over the 256 bytes
    # and by the plain formula: mean of -log softmax(logits)[next byte] over the windows' 63 predictions each
    ids = np.stack([val[s:s + meta["window"]] for s in meta["held_out_starts"]])
    logits, _ = ar.lm_forward(ids, params, config)
    z = logits[:, :-1] - logits[:, :-1].max(axis=-1, keepdims=True)
    nll = np.log(np.exp(z).sum(axis=-1)) - np.take_along_axis(z, ids[:, 1:, None], axis=-1)[..., 0]
    assert nll.mean() == pytest.approx(loss, rel=1e-12)


def test_the_committed_run_is_the_documented_run(kept):
    """docs/train_tiny_gpt.json (the curve and samples docs/whole_models.md shows) is the run that wrote the
    weights: same steps, seed, date and Python."""
    meta = kept[0]
    run = json.loads(_script().RESULTS.read_text())
    assert {k: run[k] for k in ("steps", "seed", "batch_size", "python", "date")} == \
        {k: meta[k] for k in ("steps", "seed", "batch_size", "python", "date")}
    assert abs(run["final_held_out"] - meta["held_out_loss"]) < 1e-3  # float64 training weights vs float32 kept


def test_what_its_heads_do_on_held_out_text(kept):
    """The per-head claims lessons 01 and 04 make, on the 64 held-out windows: layer 0's heads 0 and 1 attend
    to the character itself, head 2 most to the previous character (no head is a clean previous-token head),
    and layer 1's head 3 reads the innermost open bracket and the start of the line, each several times more than
    evenly spread attention would."""
    meta, params, config, text = kept
    texts = [text[s:s + 64] for s in meta["held_out_starts"]]
    ids = np.stack([np.frombuffer(t, np.uint8) for t in texts]).astype(np.int64)
    attn = hs.lm_attention(ids, params, config)
    current = np.array([hs.current_token_scores(w) for w in attn])
    previous = np.array([hs.previous_token_scores(w) for w in attn])
    bracket = np.array([hs.bracket_scores(w, texts) for w in attn])
    line = np.array([hs.line_start_scores(w, texts) for w in attn])
    even = {"previous": hs.uniform_baseline(np.broadcast_to(np.arange(64) - 1, (64, 64))),
            "bracket": hs.uniform_baseline(np.stack([hs.open_bracket_positions(t) for t in texts])),
            "line": hs.uniform_baseline(np.stack([hs.last_newline_positions(t) for t in texts]))}
    assert current[0, 0] > 0.6 and current[0, 1] > 0.5
    assert np.unravel_index(previous.argmax(), previous.shape) == (0, 2) and 0.3 < previous[0, 2] < 0.35
    assert previous[0, 2] > 5 * even["previous"]
    assert np.unravel_index(bracket.argmax(), bracket.shape) == (1, 3) and bracket[1, 3] > 5 * even["bracket"]
    assert np.unravel_index(line.argmax(), line.shape) == (1, 3) and line[1, 3] > 6 * even["line"]


def test_save_model_writes_a_folder_that_loads_as_it_was_trained(tmp_path):
    """--save-model on a 3-step run: the folder loads, its weights are the trained ones rounded to float32, and its
    README and held-out loss are those of that run (nothing in the committed folder is touched)."""
    script = _script()
    result = script.train(steps=3, eval_every=3, show_progress=False)
    meta = script.save_model(result, tmp_path / "kept", "python examples/train_tiny_gpt.py --save-model kept")
    params, config = load_pretrained(tmp_path / "kept")
    assert config == script.CONFIG and set(params) == set(result["params"])
    for name, value in params.items():
        assert value.dtype == np.float32 and np.array_equal(value, result["params"][name].astype(np.float32)), name
    kept64 = {k: v.astype(np.float64) for k, v in params.items()}
    text = (tmp_path / "kept" / "held_out.txt").read_bytes()
    val = np.frombuffer(text, np.uint8).astype(np.int64)
    assert script.held_out_loss(kept64, val, np.array(meta["held_out_starts"])) == pytest.approx(meta["held_out_loss"],
                                                                                                rel=1e-12)
    assert (tmp_path / "kept" / "README.md").read_text() == script.render_model_readme(meta)
    assert meta["steps"] == 3 and "--save-model kept" in meta["command"]
