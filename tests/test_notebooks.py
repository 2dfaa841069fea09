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

try:
    from notebook_checks import CHECKS  # tests/ is on sys.path under pytest and when run as a script
except ImportError:  # pragma: no cover - imported from elsewhere
    from tests.notebook_checks import CHECKS

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def exported_names() -> set:
    """Every public name of the package and of its modules."""
    names = set(attention_ref.__all__)
    for info in pkgutil.walk_packages(attention_ref.__path__, "attention_ref."):  # every layer
        if info.name.rpartition(".")[2].startswith("_"):
            continue
        module = importlib.import_module(info.name)
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
    assert "assert " in source or CHECKS.get(path.stem), f"{path.name}: nothing checks the numbers it shows"


def test_every_check_follows_a_cell_of_its_notebook():
    """A check keyed by a cell id that no longer exists would never run: each key is a code cell of its notebook."""
    stems = {p.stem: p for p in NOTEBOOKS}
    for stem, checks in CHECKS.items():
        assert stem in stems, f"tests/notebook_checks.py checks {stem}, which is not a notebook"
        ids = {c.id for c in code_cells(nbformat.read(stems[stem], as_version=4))}
        missing = set(checks) - ids
        assert not missing, f"tests/notebook_checks.py: {stem} has no code cell {sorted(missing)}"


CHECK_TAG = "notebook-check"


def with_checks(nb, stem: str):
    """``nb`` with each check of tests/notebook_checks.py inserted as a code cell right after its cell."""
    checks = CHECKS.get(stem, {})
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        if cell.cell_type == "code" and cell.id in checks:
            check = nbformat.v4.new_code_cell(checks[cell.id])
            check.metadata["tags"] = [CHECK_TAG]
            cells.append(check)
    nb.cells = cells
    return nb


def without_checks(nb):
    nb.cells = [c for c in nb.cells if CHECK_TAG not in c.metadata.get("tags", [])]
    return nb


_VOLATILE = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),                                    # memory addresses
    (re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?\s?(s|ms|µs|us|ns|seconds?)\b"), "<time>"),  # timings
    # traced memory depends on the NumPy and Python versions; the notebooks assert bounds
    (re.compile(r"\d[\d,]*(\.\d+)?\s?(MiB|KiB|GiB)\b"), "<memory>"),
]


def text_outputs(cell) -> str:
    """A code cell's text as a reader sees it: streams joined (however they were chunked),
    then text/plain results and error names; volatile parts normalised."""
    streams, results = {}, []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            streams[out.name] = streams.get(out.name, "") + out.text
        elif out.output_type in ("execute_result", "display_data"):
            results.append(out.get("data", {}).get("text/plain", ""))
        elif out.output_type == "error":
            results.append(out.ename)
    text = "".join(f"[{name}]\n{streams[name]}" for name in sorted(streams) if name == "stdout")
    text += "".join(f"[result]\n{r}\n" for r in results)
    for pattern, repl in _VOLATILE:
        text = pattern.sub(repl, text)
    return text


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


# Numbers this small are rounding level: differences of two float64 computations of one
# value (1e-16 .. 1e-14) and finite-difference errors of gradcheck with eps = 1e-6 (1e-11 ..
# 1e-7 for gradients of size 1 .. 10). Their printed digits, even their exponents, depend on
# the BLAS, the CPU and the NumPy version; the notebooks assert their bounds instead.
ROUNDING_LEVEL = 1e-6


def same_text(old: str, new: str, rel: float = 0.02) -> bool:
    """Equal words and equal numbers, numbers within ``rel`` (plus one unit in the last
    printed digit): traced memory and tile timings jitter in their last digits from run to
    run; anything that really changed moves by more. Two numbers both below
    ``ROUNDING_LEVEL`` in size are equal (``0.0e+00`` and ``3.3e-16`` say the same);
    integers (counts, shapes) must be equal. Runs of spaces count as one: a table's column
    widths follow the printed width of its numbers ("1.73e-10" and "1.6e-10")."""
    def words(text: str) -> list[str]:
        return [re.sub(r"[ \t]+", " ", part) for part in _NUMBER.split(text)]

    if words(old) != words(new):
        return False
    a, b = _NUMBER.findall(old), _NUMBER.findall(new)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y or max(abs(float(x)), abs(float(y))) < ROUNDING_LEVEL:
            continue
        if not any(c in x + y for c in ".e"):  # integers (counts, shapes, seeds) are exact
            return False
        unit = 10.0 ** -len(x.split(".")[1].split("e")[0]) if "." in x and "e" not in x else 0.0
        if abs(float(x) - float(y)) > rel * max(abs(float(x)), abs(float(y))) + unit:
            return False
    return True


