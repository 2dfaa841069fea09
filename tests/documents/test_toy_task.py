"""The two-heads toy task: data, the model's gradients, training, and the demo script."""
import importlib.util
import inspect
import json
import pathlib
import re

import numpy as np
import pytest

from attention_ref.documents.toy_task import (
    attention_on_targets,
    head_pruning_losses,
    init_toy_model,
    make_batch,
    mse_loss,
    toy_model_backward,
    toy_model_forward,
    train_toy_model,
)
from tests._helpers import assert_close, check_gradients

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHORT = {"epochs": 8, "steps_per_epoch": 20}  # the shortened run: about a second per model


def _load_script(name="train_two_heads"):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def docs_generator():
    """examples/make_training_docs.py and the committed results it renders docs/training.md from."""
    return _load_script("make_training_docs"), json.loads((ROOT / "docs" / "training_results.json").read_text())


@pytest.fixture(scope="module")
def script_run():
    """The demo script's main(), shortened, with its printed output."""
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        result = _load_script().main(["--epochs", str(SHORT["epochs"])])
    return result, buffer.getvalue()


def test_make_batch_targets_match_a_loop():
    x, t = make_batch(np.random.default_rng(0), 6, 5)
    assert x.shape == (6, 5, 3) and t.shape == (6, 2)
    for b in range(6):
        a_best = max(range(5), key=lambda j: x[b, j, 0])
        b_best = max(range(5), key=lambda j: x[b, j, 1])
        assert t[b, 0] == x[b, a_best, 2] and t[b, 1] == x[b, b_best, 2]
        for feature in (0, 1):  # each of a and b is a shuffle of the 5 levels
            assert_close(np.sort(x[b, :, feature]), np.linspace(0, 1, 5), what="levels")
    x2, t2 = make_batch(np.random.default_rng(0), 6, 5)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(t, t2)
    with pytest.raises(ValueError, match="n_positions must be at least 2"):
        make_batch(np.random.default_rng(0), 2, 1)


@pytest.mark.parametrize("num_heads", [1, 2])
def test_toy_model_gradcheck(num_heads):
    rng = np.random.default_rng(1)
    params = init_toy_model(d_model=4, num_heads=num_heads, d_ff=6, seed=2)
    params = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in params.items()}
    x, _ = make_batch(rng, 2, 3)
    check_gradients(lambda x, p: toy_model_forward(x, p, num_heads), toy_model_backward, x, params,
                    names=["x", "params"])


def test_mse_loss_gradient():
    rng = np.random.default_rng(3)
    pred, t = rng.standard_normal((4, 2)), rng.standard_normal((4, 2))
    loss, dpred = mse_loss(pred, t)
    assert loss == pytest.approx(sum((pred[i, j] - t[i, j]) ** 2 for i in range(4) for j in range(2)) / 8)
    eps = 1e-6
    for i, j in [(0, 0), (3, 1)]:
        bumped = pred.copy()
        bumped[i, j] += eps
        assert dpred[i, j] == pytest.approx((mse_loss(bumped, t)[0] - loss) / eps, rel=1e-4)


def test_same_parameter_count_for_one_and_two_heads():
    sizes = [sum(v.size for v in init_toy_model(16, h, 32).values()) for h in (1, 2)]
    assert sizes[0] == sizes[1]


def test_training_is_deterministic():
    r1 = train_toy_model(2, seed=5, epochs=2, steps_per_epoch=3, eval_size=16)
    r2 = train_toy_model(2, seed=5, epochs=2, steps_per_epoch=3, eval_size=16)
    np.testing.assert_array_equal(r1.losses, r2.losses)
    assert r1.final_loss == r2.final_loss


def test_demo_two_heads_clearly_beat_one(script_run):
    result, printed = script_run
    last = printed.strip().splitlines()[-1]
    assert last == f"single-head final loss: {result['single']:.4f}  multi-head final loss: {result['multi']:.4f}"
    assert result["multi"] < 0.5 * result["single"]
    # one head can serve only one of the two targets: its loss stays near (1 - 1/N) / 2
    assert result["single"] > 0.4
    assert printed.count("training loss") == 2 * SHORT["epochs"]  # a progress line per epoch


@pytest.mark.parametrize("seed", [1, 2])
def test_advantage_holds_for_other_seeds(seed):
    single = train_toy_model(1, seed=seed, **SHORT)
    multi = train_toy_model(2, seed=seed, **SHORT)
    assert multi.final_loss < 0.5 * single.final_loss


def test_heads_specialise_and_pruning_hurts(script_run):
    result, printed = script_run
    share = result["on_targets"]["multi-head"]  # (H, 2): weight on the largest-a / largest-b token
    looks_at = share.argmax(axis=1)
    assert sorted(looks_at) == [0, 1], f"the two heads look at different tokens: {share}"
    assert share.max(axis=1).min() > 0.8
    single_share = result["on_targets"]["single-head"][0]
    assert single_share.max() > 0.8 and single_share.min() < 0.3  # one head picks one token
    full, without0, without1 = result["pruning"]
    assert without0 > 10 * full and without1 > 10 * full
    assert f"head 0 masked {without0:.4f}" in printed


