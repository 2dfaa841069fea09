"""``python -m attention_ref exercise list | start NAME [PATH] | hint NAME [N] | check PATH``."""
from __future__ import annotations

import argparse
import errno
import importlib.util
import json
import os
import re
import sys
import textwrap
from pathlib import Path

from .._atomic import write_atomic
from .bugs import BUGS
from .catalogue import EXERCISES
from .checker import TIME_LIMIT, _check_here, _ended, check, hint
from .process import MEMORY_LIMIT, ChildEnded, _can_fork, _in_child, _OutOfTime, _stopped, _student_code, _tell

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
    extra = "".join(f"\n{text[name]}\n" for text in (_BROADCAST, _EXTRA) if name in text)
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


_RULE = ("The broadcast rule: an input broadcast along an axis of the output (an axis it lacks, or has"
         " of size 1) gets its gradient summed over that axis, back to its own shape: ")
#: the broadcast rule, said where an input may be broadcast (docs/exercises.md: the cases)
_BROADCAST = {name: textwrap.fill(_RULE + what, WIDTH - 4) for name, what in {
    "linear_backward": "W and b are shared by every row, so dW and db sum over every leading axis of x.",
    "layer_norm_backward": "gamma and beta are shared by every row, so dgamma and dbeta sum over every"
                           " leading axis.",
    "scaled_dot_product_attention_backward": "q and k, v may have different batch axes (k, v of size 1, or"
                                             " without batch axes, on any of the batch axes; or q so), and the"
                                             " mask may be (n_k,), (1, n_k), (n_q, n_k) or have batch axes; a"
                                             " query whose row the mask blocks entirely gets zero weights,"
                                             " output and gradients.",
    "flash_attention_backward": "k, v may have batch axes of size 1 or none where q has them, and the mask"
                                " may be (n_k,), (1, n_k), (n_q, n_k) or have batch axes; a query that may"
                                " attend no key gets zero weights, output and gradients.",
    "multi_head_attention_backward": "the key and value (or the query) may have batch axes of size 1 or"
                                     " none where the other has them, the weights and biases are shared by"
                                     " every position, and the mask may be (n_k,), (1, n_k), (n_q, n_k) or"
                                     " have batch axes; a query that may attend no key gets zero weights,"
                                     " output and gradients.",
    "encoder_block_backward": "every parameter is shared by every position and batch item, and the mask may"
                              " broadcast; a query that may attend no key gets a zero attention output.",
}.items()}

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
    try:
        if path.is_dir():
            print(f"{_shown(path)} is a folder; give a file's path (e.g. {_shown(path / 'name.py')})",
                  file=sys.stderr)
            return 2
        if path.exists() and not force:
            print(f"{_shown(path)} exists; pass --force to overwrite it", file=sys.stderr)
            return 2
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text(path.as_posix()))
    except OSError as exc:
        print(f"cannot write {_shown(path)}: {_why(exc, path)}", file=sys.stderr)
        return 2
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
    result, bug = _check_file(args, None, bug=True)
    bug = BUGS[bug]
    if result.ok:
        print(textwrap.fill(f"FIXED: {bug.name}, {result.diagnosis}", WIDTH, subsequent_indent="  "))
        print(textwrap.fill(f"the bug was: {bug.sentence}", WIDTH, subsequent_indent="  "))
        return 0
    print(f"NOT FIXED YET: {bug.name}")
    print(result)
    return 1


