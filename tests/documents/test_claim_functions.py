"""How the claims table is built (issue 31): one function per claim (or per family of rows that
is one computation looped), named after its row, each group's functions listed once in table
order beside the group's function, no function of the claims package longer than a screen, and
no module of documents/ sharing its name with another."""
from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

import pytest

from attention_ref.documents import claims
from attention_ref.documents.claims import Claim
from attention_ref.documents.claims.claim import rows_of

CLAIMS_PACKAGE = Path(claims.__file__).resolve().parent
MAX_FUNCTION_LINES = 40


def registered() -> dict:
    """Group title -> the tuple of claim functions behind that group's function (``scaling_claims``
    lists ``SCALING_CLAIMS``, in the module that defines it)."""
    return {title: getattr(sys.modules[f.__module__], f.__name__.upper()) for title, f in claims.claim_groups().items()}


def claim_functions() -> list:
    """Every ``claim_NNN_*`` function (NNN: the document) defined in the claims package, in source
    order, module by module."""
    found = []
    for path in sorted(CLAIMS_PACKAGE.glob("*.py")):
        module = sys.modules[f"attention_ref.documents.claims.{path.stem}"] if path.stem != "__init__" else claims
        found += [getattr(module, node.name) for node in ast.parse(path.read_text(encoding="utf-8")).body
                  if isinstance(node, ast.FunctionDef) and re.match(r"claim_\d{3}_", node.name)]
    return found


def as_rows(out) -> list:
    """A claim function's result as a list of rows."""
    return [out] if isinstance(out, Claim) else list(out)


def slug(rid: str) -> str:
    """A row id as a name: ``004-4.1-score`` -> ``004_4_1_score``."""
    return re.sub(r"[^0-9a-z]+", "_", rid.lower())


@pytest.mark.parametrize("f", claim_functions(), ids=lambda f: f.__name__)
def test_each_claim_function_returns_claims_with_unique_ids_named_after_it(f):
    out = f()
    rows = as_rows(out)
    assert isinstance(out, (Claim, list)) and rows, f"{f.__name__} returns {type(out).__name__}"
    assert all(isinstance(r, Claim) for r in rows), f.__name__
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)), f"{f.__name__} repeats an id: {ids}"
    name = f.__name__.removeprefix("claim_")
    if isinstance(out, Claim):  # one row: the function is named after it
        assert name == slug(out.id), f"{f.__name__} returns the row {out.id}"
    else:  # a family: every row's id starts with the function's name less its last word
        family = name.rsplit("_", 1)[0] + "_"
        assert all(slug(i).startswith(family) for i in ids), (f.__name__, ids)
    assert (inspect.getdoc(f) or "").strip(), f"{f.__name__} says what it computes"


def test_every_row_comes_from_exactly_one_registered_function():
    groups = registered()
    listed = [f for functions in groups.values() for f in functions]
    assert len(listed) == len(set(listed)), "a claim function is listed twice"
    assert sorted(f.__name__ for f in listed) == sorted(f.__name__ for f in claim_functions()), \
        "every claim_NNN_* function is listed in exactly one group, and every listed function is one"
    source = {}
    for f in listed:
        for r in as_rows(f()):
            assert r.id not in source, f"{r.id} comes from {source[r.id]} and {f.__name__}"
            source[r.id] = f.__name__
    rows = claims.all_claims()
    assert [r.id for r in rows] == list(source), "all_claims is the listed functions' rows, in order"
    assert len(rows) == len(source)
    for title, group in claims.claim_groups().items():  # each group function is its tuple's rows
        assert group() == rows_of(groups[title]), title


def test_a_claim_function_sits_in_the_module_of_its_group():
    for title, functions in registered().items():
        module = claims.claim_groups()[title].__module__
        assert all(f.__module__ == module for f in functions), title


def test_no_function_of_the_claims_package_is_longer_than_a_screen():
    long = []
    for path in sorted(CLAIMS_PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_the_group_functions_only_collect_their_rows():
    """A group's function computes nothing itself: its body is one ``return rows_of(...)``."""
    for f in claims.claim_groups().values():
        tree = ast.parse(inspect.getsource(sys.modules[f.__module__]))
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == f.__name__)
        body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        assert len(body) == 1 and isinstance(body[0], ast.Return), f.__name__
        assert ast.unparse(body[0].value) == f"rows_of({f.__name__.upper()})", f.__name__


def test_the_modules_of_documents_have_names_no_other_module_has():
    """``claims/worked_examples.py`` beside ``documents/worked_examples.py`` was two modules of one
    name; a module of ``documents/`` (claims and experiments included) is now the only one of its name
    in the package."""
    package = CLAIMS_PACKAGE.parents[1]
    names = [p.name for p in package.rglob("*.py") if p.name != "__init__.py"]
    for path in sorted((package / "documents").rglob("*.py")):
        if path.name != "__init__.py":
            assert names.count(path.name) == 1, f"{path.relative_to(package)}: another module is named {path.name}"
