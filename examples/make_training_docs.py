"""Generate the numbers of docs/training.md from code, so none of them is typed by hand.

    python examples/make_training_docs.py --write     # about a minute: retrain everything
    python examples/make_training_docs.py --render    # rewrite the text from the JSON only
    python examples/make_training_docs.py             # check the text matches the JSON

``--write`` trains both toy models for the seeds 0..9 at the full length (20 epochs) and
at the shortened length the tests use (8 epochs), stores the results in
``docs/training_results.json`` and rewrites the generated blocks of ``docs/training.md``
(the text between ``<!-- begin generated: NAME -->`` and ``<!-- end generated: NAME -->``)
from them. Without ``--write`` it only checks that the document matches the JSON.

``tests/documents/test_toy_task.py`` keeps both honest cheaply: it checks that every generated
block of the document equals :func:`render_blocks` of the committed JSON, recomputes the
parameter count, and retrains ONE seed (seed 0, 20 epochs, a few seconds) and compares it
with the JSON to within 1e-9; the other nineteen runs are trusted to the same code.
"""
from __future__ import annotations

import argparse
import inspect
import json
import pathlib
import re
import sys
import textwrap

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's package
sys.path.insert(0, str(ROOT / "examples"))

from train_two_heads import final_line, run, summary_lines  # noqa: E402

from attention_ref._atomic import write_atomic  # noqa: E402
from attention_ref.documents.toy_task import init_toy_model, train_toy_model  # noqa: E402

DOC = ROOT / "docs" / "training.md"
RESULTS = ROOT / "docs" / "training_results.json"
NUM_SEEDS = 10
SHORT_EPOCHS = 8  # the shortened run of tests/documents/test_toy_task.py
_BLOCK = re.compile(r"<!-- begin generated: (\w+) -->\n(.*?)<!-- end generated: \1 -->", re.S)


def defaults() -> dict:
    """The training settings: the defaults of :func:`attention_ref.documents.toy_task.train_toy_model`."""
    sig = inspect.signature(train_toy_model).parameters
    return {k: sig[k].default for k in ("epochs", "steps_per_epoch", "batch_size", "d_model", "d_ff",
                                        "lr", "eval_size", "n_positions")}


def parameter_count() -> int:
    """Parameters of the toy model; the same for one and two heads (raises otherwise)."""
    d = defaults()
    counts = {h: sum(v.size for v in init_toy_model(d["d_model"], h, d["d_ff"]).values()) for h in (1, 2)}
    if counts[1] != counts[2]:
        raise AssertionError(f"the two models differ in size: {counts}")
    return counts[1]


def demo(seed=0, epochs=None) -> dict:
    """The script's run for one seed, as plain JSON-able numbers."""
    r = run(seed, defaults()["epochs"] if epochs is None else epochs, verbose=False)
    return {"seed": seed, "single": r["single"], "multi": r["multi"], "pruning": r["pruning"].tolist(),
            "on_targets": {k: v.tolist() for k, v in r["on_targets"].items()},
            "single_losses": r["single_losses"].tolist(), "multi_losses": r["multi_losses"].tolist()}


def compute_results() -> dict:
    """Everything the document shows (the slow part: 2 x 2 x NUM_SEEDS trainings)."""
    full = [demo(seed) for seed in range(NUM_SEEDS)]  # one independent experiment per seed
    short = [demo(seed, SHORT_EPOCHS) for seed in range(NUM_SEEDS)]
    return {"settings": defaults(), "parameter_count": parameter_count(), "demo": full[0],
            "seed_study": {str(defaults()["epochs"]): [[r["single"], r["multi"]] for r in full],
                           str(SHORT_EPOCHS): [[r["single"], r["multi"]] for r in short]}}


def _prose(text: str) -> str:
    """Re-wrap each paragraph of ``text`` to 88 columns (the blocks are Markdown prose)."""
    paragraphs = [" ".join(p.split()) for p in text.strip().split("\n\n")]
    return "\n\n".join(textwrap.fill(p, 88, break_long_words=False, break_on_hyphens=False)
                       for p in paragraphs) + "\n"


def _count(k: int, n: int) -> str:
    return f"{k} of {n}"


