"""Execute every notebook top to bottom, and check each one imports attention_ref, never
redefines what the package exports, and is committed with its outputs."""
from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import nbclient
import nbformat
import pytest

import attention_ref

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def exported_names() -> set:
    """Every public name of the package and of its modules."""
    names = set(attention_ref.__all__)
    for info in pkgutil.iter_modules(attention_ref.__path__):
        if info.name.startswith("_") or info.name == "__main__":
            continue
        module = importlib.import_module(f"attention_ref.{info.name}")
        names |= set(getattr(module, "__all__", ()))
    return names


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def python_source(cell) -> str:
    """Cell source without IPython magics (lines starting with % or !)."""
    return "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))


def test_there_is_a_numbered_series():
    assert len(NOTEBOOKS) >= 7
    for path in NOTEBOOKS:
        assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_uses_the_package_and_is_committed_with_outputs(path):
    nb = nbformat.read(path, as_version=4)
    cells = code_cells(nb)
    source = "\n".join(python_source(c) for c in cells)
    assert re.search(r"^\s*(import attention_ref|from attention_ref)", source, re.M), \
        f"{path.name} does not import attention_ref"
    exported = exported_names()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            assert node.name.startswith("wrong_") or node.name not in exported, \
                f"{path.name} redefines attention_ref's {node.name}"
    assert all(c.execution_count is not None for c in cells), f"{path.name}: commit it executed"
    assert any(c.outputs for c in cells), f"{path.name}: commit it with its outputs"
    assert "assert " in source, f"{path.name} asserts none of the numbers it shows"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:
        pytest.fail(f"{path.name}: a cell failed:\n{err}", pytrace=False)