def _client(nb, path: Path):
    """The kernel that runs notebook ``nb`` (from ``path``) in its own folder, without timestamps."""
    return nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", record_timing=False,
                                   resources={"metadata": {"path": str(path.parent)}})


#: The notebooks about a mechanism, each of which shows it in at least one figure (12 is the
#: exercises and 17 their solutions: their output is the checker's text and checked numbers)
MECHANISMS = [p for p in NOTEBOOKS if not p.name.startswith(("12_", "17_"))]


@pytest.mark.parametrize("path", MECHANISMS, ids=lambda p: p.stem)
def test_mechanism_notebook_shows_a_figure(path):
    nb = nbformat.read(path, as_version=4)
    images = [out for c in code_cells(nb) for out in c.get("outputs", [])
              if "image/png" in out.get("data", {})]
    assert images, f"{path.name} has no figure"


#: Notebooks that need torch (an optional dependency, the interop extra): executed by their own test file,
#: which the interop leg of .ci/run picks up (it imports torch); the checks above run on them everywhere
NEEDS_TORCH = {"20_does_my_port_match": "tests/test_notebook_20.py"}


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem not in NEEDS_TORCH], ids=lambda p: p.stem)
def test_notebook_executes_and_its_committed_outputs_are_current(path):
    check_executes_and_outputs_are_current(path)


def check_executes_and_outputs_are_current(path):
    nb = nbformat.read(path, as_version=4)
    committed = [text_outputs(c) for c in code_cells(nb)]
    try:
        _client(with_checks(nb, path.stem), path).execute()
    except nbclient.exceptions.CellExecutionError as err:
        pytest.fail(f"{path.name}: a cell or a check of tests/notebook_checks.py failed:\n{err}", pytrace=False)
    fresh = [text_outputs(c) for c in code_cells(without_checks(nb))]
    for i, (old, new) in enumerate(zip(committed, fresh)):
        assert same_text(old, new), (f"{path.name}, code cell {i}: the committed output is stale; re-execute the"
                            f" notebook.\ncommitted:\n{old}\nfresh:\n{new}")



#: The lessons: every notebook but the solutions (17)
LESSONS = [p for p in NOTEBOOKS if not p.name.startswith("17_")]
ANSWERS = Path(__file__).resolve().parent.parent / "docs" / "answers.md"


#: Lessons allowed more than four questions: 19 is five sections on as many 2025-26 models (sinks, YaRN, experts,
#: latent attention, the delta rule), asked about section by section; the questions for the delta rule (issue 47) are 5-8
MOST_QUESTIONS = {"19": 8}


def _numbered(text: str) -> int:
    return len(re.findall(r"^\d+\. ", text, flags=re.M))


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_links_the_notation_and_ends_with_summary_questions_exercises(path):
    """The end of every lesson, as d2l's and CS231n's sections end: a summary, questions
    answered on docs/answers.md (one answer per question) and exercises solved in notebook 17."""
    nb = nbformat.read(path, as_version=4)
    prose = [c.source for c in nb.cells if c.cell_type == "markdown"]
    assert any("../docs/notation.md" in t for t in prose), f"{path.name} does not link the notation page"
    heads = [t.split("\n", 1)[0] for t in prose]
    for head in ("## Summary", "## Check your understanding", "## Exercises"):
        assert head in heads, f"{path.name} has no '{head}' section"
    questions = next(t for t in prose if t.startswith("## Check your understanding"))
    most = MOST_QUESTIONS.get(path.name[:2], 4)
    assert 3 <= _numbered(questions) <= most, f"{path.name}: {_numbered(questions)} questions, want 3-{most}"
    sections = re.split(r"^## ", ANSWERS.read_text(encoding="utf-8"), flags=re.M)
    answers = next((s for s in sections if s.startswith(f"{path.name[:2]} · ")), None)
    assert answers is not None, f"docs/answers.md has no section '## {path.name[:2]} · ...'"
    assert _numbered(answers) == _numbered(questions), (f"{path.name} asks {_numbered(questions)} questions,"
                                                        f" docs/answers.md answers {_numbered(answers)}")
    exercises = next(t for t in prose if t.startswith("## Exercises"))
    assert "17_solutions.ipynb" in exercises, f"{path.name}: its exercises do not point to the solutions"