def render_blocks(results: dict) -> dict:
    """The generated blocks of docs/training.md, by name, from ``results`` (the JSON)."""
    s, d = results["settings"], results["demo"]
    n = s["n_positions"]
    blocks = {}
    blocks["model"] = _prose(
        f"The model embeds the tokens (`x W_e + b_e`, d_model = {s['d_model']}), puts a learned summary"
        f" token\nin front, runs one post-norm encoder block (d_ff = {s['d_ff']}, ReLU) and reads the two"
        f"\npredictions off the summary token with a linear layer. Loss: mean squared error.\nBoth models"
        f" have the same widths, so **the same {results['parameter_count']:,} parameters**; the one-head"
        f" model\nhas one head with d_k = {s['d_model']}, the two-head model two heads with"
        f" d_k = {s['d_model'] // 2}. No one-head\nmodel of this shape can get below about"
        f" `(1 - 1/N) / 2 = {(1 - 1 / n) / 2:.4f}` (N = {n}; the\nargument follows).\n")
    blocks["settings"] = _prose(
        f"Training: Adam, learning rate {s['lr']}, {s['steps_per_epoch']} steps of {s['batch_size']}"
        f" fresh examples per epoch, {s['epochs']} epochs\n(the defaults of `train_toy_model` and of"
        f" the script); the final loss is measured on\n{s['eval_size']:,} held-out examples (the same"
        f" for both models). Everything is deterministic for a given `--seed`.\n")
    lines = ["```", "python examples/train_two_heads.py --plots docs", "..."]
    lines += summary_lines(d["on_targets"], d["pruning"])[1:]
    lines += ["", "saved docs/training_loss.png and docs/training_attention.png",
              final_line(d["single"], d["multi"]), "```"]
    blocks["demo"] = "\n".join(lines) + "\n"
    multi, single = np.array(d["multi_losses"]), np.array(d["single_losses"])
    apart = int(np.argmax(multi < 0.1 * single)) + 1  # first epoch (1-based) under a tenth
    full, without0, without1 = d["pruning"]
    blocks["curves"] = _prose(
        f"The one-head model stalls near the bound (last epoch's training loss {single[-1]:.4f});"
        f" the\ntwo-head model's training loss falls under a tenth of the one-head model's in epoch"
        f" {apart},\nonce its heads specialise, and ends {multi[0] / multi[-1]:.0f} times lower than in"
        f" its first epoch ({multi[0]:.4f} to {multi[-1]:.4f}).\n")
    other = [row[1 - int(np.argmax(row))] for row in d["on_targets"]["multi-head"]]
    target = {0: "largest `a`", 1: "largest `b`"}
    single_looks = target[int(np.argmax(d["on_targets"]["single-head"][0]))]
    found = [target[int(np.argmax(row))] for row in d["on_targets"]["multi-head"]]
    blocks["heads"] = _prose(
        f"The single head attends to the {single_looks} token only; of the two heads, head 0\nfound"
        f" the {found[0]} and head 1 the {found[1]}. (The weight of {min(other):.3f} to {max(other):.3f} on the \"other\" answer token is mostly the"
        f" 1/{n} of examples where\nthe two are the same token.)\n\n**Head pruning.** Masking out"
        f" either head (its output multiplied by 0 before `W^O`)\nraises the two-head model's loss"
        f" from {full:.4f} to {without0:.4f} and {without1:.4f}, worse even\nthan predicting 0"
        f" everywhere (loss about 1): here each head is indispensable, whereas document 000\nreports"
        f" that in large trained models many heads can be pruned cheaply.\n")
    study = []
    for epochs, rows in results["seed_study"].items():
        rows = np.array(rows)  # (seeds, 2): one head, two heads
        wins = int(np.sum(rows[:, 1] < 0.5 * rows[:, 0]))
        ratio = rows[:, 0] / rows[:, 1]
        study.append((epochs, rows, wins, ratio))
    epochs, rows, wins, ratio = study[0]
    seeds = range(len(rows))
    table = ["| seed | " + " | ".join(str(i) for i in seeds) + " |",
             "|---|" + "---|" * len(rows),
             "| one head | " + " | ".join(f"{v:.4f}" for v in rows[:, 0]) + " |",
             "| two heads | " + " | ".join(f"{v:.4f}" for v in rows[:, 1]) + " |"]
    intro = (f"`python examples/train_two_heads.py --seed-study {len(rows)}` trains both models for seeds"
             f" 0-{len(rows) - 1}\n(default settings, {epochs} epochs):")
    summary = (f"**The two-head model ends with less than half the one-head loss for"
               f" {_count(wins, len(rows))} seeds**\n(its loss is {ratio.min():.0f} to {ratio.max():.0f}"
               f" times lower).")
    for epochs, rows, wins, ratio in study[1:]:
        summary += (f" With the shortened run the tests use ({epochs} epochs,\n`--epochs {epochs}"
                    f" --seed-study {len(rows)}`) it holds for {_count(wins, len(rows))} seeds, the"
                    f" two-head losses\nbeing {rows[:, 1].min():.4f} to {rows[:, 1].max():.4f} against"
                    f" {rows[:, 0].min():.4f} to {rows[:, 0].max():.4f}.")
    blocks["seeds"] = "\n\n".join([_prose(intro).rstrip(), "\n".join(table), _prose(summary)])
    return blocks


def doc_blocks(text: str) -> dict:
    """The generated blocks found in the document's ``text``, by name."""
    return {m.group(1): m.group(2) for m in _BLOCK.finditer(text)}


def write_doc(text: str, blocks: dict) -> str:
    """``text`` with every generated block replaced by ``blocks[name]``."""
    missing = set(blocks) - set(doc_blocks(text))
    if missing:
        raise ValueError(f"docs/training.md has no generated block named {sorted(missing)}")
    return _BLOCK.sub(lambda m: f"<!-- begin generated: {m.group(1)} -->\n{blocks[m.group(1)]}"
                                f"<!-- end generated: {m.group(1)} -->", text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true",
                        help="retrain, then rewrite docs/training_results.json, docs/training.md and the figures")
    parser.add_argument("--render", action="store_true",
                        help="rewrite docs/training.md from the committed JSON (no training)")
    args = parser.parse_args(argv)
    if args.write:
        results = compute_results()
        write_atomic(RESULTS, json.dumps(results, indent=1) + "\n")
        run(0, results["settings"]["epochs"], plots=ROOT / "docs", verbose=False)
    results = json.loads(RESULTS.read_text())
    text = DOC.read_text()
    new = write_doc(text, render_blocks(results))
    if args.write or args.render:
        write_atomic(DOC, new)
        print(f"wrote {DOC.relative_to(ROOT)}")
    elif new != text:
        print("docs/training.md does not match docs/training_results.json: run with --write")
        return 1
    else:
        print("docs/training.md matches docs/training_results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
