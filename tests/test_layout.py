"""The package's folders are its layers: imports flow down only, no cycles, no module named
by its size, the public API of 0.3 in place (and CHANGELOG.md saying where 0.1's flat paths
went), each public name defined once, and the README's file map and
docs/reading_guide.md describe the tree as it is.

``python tests/test_layout.py --write`` regenerates the module map of docs/reading_guide.md.
"""
from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attention_ref"
GUIDE = ROOT / "docs" / "reading_guide.md"
README = ROOT / "README.md"
# the layers, lowest first; a module may import from its own layer and lower ones
LAYERS = ["top", "core", "fast", "variants", "nn", "models", "interop", "exercises", "documents", "plot", "compare"]
RANK = {layer: i for i, layer in enumerate(LAYERS)}
# the top level holds the shared machinery every layer may use; __init__ and __main__ sit above all
ABOVE_ALL = {"attention_ref", "attention_ref.__main__"}
BEGIN, END = "<!-- BEGIN module map -->", "<!-- END module map -->"
MAP_WIDTH = 110  # characters of a module's line in the map


def modules() -> list[str]:
    """Every module of the package, dotted, in layer order then by path."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names, key=lambda n: (LAYERS.index(layer_of(n)), n))


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "top"


def source_path(module: str) -> Path:
    path = ROOT / Path(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imported_modules(module: str) -> set[str]:
    """The package modules ``module`` imports (at any depth of its code), resolved."""
    path = source_path(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("attention_ref"):
                submodules = {f"{target}.{a.name}" for a in node.names} & set(modules())
                found |= submodules or {target}  # "from . import x" imports the module x
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("attention_ref")}
    known = set(modules())
    return {name for name in found if name in known} - {module}


def test_imports_flow_down_only():
    wrong = []
    for module in modules():
        if module in ABOVE_ALL:
            continue
        mine = RANK[layer_of(module)]
        for target in imported_modules(module):
            if target in ABOVE_ALL or RANK[layer_of(target)] > mine:
                wrong.append(f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})")
    assert not wrong, "imports that flow up:\n" + "\n".join(wrong)


def test_nothing_imports_compare():
    """compare/ stands apart: it checks users' code against every layer below, and no layer needs it
    (the command line's entry point, __main__, sits above all and dispatches to its command)."""
    wrong = [f"{m} imports {t}" for m in modules() if layer_of(m) != "compare" and m != "attention_ref.__main__"
             for t in imported_modules(m) if layer_of(t) == "compare"]
    assert not wrong, wrong


def test_no_import_cycles():
    graph = {m: imported_modules(m) for m in modules()}
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for m in graph:
        if m not in state:
            visit(m, [m])


def test_every_module_imports_alone_in_a_fresh_interpreter():
    """Each module first, on its own: no hidden dependence on an import order."""
    # warnings are errors, with the two filters of setup.cfg for old matplotlib and nbformat
    code = ("import importlib, sys, warnings\n"
            "warnings.simplefilter('error')\n"
            "for module in ('matplotlib', 'nbformat'):\n"
            "    warnings.filterwarnings('ignore', category=DeprecationWarning, module=module)\n"
            "for name in sys.argv[1:]:\n"
            "    for m in [k for k in sys.modules if k.startswith('attention_ref')]: del sys.modules[m]\n"
            "    importlib.import_module(name)\n")
    importable = [m for m in modules() if m != "attention_ref.__main__"]  # that one runs the walkthrough
    result = subprocess.run([sys.executable, "-c", code, *importable], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]


def test_no_module_is_named_by_its_size_or_age():
    for module in modules():
        leaf = module.rpartition(".")[2]
        assert not re.search(r"(^|_)(more|misc|extra|new|old|utils?|helpers?|stuff)(_|$)", leaf), module


def test_matplotlib_only_in_plot():
    for module in modules():
        if layer_of(module) == "plot":
            continue
        text = source_path(module).read_text(encoding="utf-8")
        assert "import matplotlib" not in text and "from matplotlib" not in text, module


STDLIB_OR_NUMPY = {"__future__", "collections.abc", "dataclasses", "math", "typing", "numpy"}


def test_core_imports_numpy_and_the_package_only():
    for module in modules():
        if layer_of(module) != "core":
            continue
        tree = ast.parse(source_path(module).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert all(a.name in STDLIB_OR_NUMPY for a in node.names), (module, ast.dump(node))
            elif isinstance(node, ast.ImportFrom) and not node.level:
                assert node.module in STDLIB_OR_NUMPY, (module, node.module)


# ------------------------------------------------------------- the public API
API_0_1 = json.loads((ROOT / "tests" / "public_api_0.1.json").read_text(encoding="utf-8"))
API_0_3 = json.loads((ROOT / "tests" / "public_api_0.3.json").read_text(encoding="utf-8"))
CHANGELOG = ROOT / "CHANGELOG.md"
REMOVED_IN_0_3 = {"get_num_threads", "set_num_threads"}  # no-ops since 0.2 (CHANGELOG.md)


def test_no_top_level_name_of_0_1_is_lost():
    """``attention_ref.X`` still holds every name of 0.1's ``__all__`` but the two no-op thread
    functions that 0.3.0 removed."""
    import attention_ref

    kept = set(API_0_1["attention_ref"]) - REMOVED_IN_0_3
    assert kept <= set(attention_ref.__all__), sorted(kept - set(attention_ref.__all__))
    assert all(hasattr(attention_ref, name) for name in kept)
    assert not any(hasattr(attention_ref, name) for name in REMOVED_IN_0_3)


@pytest.mark.parametrize("module_name", sorted(n for n in API_0_3 if not n.startswith("_")))
def test_every_public_name_of_0_3_is_where_it_was(module_name):
    """Every module path of 0.3 imports and holds every name of its ``__all__`` (tests/public_api_0.3.json)."""
    module = importlib.import_module(module_name)
    missing = [name for name in API_0_3[module_name] if not hasattr(module, name)]
    assert not missing, f"{module_name} lost {missing}"


@pytest.mark.parametrize("old", [name for name in API_0_1 if not name.startswith("_") and name not in API_0_3])
def test_the_changelog_says_where_each_0_1_path_went(old):
    """The flat paths of 0.1 (``attention_ref.masks`` ...) were removed in 0.3.0; CHANGELOG.md
    names each one and where its module is now, and the old path no longer imports."""
    text = CHANGELOG.read_text(encoding="utf-8")
    line = re.search(rf"^\s*\| `{re.escape(old)}` \| `(attention_ref[\w.]*)` \|", text, flags=re.M)
    assert line, f"CHANGELOG.md does not say where {old} went"
    new = importlib.import_module(line.group(1))
    assert all(hasattr(new, name) for name in API_0_1[old] if name not in REMOVED_IN_0_3)
    with pytest.raises(ImportError):
        importlib.import_module(old)


def test_test_files_have_unique_names():
    """The test folders have no __init__.py: two test files of one name would collide."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_every_public_name_is_exported_once_from_the_top():
    import attention_ref

    assert len(attention_ref.__all__) == len(set(attention_ref.__all__))
    for name in attention_ref.__all__:
        assert getattr(attention_ref, name) is not None


# ------------------------------------------------------------- the file map and guide
def module_map() -> str:
    """The table of every module and the first line of its docstring, by layer."""
    lines = ["| module | what it holds |", "| --- | --- |"]
    for module in modules():
        path = source_path(module).relative_to(ROOT).as_posix()
        doc = ast.get_docstring(ast.parse(source_path(module).read_text(encoding="utf-8"))) or ""
        paragraph = " ".join(doc.strip().split("\n\n")[0].split())  # the first paragraph, one line
        first = re.split(r"(?<=\.)\s(?=[A-Z])", paragraph, maxsplit=1)[0]  # its first sentence,
        if len(first) > MAP_WIDTH:  # at most one line of the map
            first = first[:MAP_WIDTH - 3].rsplit(" ", 1)[0] + " ..."
        cell = first.replace("|", "\\|")
        lines.append(f"| `{path}` | {cell} |")
    return "\n".join(lines) + "\n"


def test_every_module_says_what_it_holds():
    for module in modules():
        doc = ast.get_docstring(ast.parse(source_path(module).read_text(encoding="utf-8")))
        assert doc and doc.strip(), f"{module} has no docstring"


def test_reading_guide_map_is_generated_from_the_tree():
    text = GUIDE.read_text(encoding="utf-8")
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    assert block == module_map(), "docs/reading_guide.md is stale: run python tests/test_layout.py --write"


def test_reading_guide_paths_exist_and_its_line_count_holds():
    text = GUIDE.read_text(encoding="utf-8")
    for path in re.findall(r"`((?:attention_ref|tests|examples|notebooks|benchmarks|docs)/[\w/.]*)`", text):
        assert (ROOT / path).exists(), path
    first = re.search(r"about ([\d,]+) lines", text)
    files = ["core/softmax.py", "core/attention.py", "core/heads.py", "core/multi_head.py", "gradcheck.py"]
    actual = sum(len((PACKAGE / f).read_text(encoding="utf-8").splitlines()) for f in files)
    assert first and abs(int(first.group(1).replace(",", "")) - actual) <= 0.15 * actual, actual


def test_readme_file_map_matches_the_tree():
    text = README.read_text(encoding="utf-8")
    table = text.split("## Files", 1)[1]
    rows = re.findall(r"^\| `([^`]+)`", table, flags=re.M)
    assert len(rows) == len(set(rows)), f"README's file map lists a path twice: {rows}"
    listed = set(rows)
    for path in listed:
        assert (ROOT / path).exists(), f"README lists {path}, which does not exist"
    top = {f"attention_ref/{p.name}" + ("/" if p.is_dir() else "")
           for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    missing = top - listed
    assert not missing, f"README's file map does not mention {sorted(missing)}"


def test_reading_guide_line_counts_are_the_files():
    """Every "`path` (N lines" of the reading guide is that file's length today."""
    text = GUIDE.read_text(encoding="utf-8")
    counts = re.findall(r"`(attention_ref/[\w/]+\.py)` \(([\d,]+) lines", text)
    assert len(counts) >= 5
    for path, n in counts:
        actual = len((ROOT / path).read_text(encoding="utf-8").splitlines())
        assert int(n.replace(",", "")) == actual, f"docs/reading_guide.md says {path} has {n} lines; it has {actual}"



def test_the_walkthrough_counts_the_notebooks():
    from attention_ref.documents.walkthrough import NEXT_STEPS

    count = len(list((ROOT / "notebooks").glob("*.ipynb")))
    assert f"{count} notebooks" in NEXT_STEPS

if __name__ == "__main__":  # python tests/test_layout.py --write: regenerate the guide's module map
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/test_layout.py --write")
    text = GUIDE.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    from attention_ref._atomic import write_atomic

    write_atomic(GUIDE, head + BEGIN + "\n" + module_map() + rest[rest.index(END):])
    print(f"wrote the module map of {GUIDE.relative_to(ROOT)}")

