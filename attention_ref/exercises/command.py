"""``python -m attention_ref exercise list | start NAME [PATH] | hint NAME [N] | check PATH``."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path

from .._atomic import write_atomic
from .bugs import BUGS
from .catalogue import EXERCISES
from .checker import check, hint

__all__ = ["main", "skeleton", "bug_file"]

WIDTH = 80


def skeleton(name: str, path: str) -> str:
    """The file ``exercise start`` writes: the formula, every field of the cache with its shape,
    where to read the forward (its docstring only, not the backward's), the backward to write."""
    e = EXERCISES[name]
    formula = "\n".join(textwrap.fill(p, WIDTH - 4) for p in e.formula.split("\n"))
    fields = "\n".join(textwrap.fill(f"{field}: {what}", WIDTH - 4, initial_indent="    ",
                                      subsequent_indent="        ") for field, what in e.cache_fields)
    args = e.signature.split("(", 1)[1].split(")", 1)[0]
    returns = e.signature.split("->", 1)[1].strip()
    extra = f"\n{_EXTRA[name]}\n" if name in _EXTRA else ""
    return f'''"""Exercise: {name}

{formula}

{"What your backward receives (the cache's fields):" if e.cache_fields[0][0] != "(none)" else "No cache:"}
{fields}
{extra}
The forward is given: {e.forward_name}.
Read its docstring (the forward only) with
python -m pydoc attention_ref.{e.forward_name}
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


#: what some skeletons say besides the fields
_EXTRA = {
    "flash_attention_backward": textwrap.fill(
        "Who applies which mask: attention_ref.variants.blockwise._scores(q_blk, k, mask, qs, qe, ks, ke, n_q,"
        " n_k, causal, window) returns one tile's scaled scores with the causal rule, the window and the"
        " caller's mask all applied (-inf where blocked), from q_blk = q[..., qs:qe, :] * scale;"
        " _key_blocks(qs, qe, n_q, n_k, block_size, causal, window) gives the key tiles a query block may"
        " touch. Use both, or apply all three masks yourself: every one of them is checked.", WIDTH - 4),
}


def bug_file(name: str, path: str) -> str:
    """The file ``exercise bug start`` writes: a backward with one bug, to find and fix."""
    bug = BUGS[name]
    story = textwrap.fill(f"{bug.story} One line of {bug.exercise} below is wrong. Find it and fix it; the"
                          " checker confirms the fix and then names the bug:", WIDTH - 4)
    return f'''"""Spot the bug: {name}
Exercise: {bug.exercise}

{story}
python -m attention_ref exercise bug check {path}
(its report also says what it sees while the bug is there; hints:
python -m attention_ref exercise hint {bug.exercise} 1)
"""
import numpy as np

EXERCISE = "{bug.exercise}"
BUG = "{name}"


{bug.source}'''


def _write_new(path: Path, force: bool, text, todo: str, check_command: str) -> int:
    """Write ``text(path)`` to a new file (an existing one only with --force) and say what next."""
    if path.exists() and not force:
        print(f"{path} exists; pass --force to overwrite it", file=sys.stderr)
        return 2
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text(path.as_posix()))
    print(f"wrote {path}")
    print(f"{todo}, then run")
    print(f"    python -m attention_ref exercise {check_command} {path.as_posix()}")
    return 0


def _bug_main(args) -> int:
    if args.bug_action == "list":
        for bug in BUGS.values():
            print(f"{bug.name}  ({bug.exercise})")
            print(textwrap.fill(bug.story, WIDTH, initial_indent="    ", subsequent_indent="    "))
        print("\nstart one: python -m attention_ref exercise bug start softmax-axis")
        return 0
    if args.bug_action == "start":
        return _write_new(Path(args.path or f"bug_{args.name.replace('-', '_')}.py"), args.force,
                          lambda path: bug_file(args.name, path),
                          f"find the bug in {BUGS[args.name].exercise}, fix it", "bug check")
    name, attempt, forward, module = _load(args.path, with_module=True)
    bug = BUGS.get(getattr(module, "BUG", None))
    if bug is None:
        raise SystemExit(f"{args.path} must set BUG to one of: {', '.join(BUGS)} (bug start writes it)")
    result = check(name, attempt, forward=forward)
    if result.ok:
        print(textwrap.fill(f"FIXED: {bug.name}, {result.diagnosis}", WIDTH, subsequent_indent="  "))
        print(textwrap.fill(f"the bug was: {bug.sentence}", WIDTH, subsequent_indent="  "))
        return 0
    print(f"NOT FIXED YET: {bug.name}")
    print(result)
    return 1


def _state_file() -> Path:
    """Where the CLI remembers the hints read (``check``'s "next:" suggests the next unread one):
    ``$ATTENTION_REF_STATE_DIR/hints.json``, by default under ``~/.cache/attention_ref``."""
    base = os.environ.get("ATTENTION_REF_STATE_DIR") or Path.home() / ".cache" / "attention_ref"
    return Path(base) / "hints.json"


def _hints_read() -> dict:
    try:
        return {k: set(v) for k, v in json.loads(_state_file().read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _remember_hint(name: str, number: int) -> None:
    read = _hints_read()
    read.setdefault(name, set()).add(number)
    try:
        _state_file().parent.mkdir(parents=True, exist_ok=True)
        write_atomic(_state_file(), json.dumps({k: sorted(v) for k, v in read.items()}))
    except OSError:  # a read-only home: "next:" falls back to hint 1
        pass


def _load(path, with_module=False):
    """The exercise name, the attempt and the optional forward defined in ``path`` (and the
    module itself when ``with_module``)."""
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
    return (name, attempt, own_forward, module) if with_module else (name, attempt, own_forward)


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
    bug = sub.add_parser("bug", help="spot the bug: a backward with one mistake to find and fix")
    bug_sub = bug.add_subparsers(dest="bug_action", required=True)
    bug_sub.add_parser("list", help="the buggy backwards")
    bug_start = bug_sub.add_parser("start", help="write one to a file")
    bug_start.add_argument("name", choices=list(BUGS), metavar="NAME", help="one of: " + ", ".join(BUGS))
    bug_start.add_argument("path", nargs="?", help="where to write it (default: bug_NAME.py here)")
    bug_start.add_argument("--force", action="store_true", help="overwrite an existing file")
    bug_check = bug_sub.add_parser("check", help="check a fixed file")
    bug_check.add_argument("path")
    args = parser.parse_args(argv)

    if args.action == "bug":
        return _bug_main(args)

    if args.action == "list":
        for e in EXERCISES.values():
            print(f"{e.name}")
            print(textwrap.fill(e.formula.split("\n")[0], WIDTH, initial_indent="    ", subsequent_indent="    "))
        print("\nstart one: python -m attention_ref exercise start softmax_backward")
        return 0
    if args.action == "start":
        return _write_new(Path(args.path or f"{args.name}.py"), args.force, lambda path: skeleton(args.name, path),
                          f"fill in {args.name}", "check")
    if args.action == "hint":
        try:
            print(hint(args.name, args.number))
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
        _remember_hint(args.name, args.number)
        return 0
    name, attempt, forward = _load(args.path)
    result = check(name, attempt, forward=forward, seed=args.seed, hints_read=_hints_read().get(name, set()))
    print(result)
    return 0 if result.ok else 1
