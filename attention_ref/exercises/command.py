"""``python -m attention_ref exercise list | start NAME [PATH] | hint NAME [N] | check PATH``."""
from __future__ import annotations

import argparse
import importlib.util
import sys
import textwrap
from pathlib import Path

from .catalogue import EXERCISES
from .checker import check, hint

__all__ = ["main", "skeleton"]

WIDTH = 80


def skeleton(name: str, path: str) -> str:
    """The file ``exercise start`` writes: the formula, the forward given, the backward to write."""
    e = EXERCISES[name]
    forward = getattr(sys.modules["attention_ref"], e.forward_name)
    module = forward.__module__  # e.g. attention_ref.core.softmax
    formula = "\n".join(textwrap.fill(p, WIDTH - 4) for p in e.formula.split("\n"))
    args = e.signature.split("(", 1)[1].split(")", 1)[0]
    returns = e.signature.split("->", 1)[1].strip()
    return f'''"""Exercise: {name}

{formula}

The forward is given: {e.forward_name}
(read it with: python -m pydoc {module}).
Check your backward with
python -m attention_ref exercise check {path}
and ask for hints, one at a time, with
python -m attention_ref exercise hint {name} 1
"""
import numpy as np

# the forward whose backward you write:
from attention_ref import {e.forward_name}  # noqa: F401

EXERCISE = "{name}"


def {name}({args}):
    """Return {returns}."""
    raise NotImplementedError("derive the gradient, then run the check")
'''


def _load(path):
    """The exercise name, the attempt and the optional forward defined in ``path``."""
    if not Path(path).is_file():
        if Path(f"{path}.py").is_file():
            raise SystemExit(f"{path}: no such file; did you mean {path}.py?")
        start = f"python -m attention_ref exercise start {path}" if path in EXERCISES else \
            "python -m attention_ref exercise start <exercise> [PATH]"
        raise SystemExit(f"{path}: no such file (write one with: {start})")
    spec = importlib.util.spec_from_file_location("attempt", path)
    if spec is None:
        raise SystemExit(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001  (a student's file may fail to import in any way)
        line = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) else ""
        raise SystemExit(f"{path} does not run{line}: {type(exc).__name__}: {exc}") from None
    name = getattr(module, "EXERCISE", None)
    if name not in EXERCISES:
        raise SystemExit(f"{path} must set EXERCISE to one of: {', '.join(EXERCISES)}")
    attempt = getattr(module, name, None)
    if attempt is None:
        raise SystemExit(f"{path} must define a function named {name}")
    forward = module.__dict__.get(EXERCISES[name].forward_name)
    own_forward = forward if forward is not None and getattr(forward, "__module__", None) == "attempt" else None
    return name, attempt, own_forward


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attention_ref exercise",
                                     description="Derive a backward by hand; the checker names the mistake.")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the exercises")
    names = "one of: " + ", ".join(EXERCISES)
    start = sub.add_parser("start", help="write a skeleton file to fill in")
    start.add_argument("name", choices=list(EXERCISES), metavar="NAME", help=names)
    start.add_argument("path", nargs="?", help="where to write it (default: NAME.py here)")
    start.add_argument("--force", action="store_true", help="overwrite an existing file")
    hints = sub.add_parser("hint", help="show one hint (each says more than the last)")
    hints.add_argument("name", choices=list(EXERCISES), metavar="NAME", help=names)
    hints.add_argument("number", nargs="?", type=int, default=1)
    run = sub.add_parser("check", help="check the backward in a file written by start")
    run.add_argument("path")
    run.add_argument("--seed", type=int, default=0, help="seed of the inputs (default 0)")
    args = parser.parse_args(argv)

    if args.action == "list":
        for e in EXERCISES.values():
            print(f"{e.name}")
            print(textwrap.fill(e.formula.split("\n")[0], WIDTH, initial_indent="    ", subsequent_indent="    "))
        print("\nstart one: python -m attention_ref exercise start softmax_backward")
        return 0
    if args.action == "start":
        path = Path(args.path or f"{args.name}.py")
        if path.exists() and not args.force:
            print(f"{path} exists; pass --force to overwrite it", file=sys.stderr)
            return 2
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(skeleton(args.name, path.as_posix()))
        print(f"wrote {path}: fill in {args.name}, then run")
        print(f"    python -m attention_ref exercise check {path.as_posix()}")
        return 0
    if args.action == "hint":
        try:
            print(hint(args.name, args.number))
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
        return 0
    name, attempt, forward = _load(args.path)
    result = check(name, attempt, forward=forward, seed=args.seed)
    print(result)
    return 0 if result.ok else 1