def test_same_text_tolerates_jitter_but_not_change():
    assert same_text("peak 1.90 MiB, 7.2 tiles", "peak 1.91 MiB, 7.3 tiles")
    assert not same_text("peak 1.90 MiB", "peak 2.50 MiB")
    assert not same_text("score 0.2598", "score 0.1848")
    assert not same_text("holds", "wrong")
    # rounding level: exactly zero on one machine, a few ulps on another; an FD error's exponent
    assert same_text("max |a - b| = 0.0e+00", "max |a - b| = 3.3e-16")
    assert same_text("x  1.51  2.2e-08  ok", "x  1.51  9.0e-10  ok")
    assert not same_text("x  1.51  2.2e-08  ok", "x  1.31  2.2e-08  ok")   # the gradient scale moved
    assert not same_text("error 3.0e-06", "error 3.0e-16")                 # not rounding level any more
    assert not same_text("(1, 4) FAIL", "(1, 3) FAIL")                     # a failing input's position
    assert not same_text("9846 of 23,600 queries", "9990 of 23,600 queries")  # counts are exact
    assert not same_text("shape (128, 64)", "shape (130, 64)")
    # a column's width follows its numbers' printed width (the oldest CI leg printed 1.6e-10)
    assert same_text("b_k  (6,)   1.73e-10  ok", "b_k  (6,)    1.6e-10  ok")
    assert not same_text("b_k  (6,)  ok", "b_k  (6,)  FAIL")


def test_stale_output_is_detected():
    cell = nbformat.v4.new_code_cell("print(1)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    other = nbformat.v4.new_code_cell("print(1)")
    other.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1"),
                     nbformat.v4.new_output("stream", name="stdout", text="\n")]
    assert text_outputs(cell) == text_outputs(other)            # chunking does not matter
    other.outputs[0].text = "2"
    assert text_outputs(cell) != text_outputs(other)            # a changed number does
    fig = nbformat.v4.new_output("execute_result", data={"text/plain": "<Figure at 0x7f3a>"})
    fig2 = nbformat.v4.new_output("execute_result", data={"text/plain": "<Figure at 0x7f3b>"})
    cell.outputs, other.outputs = [fig], [fig2]
    assert text_outputs(cell) == text_outputs(other)


def execute_in_place(path: Path) -> None:
    """Re-execute one notebook top to bottom, with its checks, and save it with its fresh outputs (not the checks)."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:  # no timestamps: a refresh changes only what a reader sees
        cell.metadata.pop("execution", None)
    _client(with_checks(nb, path.stem), path).execute()  # a failed check stops the refresh
    nb = without_checks(nb)
    from attention_ref._atomic import write_atomic

    text = nbformat.writes(nb)
    write_atomic(path, text if text.endswith("\n") else text + "\n")  # as nbformat.write writes it


if __name__ == "__main__":  # python tests/test_notebooks.py --write [NAME ...]: refresh the outputs
    import argparse

    parser = argparse.ArgumentParser(description="re-execute notebooks and save their outputs")
    parser.add_argument("--write", action="store_true", required=True,
                        help="rewrite the committed notebooks (the only thing this command does)")
    parser.add_argument("names", nargs="*", help="notebook stems or prefixes (default: all)")
    args = parser.parse_args()
    for nb_path in NOTEBOOKS:
        if not args.names or any(nb_path.stem.startswith(n) for n in args.names):
            print(f"executing {nb_path.name}")
            execute_in_place(nb_path)
