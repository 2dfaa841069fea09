"""attention_ref.documents.induction and examples/induction_heads.py: the attention-only model's gradients
against finite differences, the task's rows, the committed run recomputed from the committed weights, and a
short training run that retraces the committed curve and shows the induction score rising."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import attention_ref as ar
from attention_ref.documents import induction as ind
from attention_ref.documents.head_scores import induction_scores

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("induction_heads", ROOT / "examples" / "induction_heads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_repeat_a_block_of_distinct_tokens():
    ids, periods = ind.repeated_sequences(np.random.default_rng(0), 50, length=24, vocab_size=32,
                                          min_period=4, max_period=10)
    assert ids.shape == (50, 24) and periods.min() >= 4 and periods.max() <= 10 and len(set(periods)) > 3
    for row, L in zip(ids, periods):
        assert len(set(row[:L])) == L  # distinct within the block
        assert all(row[t] == row[t - L] for t in range(L, 24))  # then repeated
        assert all(row[t] != row[t - d] for t in range(24) for d in range(1, min(L, t + 1)))  # at no other offset


def test_rows_refuse_impossible_periods():
    with pytest.raises(ValueError, match="min_period <= max_period"):
        ind.repeated_sequences(np.random.default_rng(0), 2, length=8, vocab_size=4, min_period=3, max_period=6)


@pytest.mark.parametrize("layers", [1, 2])
def test_attention_only_backward_against_finite_differences(layers):
    params = ind.init_attention_only_params(vocab_size=7, d_model=8, num_layers=layers, num_heads=2,
                                            max_positions=6, seed=3)
    ids = np.random.default_rng(1).integers(0, 7, (2, 6))
    report = ar.gradcheck(lambda p: ind.attention_only_forward(ids, p, 2),
                          lambda dout, cache: ind.attention_only_backward(dout, cache), params, atol=1e-8, rtol=1e-7)
    assert report.ok, report


def test_loss_gradient_matches_the_pieces_and_a_head_mask_removes_a_head():
    params = ind.init_attention_only_params(vocab_size=7, d_model=8, num_layers=2, num_heads=2, max_positions=6)
    ids = np.random.default_rng(2).integers(0, 7, (3, 6))
    loss, grads, logits = ind.attention_only_loss(ids, params, 2)
    ref, _ = ar.cross_entropy_forward(logits, ar.next_token_targets(ids))
    assert loss == pytest.approx(float(ref), rel=1e-14) and set(grads) == set(params)
    # ablating head 0 of layer 0 = zeroing its query-to-output path: the same as zeroing its W_o rows
    zeroed = dict(params)
    W_o = params["layers.0.W_o"].copy()
    W_o[:4] = 0.0  # head 0's rows of W^O (d_v = 4)
    zeroed["layers.0.W_o"] = W_o
    masked, _ = ind.attention_only_forward(ids, params, 2, [np.array([0.0, 1.0]), None])
    np.testing.assert_allclose(masked, ind.attention_only_forward(ids, zeroed, 2)[0], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="head_masks has 1 entries; the model has 2 layers"):
        ind.attention_only_forward(ids, params, 2, [None])


def test_predictable_loss_counts_only_repeated_next_tokens():
    ids = np.array([[0, 1, 2, 0, 1, 2]])
    logits = np.zeros((1, 6, 3))
    logits[0, 2, 0] = logits[0, 3, 1] = logits[0, 4, 2] = 50.0  # certain and right where the next token repeats
    assert ind.predictable_loss(logits, ids, [3]) < 1e-15
    assert ind.predictable_loss(np.zeros((1, 6, 3)), ids, [3]) == pytest.approx(np.log(3))


# ------------------------------------------------------------------ the committed run


@pytest.fixture(scope="module")
def committed():
    script = _script()
    return script, json.loads(script.RESULTS.read_text()), script.load_weights()


def test_committed_numbers_are_those_of_the_committed_weights(committed):
    """Every score and loss of docs/induction_heads.json, recomputed from the committed weights on the
    evaluation rows (the ablations included)."""
    script, result, weights = committed
    ids, periods = script.evaluation_rows()
    for name in ("two_layer", "one_layer"):
        fresh = script.measure(weights[name], ids, periods)
        np.testing.assert_allclose(fresh["induction"], result[name]["induction"], rtol=1e-9)
        np.testing.assert_allclose(fresh["previous_token"], result[name]["previous_token"], rtol=1e-9)
        np.testing.assert_allclose(fresh["previous_token_first_block"], result[name]["previous_token_first_block"],
                                   rtol=1e-9)
        assert fresh["repeat_loss"] == pytest.approx(result[name]["repeat_loss"], rel=1e-9)
    fresh = script.circuit(weights["two_layer"], ids, periods)
    assert list(fresh) == list(result["ablation"])
    for key, value in fresh.items():
        np.testing.assert_allclose(value["induction"][1], result["ablation"][key]["induction"][1], rtol=1e-9)
        assert value["repeat_loss"] == pytest.approx(result["ablation"][key]["repeat_loss"], rel=1e-9)


def test_committed_run_shows_the_circuit(committed):
    """What the lessons say about it: two layers make an induction head, one layer does not; the layer-0 head
    that attends to the previous token is the one whose ablation breaks it."""
    _, result, _ = committed
    two, one = result["two_layer"], result["one_layer"]
    assert result["settings"]["steps"] == 1000
    best = max(two["induction"][1])
    assert best > 0.8 and max(one["induction"][0]) < 0.4
    assert abs(best - 0.95) < 0.005 and abs(max(one["induction"][0]) - 0.23) < 0.005  # as README.md states them
    assert two["repeat_loss"] < 0.5 < 1.5 < one["repeat_loss"] < result["uniform_loss"]
    head = int(np.argmax(two["induction"][1]))
    prev = int(np.argmax(two["previous_token"][0]))
    ablated = result["ablation"][f"layer 0 head {prev}"]
    other = result["ablation"][f"layer 0 head {1 - prev}"]
    assert ablated["induction"][1][head] < 0.5 * best  # the circuit's first half removed: the score falls
    assert ablated["repeat_loss"] > two["repeat_loss"] + 1.0
    assert ablated["induction"][1][head] < other["induction"][1][head]
    # that head attends to the previous token where the induction head needs it: the first block's keys
    assert two["previous_token_first_block"][0][prev] > 0.9 > 0.2 > max(one["previous_token_first_block"][0])


def test_a_short_run_retraces_the_committed_curve_and_the_score_rises(committed):
    """400 steps (about 8 s; 45 s on a loaded machine) of the committed run's settings: the same losses and
    induction scores at every evaluation as the committed 1000-step run (the training stream does not depend on
    the length), and the best induction score well above where it started."""
    script, result, _ = committed
    s = result["settings"]
    run = ind.train_attention_only(2, steps=400, eval_every=s["eval_every"], batch_size=s["batch_size"],
                                   lr=s["lr"], num_heads=s["num_heads"], d_model=s["d_model"],
                                   vocab_size=s["vocab_size"], length=s["length"], min_period=s["min_period"],
                                   max_period=s["max_period"], seed=s["seed"])
    curve = result["two_layer"]["curve"]
    n = len(run.steps)
    assert run.steps.tolist() == curve["step"][:n]
    np.testing.assert_allclose(run.losses, curve["loss"][:n], rtol=1e-6)
    best = run.induction.max(axis=(1, 2))
    np.testing.assert_allclose(best, curve["best_induction"][:n], rtol=1e-5, atol=1e-6)
    assert best[-1] > best[0] + 0.3


def test_the_induction_score_is_computed_on_the_rows_it_names():
    ids, _ = ind.repeated_sequences(np.random.default_rng(4), 8)
    params = ind.init_attention_only_params()
    _, cache = ind.attention_only_forward(ids, params, 2)
    scores = induction_scores(cache.weights[1], ids)
    assert scores.shape == (2,) and ((0 <= scores) & (scores <= 1)).all()
