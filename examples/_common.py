"""Shared by the example scripts: the ``--plots DIR`` option and saving figures."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout


def parse(description: str, argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--plots", metavar="DIR", help="write this example's figures (PNG) into DIR")
    return parser.parse_args(argv)


def save(args, names) -> None:
    """Save the figures ``names`` (keys of attention_ref.plot.FIGURES) when --plots is given."""
    if args.plots:
        from attention_ref import plot
        for path in plot.save_all(args.plots, names):
            print(f"wrote {path}")
