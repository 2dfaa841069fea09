"""``core/`` is the reference a student reads: formulas only, nothing of speed (walks the AST).

No import of ``fast/``, threads, ``concurrent.futures`` or threadpoolctl; no nested functions
or lambdas; no ``out=`` arguments; and each backward is one short block of formulas.
"""
import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[1] / "attention_ref" / "core"
FORBIDDEN_IMPORTS = ("threading", "concurrent", "threadpoolctl", "multiprocessing", "attention_ref.fast")


def _tree(path):
    return ast.parse(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_has_no_speed_machinery(path):
    tree = _tree(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [("." * node.level) + (node.module or "")]
            assert not (node.level >= 2 and (node.module or "").startswith("fast")), f"{path.name} imports fast/"
            assert not (node.level == 1 and node.module is None and any(a.name == "fast" for a in node.names))
        else:
            names = []
        assert not any(n.lstrip(".").startswith(FORBIDDEN_IMPORTS) for n in names), f"{path.name} imports {names}"
        assert not isinstance(node, ast.Lambda), f"{path.name}:{node.lineno} has a lambda"
        if isinstance(node, ast.Call):
            assert not any(kw.arg == "out" for kw in node.keywords), f"{path.name}:{node.lineno} writes with out="
    for function in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        inner = [n.name for n in ast.walk(function) if n is not function and isinstance(n, (ast.FunctionDef,
                                                                                             ast.AsyncFunctionDef))]
        assert not inner, f"{path.name}: {function.name} defines {inner}"


def _code_lines(function: ast.FunctionDef) -> int:
    """Lines of code in a function's body: its docstring, comments and blank lines left out."""
    body = function.body[1:] if ast.get_docstring(function) else function.body
    lines = set()
    for statement in body:
        for node in ast.walk(statement):
            if hasattr(node, "lineno"):
                lines.update(range(node.lineno, node.end_lineno + 1))
    return len(lines)


@pytest.mark.parametrize("module, function, limit", [
    ("attention.py", "_attention_backward", 15),
    ("attention.py", "_attention_forward", 15),
    ("softmax.py", "_softmax", 10),
    ("softmax.py", "_softmax_backward", 5),
    ("linear.py", "_linear_finite", 10),
    ("linear.py", "_linear_backward", 10),
    ("heads.py", "_split", 5),
    ("heads.py", "_merge", 5),
    ("multi_head.py", "_multi_head_attention_backward", 40),
])
def test_formulas_are_one_short_block(module, function, limit):
    tree = _tree(CORE / module)
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    assert found, f"{module} has no {function}"
    assert _code_lines(found[0]) <= limit, f"{module}:{function} has {_code_lines(found[0])} lines of code"


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_public_core_functions_open_with_one_line_of_checks(path):
    """A public pair's body: at most one validating line before its formulas or their call."""
    tree = _tree(path)
    for function in [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.endswith(("_forward",
                                                                                                  "_backward"))]:
        body = function.body[1:] if ast.get_docstring(function) else function.body
        checks = [s for s in body if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                                         and n.func.id.startswith("check_") for n in ast.walk(s))]
        assert len(checks) <= 1 or function.name.startswith("multi_head_attention_separate"), \
            f"{path.name}:{function.name} validates in {len(checks)} statements"
