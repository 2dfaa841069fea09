"""Lesson 20 ("Does my port match?") executed top to bottom with its checks: it ports a model to PyTorch and runs
``compare.model`` / ``compare.module``, so it needs torch (the interop extra) and skips cleanly without it.
tests/test_notebooks.py runs every other check on it (committed with outputs, no redefinitions, its ending)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from test_notebooks import NEEDS_TORCH, NOTEBOOKS, check_executes_and_outputs_are_current  # noqa: E402


def test_lesson_20_executes_and_its_committed_outputs_are_current():
    (path,) = [p for p in NOTEBOOKS if p.stem == "20_does_my_port_match"]
    assert NEEDS_TORCH[path.stem] == "tests/test_notebook_20.py"
    check_executes_and_outputs_are_current(path)