def _state_file() -> Path:
    """Where the CLI remembers the hints read (``check``'s "next:" suggests the next unread one):
    ``$ATTENTION_REF_STATE_DIR/hints.json``, else ``$XDG_CACHE_HOME/attention_ref/hints.json``,
    else ``~/.cache/attention_ref/hints.json``."""
    base = os.environ.get("ATTENTION_REF_STATE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        cache = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"  # XDG: absolute only
        base = cache / "attention_ref"
    return Path(base) / "hints.json"


def _parse_state(text) -> dict:
    """``{"exercise": [hint numbers]}`` from the state file's text; ValueError naming the field
    when it is anything else."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"expected an object, got {type(data).__name__}")
    read = {}
    for name, numbers in data.items():
        if not isinstance(numbers, list) or not all(type(n) is int for n in numbers):
            raise ValueError(f"field {name!r}: expected a list of hint numbers")
        read[name] = set(numbers)
    return read


def _hints_read() -> dict:
    """The hints read, from the state file; a file that is not a state is moved aside (to
    ``hints.json.bad``) with a one-line note, and the hints start afresh."""
    path = _state_file()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, FileNotFoundError):
            return {}
        text = None
        why = f"cannot be read ({type(exc).__name__})"
    if text is not None:
        try:
            return _parse_state(text)
        except ValueError as exc:  # JSONDecodeError is one
            why = f"is not a hint state ({str(exc).splitlines()[0][:60]})"
    aside = path.with_name(path.name + ".bad")
    try:
        os.replace(path, aside)
        moved = f"moved to {aside.name}"
    except OSError:
        moved = "left where it is"
    print(f"note: {path} {why}; {moved}, starting afresh", file=sys.stderr)
    return {}


def _remember_hint(name: str, number: int) -> None:
    """Add a hint to the state file (written atomically: a temporary file beside it, renamed)."""
    read = _hints_read()
    read.setdefault(name, set()).add(number)
    path = _state_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({k: sorted(v) for k, v in read.items()}))
    except OSError:  # a read-only home: "next:" falls back to hint 1 (write_atomic removes its temporary)
        pass


def _fail(text):
    """End the command with exit status 1 and ``text`` on stderr, wrapped to 80 columns."""
    raise SystemExit(textwrap.fill(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False))


def _shown(path) -> str:
    """A path for a one-line message: a long one shortened in the middle."""
    text = str(path)
    return text if len(text) <= 60 else f"{text[:28]}...{text[-28:]}"


def _why(exc, path) -> str:
    """An OSError in a few words; a name too long says how long it is."""
    if exc.errno == errno.ENAMETOOLONG:
        longest = max((len(os.fsencode(part)) for part in Path(path).parts), default=0)
        return f"a name in it is {longest} bytes long, more than this file system allows"
    return exc.strerror or type(exc).__name__


def _existing(path) -> str:
    """``path`` made absolute, or the command ends with a one-line error when it is no file."""
    try:
        is_file = Path(path).is_file()
        near = not is_file and Path(f"{path}.py").is_file()
    except OSError as exc:  # a name too long, a folder that cannot be read
        raise SystemExit(f"cannot read {_shown(path)}: {_why(exc, path)}") from None
    if not is_file:
        if Path(path).is_dir():
            raise SystemExit(f"{_shown(path)} is a folder; give the file to check")
        if near:
            raise SystemExit(f"{path}: no such file; did you mean {path}.py?")
        start = f"python -m attention_ref exercise start {path}" if path in EXERCISES else \
            "python -m attention_ref exercise start <exercise> [PATH]"
        raise SystemExit(f"{path}: no such file (write one with: {start})")
    return os.path.abspath(path)


def _load(path, with_module=False, time_limit=TIME_LIMIT, shown=None):
    """The exercise name, the attempt and the optional forward defined in ``path`` (and the
    module itself when ``with_module``); a file that exits, is interrupted or loops forever
    while it is imported ends the command with a non-zero status that says so (``shown``: the
    path as the user gave it, for the messages)."""
    path = _existing(path)
    shown = path if shown is None else shown
    spec = importlib.util.spec_from_file_location("attempt", path)
    if spec is None:
        raise SystemExit(f"cannot import {shown}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        with _student_code(time_limit, ("file", " while it was imported")):
            spec.loader.exec_module(module)
    except _OutOfTime:
        _fail(f"{shown} did not finish importing within {time_limit:g} s (an endless loop at the top level?)")
    except (SystemExit, KeyboardInterrupt) as exc:
        _fail(f"{shown}: " + _stopped("file", exc, " while it was imported"))
    except Exception as exc:  # noqa: BLE001  (a student's file may fail to import in any way)
        line = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) else ""
        _fail(f"{shown} does not run{line}: {type(exc).__name__}: {str(exc)[:200]}")
    name = getattr(module, "EXERCISE", None)
    if not isinstance(name, str) or name not in EXERCISES:
        _fail(f"{shown} must set EXERCISE to an exercise's name (python -m attention_ref exercise list)")
    attempt = getattr(module, name, None)
    if not callable(attempt):
        _fail(f"{shown} must define a function named {name}")
    forward = module.__dict__.get(EXERCISES[name].forward_name)
    own_forward = forward if forward is not None and getattr(forward, "__module__", None) == "attempt" else None
    return (name, attempt, own_forward, module) if with_module else (name, attempt, own_forward)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the command, then what is wrong, then where to look."""

    def error(self, message):
        named = re.match(r"argument ([^:]+): (.*)", message)  # our own messages name the argument
        if named and named.group(2).startswith((named.group(1), "no ", "the hint number")):
            message = named.group(2)
        sys.stderr.write(f"{self.prog.replace('python -m attention_ref ', '')}: {message}\n")
        raise SystemExit(2)


def _whole(text, least, what):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{what} must be >= {least}, got {value}")
    return value


def _seed(text):
    return _whole(text, 0, "--seed")


def _hint_number(text):
    return _whole(text, 1, "the hint number")


def _positive_number(option, unit):
    """An argparse type: a finite number > 0 (``option`` and ``unit`` name it in the error)."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"{option} must be a number of {unit} > 0, got {text!r}")
        return value
    return parse


def _exercise_name(text):
    if text not in EXERCISES:
        raise argparse.ArgumentTypeError(f"no exercise {text!r} (python -m attention_ref exercise list)")
    return text


def _bug_name(text):
    if text not in BUGS:
        raise argparse.ArgumentTypeError(f"no bug {text!r} (python -m attention_ref exercise bug list)")
    return text


def main(argv=None) -> int:
    parser = _Parser(prog="python -m attention_ref exercise",
                     description="Derive a backward by hand; the checker names the mistake.")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the exercises")
    names = "an exercise's name (exercise list shows them)"
    start = sub.add_parser("start", help="write a skeleton file to fill in")
    start.add_argument("name", type=_exercise_name, metavar="NAME", help=names)
    start.add_argument("path", nargs="?", help="where to write it (default: NAME.py here)")
    start.add_argument("--force", action="store_true", help="overwrite an existing file")
    hints = sub.add_parser("hint", help="show one hint (each says more than the last)")
    hints.add_argument("name", type=_exercise_name, metavar="NAME", help=names)
    hints.add_argument("number", nargs="?", type=_hint_number, default=1)
    limit = dict(type=_positive_number("--time-limit", "seconds"), default=TIME_LIMIT, metavar="SECONDS",
                 help=f"time the code may take on one case (default {TIME_LIMIT:g})")
    memory = dict(type=_positive_number("--memory-limit", "MiB"), default=MEMORY_LIMIT, metavar="MIB",
                  help=f"memory the code may add, in MiB (Linux; default {MEMORY_LIMIT})")
    seed = dict(type=_seed, default=0, help="seed of the inputs (default 0)")
    run = sub.add_parser("check", help="check the backward in a file written by start")
    run.add_argument("path")
    run.add_argument("--seed", **seed)
    run.add_argument("--time-limit", **limit)
    run.add_argument("--memory-limit", **memory)
    bug = sub.add_parser("bug", help="spot the bug: a backward with one mistake to find and fix")
    bug_sub = bug.add_subparsers(dest="bug_action", required=True)
    bug_sub.add_parser("list", help="the buggy backwards")
    bug_start = bug_sub.add_parser("start", help="write one to a file")
    bug_start.add_argument("name", type=_bug_name, metavar="NAME", help="a bug's name (bug list shows them)")
    bug_start.add_argument("path", nargs="?", help="where to write it (default: bug_NAME.py here)")
    bug_start.add_argument("--force", action="store_true", help="overwrite an existing file")
    bug_check = bug_sub.add_parser("check", help="check a fixed file")
    bug_check.add_argument("path")
    bug_check.add_argument("--seed", **seed)
    bug_check.add_argument("--time-limit", **limit)
    bug_check.add_argument("--memory-limit", **memory)
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
    result, _ = _check_file(args, _hints_read())
    print(result)
    return 0 if result.ok else 1


def _check_file(args, hints, bug=False):
    """(the CheckResult, the bug's name or None) for the file at ``args.path``: imported and
    checked in a child process where there is fork (see :func:`.process._in_child`)."""
    path = _existing(args.path)

    def work():
        name, attempt, forward, module = _load(path, with_module=True, time_limit=args.time_limit, shown=args.path)
        _tell("note", "exercise", name)
        found = getattr(module, "BUG", None)
        if bug and not (isinstance(found, str) and found in BUGS):
            _fail(f"{args.path} must set BUG to a bug's name (bug list shows them; bug start writes it)")
        hints_read = None if bug else hints.get(name, set())
        return _check_here(EXERCISES[name], attempt, forward, args.seed, hints_read, args.time_limit), \
            (found if bug else None)

    if not _can_fork():
        return work()
    done = _in_child(work, args.memory_limit)
    if not isinstance(done, ChildEnded):
        return done
    if "exercise" not in done.notes:  # while the file was imported
        if done.why == "time":
            _fail(f"{args.path} did not finish importing within {args.time_limit:g} s ({done.how}; an endless"
                  " loop at the top level?)")
        _fail(f"{args.path} ended the process it was imported in: {done.how}")
    name = done.notes["exercise"]
    return _ended(EXERCISES[name], done, None if bug else hints.get(name, set())), None
