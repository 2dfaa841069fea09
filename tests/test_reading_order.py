"""One reading order of the reference, said in three places: the student path of
docs/reading_guide.md, the README's "Start here" and the docstring of attention_ref/core/__init__.py.
And one order of the lessons, said in three places: the student path, the README's "Start here"
and the book's sidebar (the book lists the notebooks sorted by file name, attention_ref/book.py).

Each place names the files of ``attention_ref/core/`` in the order a student should read them;
this test extracts the three lists and requires them equal, complete, and in the order of the
imports of ``attention_ref/core/__init__.py`` (its table of contents). The notebooks the
student path names must exist and come in their numbered order, starting with 01-05. The
functions the student path tells a reader to open must exist in the files it names.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "attention_ref" / "core"
GUIDE = ROOT / "docs" / "reading_guide.md"
README = ROOT / "README.md"

FIX = ("; the three places must agree: docs/reading_guide.md (\"A student's path\", the numbered"
       " items of step 3), README.md (\"Start here\", step 2) and the docstring of"
       " attention_ref/core/__init__.py (\"Read in this order\")")


def section(text: str, heading: str) -> str:
    """The markdown section under ``heading`` (a line starting with ``## ``), up to the next one."""
    start = text.index(heading + "\n")
    following = re.search(r"^## ", text[start + len(heading):], flags=re.M)
    return text[start:start + len(heading) + (following.start() if following else len(text))]


def unique(names) -> list:
    """First occurrences, in order."""
    seen = []
    for name in names:
        if name not in seen:
            seen.append(name)
    return seen


def student_path() -> str:
    return section(GUIDE.read_text(encoding="utf-8"), "## A student's path")


def guide_order() -> list:
    """The core files of the student path's numbered items, e.g. ``   2. `attention_ref/core/softmax.py`: ...``."""
    return re.findall(r"^\s*\d+\.\s+`attention_ref/core/(\w+)\.py`", student_path(), flags=re.M)


def readme_order() -> list:
    return unique(re.findall(r"`core/(\w+)\.py`", section(README.read_text(encoding="utf-8"), "## Start here")))


def docstring_order() -> list:
    doc = ast.get_docstring(ast.parse((CORE / "__init__.py").read_text(encoding="utf-8")))
    paragraph = next(p for p in doc.split("\n\n") if p.startswith("Read in this order"))
    return unique(re.findall(r"``(\w+)\.py``", paragraph))


def import_order() -> list:
    """The modules that attention_ref/core/__init__.py imports, in the order of its imports."""
    tree = ast.parse((CORE / "__init__.py").read_text(encoding="utf-8"))
    return unique(node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.level == 1)


def test_the_three_places_name_the_same_order():
    guide, readme, doc = guide_order(), readme_order(), docstring_order()
    assert guide, "the reading guide's student path names no core file" + FIX
    assert readme == guide, f"README's Start here reads {readme}, the reading guide {guide}" + FIX
    assert doc == guide, f"core/__init__.py's docstring reads {doc}, the reading guide {guide}" + FIX


def test_the_order_covers_every_core_file_once():
    guide = guide_order()
    files = sorted(p.stem for p in CORE.glob("*.py") if p.name != "__init__.py")
    assert len(guide) == len(set(guide)), f"the student path names a core file twice: {guide}"
    assert sorted(guide) == files, (f"the student path names {sorted(guide)}; core/ holds {files}: add or"
                                    " remove the file in all three places" + FIX)


def test_the_order_is_the_table_of_contents():
    """core/__init__.py's imports are its table of contents, in the order a reader meets them."""
    assert import_order() == guide_order(), (f"core/__init__.py imports {import_order()}, the reading order"
                                             f" is {guide_order()}")


def test_the_student_path_names_existing_notebooks_in_order():
    named = unique(re.findall(r"`notebooks/(\d\d_[a-z0-9_]+\.ipynb)`", student_path()))
    for name in named:
        assert (ROOT / "notebooks" / name).exists(), f"the student path names notebooks/{name}, which does not exist"
    numbers = [int(name[:2]) for name in named]
    assert numbers == sorted(numbers), f"the student path names the notebooks out of order: {named}"
    assert numbers[:5] == [1, 2, 3, 4, 5], f"the student path must start with notebooks 01-05: {named}"


def test_the_readme_names_the_first_five_notebooks_in_order():
    linked = re.findall(r"\(notebooks/(\d\d)_[a-z0-9_]+\.ipynb\)", section(README.read_text(encoding="utf-8"), "## Start here"))
    assert linked[:5] == ["01", "02", "03", "04", "05"], linked


def test_the_functions_the_student_path_names_exist():
    """Each numbered core item's private functions and pairs (``_softmax``, ``*_forward``,
    ``*_backward``, ``*Cache``) are defined in its file; the plain loops in tests/_reference.py."""
    items = re.split(r"^\s*\d+\.\s+(?=`attention_ref/core/\w+\.py`)", student_path(), flags=re.M)[1:]
    assert items, "no numbered core items in the student path"
    for item in items:
        module = re.match(r"`attention_ref/core/(\w+)\.py`", item).group(1)
        item = re.split(r"^\d+\.\s", item, flags=re.M)[0]  # up to the next top-level step
        defined = {node.name for node in ast.walk(ast.parse((CORE / f"{module}.py").read_text(encoding="utf-8")))
                   if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        named = {n for n in re.findall(r"`([A-Za-z_]\w*)`", item)
                 if n.startswith("_") or n.endswith(("_forward", "_backward", "Cache"))}
        missing = named - defined
        assert not missing, f"the student path sends readers to {sorted(missing)} in core/{module}.py, which has none"
    loops = set(re.findall(r"`(loop_\w+)`", student_path()))
    reference = (ROOT / "tests" / "_reference.py").read_text(encoding="utf-8")
    assert loops and all(f"def {name}(" in reference for name in loops), sorted(loops)


def lessons_in_book_order() -> list:
    """The notebooks as the book's sidebar lists them: sorted by file name."""
    return sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_one_order_of_the_lessons_in_the_readme_the_guide_and_the_book():
    book = lessons_in_book_order()
    guide = unique(re.findall(r"`notebooks/(\d\d_[a-z0-9_]+\.ipynb)`", student_path()))
    readme = unique(re.findall(r"\(notebooks/(\d\d_[a-z0-9_]+\.ipynb)\)", section(README.read_text(encoding="utf-8"), "## Start here")))
    assert readme == book, f"README's Start here lists {readme}, the book {book}"
    assert guide == book, f"the reading guide's student path lists {guide}, the book {book}"


def test_every_lesson_title_has_one_style():
    """# NN · Title, NN the file's number: the sidebar shows these titles."""
    import json
    for name in lessons_in_book_order():
        cells = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"]
        title = "".join(cells[0]["source"]).splitlines()[0]
        assert re.fullmatch(rf"# {name[:2]} · \S.*", title), f"{name}: title {title!r} is not '# {name[:2]} · ...'"


def test_the_line_counts_the_guide_states_are_true():
    """"`attention_ref/core/softmax.py` (85 lines)" and the like: each count is the file's."""
    text = GUIDE.read_text(encoding="utf-8")
    stated = re.findall(r"`attention_ref/([\w/]+\.py)`\s*\((?:[^()]*?,\s*)?(\d+) lines", text)
    assert len(stated) >= 5, stated
    for path, count in stated:
        lines = len((ROOT / "attention_ref" / path).read_text(encoding="utf-8").splitlines())
        assert lines == int(count), f"docs/reading_guide.md says attention_ref/{path} has {count} lines; it has {lines}"
