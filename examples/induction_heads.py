"""An induction head, for what it is: train a two-layer and a one-layer attention-only model on
repeated random tokens with the hand-derived gradients, and measure the circuit.

    python examples/induction_heads.py            # about 2 minutes on 2 cores (longer on a shared machine)
    python examples/induction_heads.py --write    # also rewrites docs/induction_heads.json,
                                                  # docs/figures/induction_heads.png and the weights in
                                                  # notebooks/data/induction/weights.safetensors
    python examples/induction_heads.py --steps 300   # a shorter run

The task and the model are :mod:`attention_ref.documents.induction`: rows of 24 tokens (a
vocabulary of 32), each a block of 4 to 10 distinct random tokens repeated to the end; token
and position embeddings, attention layers of 2 heads of width 16 on a residual stream of
width 32, an unembedding; Adam on 32 rows a step. Both models train with the same seed and
settings; only the number of layers differs. On 256 fixed evaluation rows the script measures:

* each head's induction score (the weight from a repeated token on the token after its earlier
  copies) and previous-token score (:mod:`attention_ref.documents.head_scores`);
* the loss on the positions whose next token is a repeat (ln 32 = 3.47 for a guess);
* the circuit: each layer-0 head of the two-layer model ablated in turn (its output multiplied
  by 0), and the induction scores of layer 1 and the loss measured again.

Progress goes to stderr; the results are printed, and written with ``--write``.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's package

from attention_ref._atomic import atomic_path, write_atomic  # noqa: E402
from attention_ref.documents import induction as ind  # noqa: E402
from attention_ref.documents.head_scores import induction_scores, previous_token_scores  # noqa: E402

RESULTS = ROOT / "docs" / "induction_heads.json"
FIGURE = ROOT / "docs" / "figures" / "induction_heads.png"
WEIGHTS = ROOT / "notebooks" / "data" / "induction" / "weights.safetensors"
EVAL_SEED = 2022  # the 256 evaluation rows (not the training stream)
HEADS = 2
_FIRST = 11  # positions 0..max_period: every later token has an earlier copy among them


def evaluation_rows():
    """The fixed evaluation batch: ``(ids, periods)``, 256 rows."""
    return ind.repeated_sequences(np.random.default_rng(EVAL_SEED), 256)


def measure(params, ids, periods, head_masks=None) -> dict:
    """Scores per layer and head and the loss on repeated positions, for one model (and ablation)."""
    logits, cache = ind.attention_only_forward(ids, params, HEADS, head_masks)
    return {"induction": [induction_scores(w, ids).tolist() for w in cache.weights],
            "previous_token": [previous_token_scores(w).tolist() for w in cache.weights],
            # over the first block's queries only (t <= max_period): the keys an induction head needs
            "previous_token_first_block": [previous_token_scores(w[..., :_FIRST, :_FIRST]).tolist()
                                           for w in cache.weights],
            "repeat_loss": ind.predictable_loss(logits, ids, periods)}


def circuit(params, ids, periods) -> dict:
    """The two-layer model with each layer-0 head ablated in turn (and nothing ablated)."""
    out = {"none": measure(params, ids, periods)}
    for head in range(HEADS):
        mask = np.ones(HEADS)
        mask[head] = 0.0
        out[f"layer 0 head {head}"] = measure(params, ids, periods, [mask, None])
    return out


def _progress(label):
    start = time.perf_counter()

    def show(step, steps, loss):
        done = int(30 * step / steps)
        sys.stderr.write(f"\r{label}: step {step:>5}/{steps} [{'#' * done}{'.' * (30 - done)}] loss {loss:.3f}"
                         f"  {time.perf_counter() - start:4.0f} s")
        sys.stderr.flush()
        if step == steps:
            sys.stderr.write("\n")
    return show


def run(steps=1000, eval_every=50, show_progress=True) -> tuple:
    """Train both models; returns ``(result, weights)``: the numbers (JSON-ready) and both models' params."""
    ids, periods = evaluation_rows()
    result = {"settings": {"steps": steps, "eval_every": eval_every, "batch_size": 32, "lr": 3e-3, "d_model": 32,
                           "num_heads": HEADS, "vocab_size": 32, "length": 24, "min_period": 4, "max_period": 10,
                           "seed": 0, "eval_seed": EVAL_SEED, "eval_rows": len(ids)},
              "uniform_loss": float(np.log(32))}
    weights = {}
    for name, layers in (("two_layer", 2), ("one_layer", 1)):
        start = time.perf_counter()
        trained = ind.train_attention_only(layers, steps=steps, eval_every=eval_every,
                                           progress=_progress(f"{layers} layer{'s' * (layers > 1)}")
                                           if show_progress else None)
        result[name] = {"seconds": round(time.perf_counter() - start, 1), "curve": {
            "step": trained.steps.tolist(), "loss": trained.losses.tolist(),
            "best_induction": trained.induction.max(axis=(1, 2)).tolist()}, **measure(trained.params, ids, periods)}
        weights.update({f"{name}.{k}": v for k, v in trained.params.items()})
    two = {k[len("two_layer."):]: v for k, v in weights.items() if k.startswith("two_layer.")}
    result["ablation"] = circuit(two, ids, periods)
    result.update({"python": platform.python_version(), "numpy": np.__version__, "date": time.strftime("%Y-%m-%d")})
    return result, weights


def summary(result) -> list:
    """The lines the script prints."""
    two, one = result["two_layer"], result["one_layer"]
    lines = [f"loss on repeated tokens: two layers {two['repeat_loss']:.3f}, one layer {one['repeat_loss']:.3f}"
             f" (a guess: ln 32 = {result['uniform_loss']:.3f})"]
    for name, r in (("two layers", two), ("one layer", one)):
        for layer, (ind_s, prev_s) in enumerate(zip(r["induction"], r["previous_token"])):
            lines.append(f"{name}, layer {layer}: induction score per head {_fmt(ind_s)};"
                         f" previous-token score {_fmt(prev_s)}, over the first {_FIRST} positions"
                         f" {_fmt(r['previous_token_first_block'][layer])}")
    for ablated, r in result["ablation"].items():
        lines.append(f"ablated {ablated:>14}: layer-1 induction scores {_fmt(r['induction'][1])},"
                     f" loss on repeated tokens {r['repeat_loss']:.3f}")
    return lines


def _fmt(values) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--write", action="store_true",
                        help="rewrite docs/induction_heads.json, its figure and the committed weights")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be a positive integer, got {args.steps}")
    result, weights = run(args.steps)
    for line in summary(result):
        print(line)
    if args.write:
        from attention_ref.interop import write_safetensors
        from attention_ref.plot.heads import plot_induction

        write_atomic(RESULTS, json.dumps(result, indent=1) + "\n")
        WEIGHTS.parent.mkdir(parents=True, exist_ok=True)
        write_safetensors(weights, WEIGHTS, metadata={"written_by": "python examples/induction_heads.py --write"})
        ids, _ = evaluation_rows()
        fig = plot_induction(result, load_weights(), ids[0])
        with atomic_path(FIGURE) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
        print(f"wrote {RESULTS}, {WEIGHTS} and {FIGURE}")
    return result


def load_weights(path=WEIGHTS) -> dict:
    """``{"two_layer": params, "one_layer": params}`` from the committed weights."""
    from attention_ref.interop import read_safetensors

    state = read_safetensors(path)
    return {name: {k[len(name) + 1:]: v for k, v in state.items() if k.startswith(name + ".")}
            for name in ("two_layer", "one_layer")}


if __name__ == "__main__":
    main()
