"""Train a one-head and a two-head Transformer encoder on a task only two heads can solve.

Each example is a sequence of 8 tokens with features (a, b, value); the model must output
the value at the token with the largest a AND the value at the token with the largest b
(see attention_ref/documents/toy_task.py). Both models have the same widths and so exactly the same
number of parameters; they differ only in how d_model is split into heads. Everything is
trained with Adam on the hand-derived gradients, deterministically for a given --seed.

    python examples/train_two_heads.py                      # about 5-10 s on a laptop CPU
    python examples/train_two_heads.py --plots docs         # also save the two figures
    python examples/train_two_heads.py --seed-study 10      # first, seeds 0..9 side by side

The last line printed is always
    single-head final loss: X  multi-head final loss: Y
(mean squared error on 1024 held-out examples; predicting 0 everywhere scores about 1).
"""
from __future__ import annotations

import argparse
import inspect
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # this checkout's package

from attention_ref.documents.toy_task import (  # noqa: E402
    attention_on_targets,
    head_pruning_losses,
    make_batch,
    summary_attention,
    train_toy_model,
)

N_POSITIONS = 8
_DEFAULTS = inspect.signature(train_toy_model).parameters  # one set of defaults for both
EPOCHS, STEPS = _DEFAULTS["epochs"].default, _DEFAULTS["steps_per_epoch"].default


def run(seed=0, epochs=EPOCHS, steps_per_epoch=STEPS, plots=None, verbose=True):
    """Train both models; return a dict of results (the numbers the script prints)."""
    say = print if verbose else (lambda *a, **k: None)
    results = {}
    for label, heads in (("single-head", 1), ("multi-head", 2)):
        def progress(epoch, loss, label=label):
            say(f"{label:>11}  epoch {epoch + 1:3d}/{epochs}  training loss {loss:.4f}")
        results[label] = train_toy_model(heads, seed=seed, epochs=epochs,
                                         steps_per_epoch=steps_per_epoch,
                                         n_positions=N_POSITIONS, progress=progress)
    single, multi = results["single-head"], results["multi-head"]
    x, t = make_batch(np.random.default_rng([seed, 3]), 512, N_POSITIONS)
    pruning = head_pruning_losses(multi.params, 2, x, t)
    on_targets = {"single-head": attention_on_targets(single.params, 1, x),
                  "multi-head": attention_on_targets(multi.params, 2, x)}
    for line in summary_lines(on_targets, pruning):
        say(line)
    if plots is not None:
        from attention_ref._atomic import atomic_path
        from attention_ref.plot.training import plot_attention_maps, plot_loss_curves

        out = pathlib.Path(plots)
        out.mkdir(parents=True, exist_ok=True)
        fig = plot_loss_curves({"1 head (d_k = 16)": single.losses, "2 heads (d_k = 8)": multi.losses})
        with atomic_path(out / "training_loss.png") as tmp:
            fig.savefig(tmp, dpi=120)
        shown = x[:12]
        w1, w2 = summary_attention(single.params, 1, shown), summary_attention(multi.params, 2, shown)
        fig = plot_attention_maps({"1 head": w1[:, 0], "2 heads: head 0": w2[:, 0],
                                   "2 heads: head 1": w2[:, 1]}, shown)
        with atomic_path(out / "training_attention.png") as tmp:
            fig.savefig(tmp, dpi=120, bbox_inches="tight")
        say(f"\nsaved {out / 'training_loss.png'} and {out / 'training_attention.png'}")
    return {"single": single.final_loss, "multi": multi.final_loss, "pruning": pruning,
            "on_targets": on_targets, "single_losses": single.losses, "multi_losses": multi.losses}


def summary_lines(on_targets, pruning):
    """The lines ``run`` prints after training (docs/training.md shows them too)."""
    lines = ["", "attention of the summary token on the two answer tokens (mean weight):"]
    for label, share in on_targets.items():
        for h, (on_a, on_b) in enumerate(share):
            lines.append(f"  {label} head {h}: on largest-a token {on_a:.3f}, on largest-b token {on_b:.3f}")
    lines += ["", "head pruning (document 000): multi-head loss with all heads"
              f" {pruning[0]:.4f}, head 0 masked {pruning[1]:.4f}, head 1 masked {pruning[2]:.4f}"]
    return lines


def final_line(single, multi):
    """The last line the script prints."""
    return f"single-head final loss: {single:.4f}  multi-head final loss: {multi:.4f}"


def seed_study(num_seeds, epochs, steps_per_epoch):
    """Train both models for seeds 0..num_seeds-1; print one line per seed and the count."""
    wins = 0
    for seed in range(num_seeds):  # one independent experiment per seed
        r = run(seed, epochs, steps_per_epoch, verbose=False)
        win = r["multi"] < 0.5 * r["single"]
        wins += win
        print(f"seed {seed}: single-head {r['single']:.4f}  multi-head {r['multi']:.4f}"
              f"  multi < half single: {'yes' if win else 'no'}")
    print(f"multi-head loss under half the single-head loss for {wins} of {num_seeds} seeds\n")
    return wins


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of data and weights (default 0)")
    parser.add_argument("--epochs", type=int, default=EPOCHS, help=f"epochs (default {EPOCHS})")
    parser.add_argument("--steps-per-epoch", type=int, default=STEPS,
                        help=f"Adam steps per epoch (default {STEPS})")
    parser.add_argument("--plots", metavar="DIR", help="save training_loss.png and training_attention.png here")
    parser.add_argument("--seed-study", type=int, default=0, metavar="K",
                        help="first train both models for seeds 0..K-1 and report how often two heads win")
    args = parser.parse_args(argv)
    if args.seed_study:
        seed_study(args.seed_study, args.epochs, args.steps_per_epoch)
    r = run(args.seed, args.epochs, args.steps_per_epoch, args.plots)
    print(final_line(r["single"], r["multi"]))
    return r


if __name__ == "__main__":
    main()
