"""One naming rule for checked and trusted variants (issue 37 item 4), read from the source of
core/, fast/, variants/ and nn/:

* a public ``X_forward`` / ``X_backward`` (also ``X_forward_fast`` and a block's ``X_decode_step``)
  is the public edge: it checks its inputs before any arithmetic, i.e. its first call that does
  work is a check (``check_*``, ``as_real_array``, ``as_upstream`` ..., or a private ``_check*``
  helper of its file), or it hands everything to another checked ``X_forward`` / ``X_backward``;
* ``X_formula`` / ``X_backward_formula`` trusts its inputs (a composite calls it on arrays it
  already checked): it calls no check and no checked ``X_forward`` / ``X_backward``;
* a trusted backward is never a private ``_X_backward`` beside a public pair: it is
  ``X_backward_formula``.

A new pair that breaks the rule fails here with its file and name.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import attention_ref

PACKAGE = Path(attention_ref.__file__).resolve().parent
FOLDERS = ("core", "fast", "variants", "nn")
#: calls that check arguments (attention_ref._checks, attention_ref._pair_checks and the files' own)
CHECK_PREFIXES = ("check_", "_check", "_checked", "as_real_array", "as_upstream", "as_gradient", "as_mask",
                  "as_generator", "require_ndim", "check")
CHECKED_SUFFIXES = ("_forward", "_backward", "_forward_fast", "_backward_fast", "_decode_step")
#: calls that do not compute anything: building an error, reading a type or a shape
NEUTRAL = {"isinstance", "type", "len", "TypeError", "ValueError", "tuple", "dict", "list", "set", "getattr",
           "hasattr", "callable", "str", "int", "float", "bool", "sorted", "enumerate", "zip", "range",
           "super", "repr", "format", "join", "items", "keys", "values", "get", "all", "any"}


def _called(node: ast.Call) -> str | None:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _is_check(name: str) -> bool:
    return name.startswith(CHECK_PREFIXES)


def _is_checked_public(name: str) -> bool:
    return not name.startswith("_") and name.endswith(CHECKED_SUFFIXES)


def _functions():
    """(file relative to the package, FunctionDef) of every top-level function of the four folders."""
    for folder in FOLDERS:
        for path in sorted((PACKAGE / folder).glob("*.py")):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.FunctionDef):
                    yield path.relative_to(PACKAGE).as_posix(), node


def _calls_in_order(fn: ast.FunctionDef):
    """The names ``fn``'s body calls, in the order Python runs them (a call's arguments before the
    call), its docstring left out; raise statements are skipped (an error raised before a check is
    no arithmetic), and so are calls of ``fn``'s own arguments (a sublayer handed in)."""
    body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(
        getattr(fn.body[0], "value", None), ast.Constant) else fn.body
    arguments = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
    order = []

    def visit(node):
        if isinstance(node, (ast.Raise, ast.FunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.Call):
            for child in [node.func, *node.args, *node.keywords]:
                visit(child)
            name = _called(node)
            if name and name not in arguments:
                order.append(name)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    for stmt in body:
        visit(stmt)
    return order


FUNCTIONS = list(_functions())
PUBLIC_EDGE = [(f, fn) for f, fn in FUNCTIONS if _is_checked_public(fn.name)]
TRUSTED = [(f, fn) for f, fn in FUNCTIONS if fn.name.endswith("_formula")]


def test_the_rule_sees_both_sides():
    """The two lists are not empty: the rule is read from the files, not assumed."""
    assert len(PUBLIC_EDGE) > 60 and len(TRUSTED) > 25, (len(PUBLIC_EDGE), len(TRUSTED))


@pytest.mark.parametrize("where,fn", TRUSTED, ids=[f"{f}:{fn.name}" for f, fn in TRUSTED])
def test_a_formula_never_checks(where, fn):
    checks = [n for n in _calls_in_order(fn) if _is_check(n) or _is_checked_public(n)]
    assert not checks, f"{where}: {fn.name} trusts its inputs (a _formula) but calls {checks}"


@pytest.mark.parametrize("where,fn", PUBLIC_EDGE, ids=[f"{f}:{fn.name}" for f, fn in PUBLIC_EDGE])
def test_a_public_forward_or_backward_checks_first(where, fn):
    working = [n for n in _calls_in_order(fn) if n not in NEUTRAL]
    assert working, f"{where}: {fn.name} calls nothing"
    first = working[0]
    assert _is_check(first) or _is_checked_public(first), (
        f"{where}: {fn.name} is a public edge (X_forward / X_backward) but its first call is {first}(), "
        f"not a check: check first, or name it X_formula / X_backward_formula")


def test_no_private_trusted_backward_beside_a_public_pair():
    """``_X_backward`` beside a public ``X_forward`` / ``X_formula`` is spelled ``X_backward_formula``."""
    wrong = []
    for folder in ("fast", "variants", "nn"):  # core keeps its reference's private steps (see docs/development.md)
        for path in sorted((PACKAGE / folder).glob("*.py")):
            names = {n.name for n in ast.parse(path.read_text(encoding="utf-8")).body
                     if isinstance(n, ast.FunctionDef)}
            wrong += [f"{folder}/{path.name}:{n}" for n in names if n.startswith("_") and n.endswith("_backward")
                      and ({n[1:-len("_backward")] + "_forward", n[1:-len("_backward")] + "_formula"} & names)]
    assert not wrong, wrong