def test_head_pruning_losses_entries():
    params = init_toy_model(4, 2, 6, seed=0)
    x, t = make_batch(np.random.default_rng(0), 5, 3)
    losses = head_pruning_losses(params, 2, x, t)
    assert losses.shape == (3,)
    assert losses[0] == mse_loss(toy_model_forward(x, params, 2)[0], t)[0]
    assert losses[1] == mse_loss(toy_model_forward(x, params, 2, np.array([0.0, 1.0]))[0], t)[0]
    share = attention_on_targets(params, 2, x)
    assert share.shape == (2, 2) and np.all((share >= 0) & (share <= 1))


def test_plots_are_saved(tmp_path):
    pytest.importorskip("matplotlib")
    script = _load_script()
    script.run(seed=0, epochs=1, steps_per_epoch=2, plots=tmp_path, verbose=False)
    for name in ("training_loss.png", "training_attention.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_leave_the_matplotlib_backend_alone(monkeypatch):
    # the figures are built without pyplot: no backend switch, no figure kept by pyplot
    matplotlib = pytest.importorskip("matplotlib")
    from attention_ref.plot.training import plot_attention_maps, plot_loss_curves

    def refuse(*args, **kwargs):
        raise AssertionError("plot_training must not call matplotlib.use")

    monkeypatch.setattr(matplotlib, "use", refuse)
    x, _ = make_batch(np.random.default_rng(0), 3, 4)
    figs = [plot_loss_curves({"a": [1.0, 0.5]}), plot_attention_maps({"h": np.full((3, 4), 0.25)}, x)]
    assert all(fig.canvas.manager is None for fig in figs)  # pyplot figures have a manager
    assert [len(fig.axes) for fig in figs] == [1, 2]  # the attention panel and its colour bar


def test_training_defaults_agree_with_the_script_and_the_docs(docs_generator):
    generator, results = docs_generator
    script = _load_script()
    defaults = inspect.signature(train_toy_model).parameters
    assert defaults["epochs"].default == script.EPOCHS == 20
    assert script.run.__defaults__[1] == script.EPOCHS
    assert results["settings"] == generator.defaults()


def test_docs_parameter_count_is_the_models(docs_generator):
    generator, results = docs_generator
    count = sum(v.size for v in init_toy_model(16, 1, 32).values())
    assert results["parameter_count"] == generator.parameter_count() == count
    assert f"**the same {count:,} parameters**" in (ROOT / "docs" / "training.md").read_text()


def test_docs_blocks_are_rendered_from_the_committed_results(docs_generator):
    generator, results = docs_generator
    text = (ROOT / "docs" / "training.md").read_text()
    found = generator.doc_blocks(text)
    rendered = generator.render_blocks(results)
    assert set(found) == set(rendered) == {"model", "settings", "demo", "curves", "heads", "seeds"}
    for name in rendered:
        assert found[name] == rendered[name], f"docs/training.md block {name!r} is stale"
    # the seed table shows the JSON's 20-epoch results, seed by seed
    table = [line for line in found["seeds"].splitlines() if line.startswith(("| one head", "| two heads"))]
    shown = np.array([[float(v) for v in re.findall(r"\d+\.\d+", line)] for line in table])  # (2, seeds)
    np.testing.assert_allclose(shown.T, results["seed_study"]["20"], atol=5e-5)


def test_docs_seed_0_retrained_matches_the_committed_results(docs_generator):
    # the one full-length run the tests repeat (a few seconds): seed 0, 20 epochs, both models
    generator, results = docs_generator
    fresh = generator.demo(0)
    stored = results["demo"]
    for key in ("single", "multi"):
        assert abs(fresh[key] - stored[key]) < 1e-9, key
    for key in ("pruning", "single_losses", "multi_losses"):
        np.testing.assert_allclose(fresh[key], stored[key], rtol=0, atol=1e-9, err_msg=key)
    for label in stored["on_targets"]:
        np.testing.assert_allclose(fresh["on_targets"][label], stored["on_targets"][label], rtol=0, atol=1e-9)
    assert results["seed_study"]["20"][0] == [stored["single"], stored["multi"]]
    assert generator.render_blocks({**results, "demo": fresh})["demo"] == generator.render_blocks(results)["demo"]


def test_docs_shortened_run_matches_the_committed_results(script_run, docs_generator):
    result, _ = script_run
    _, results = docs_generator
    single, multi = results["seed_study"][str(SHORT["epochs"])][0]
    assert abs(result["single"] - single) < 1e-9 and abs(result["multi"] - multi) < 1e-9
