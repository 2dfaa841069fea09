"""One definition per operation, checked once at the edge (issue 31), read from the source:
each public name is defined at most twice (the reference's and one other), __init__.py imports
every name from the module that defines it, no docstring is assigned at import, and few
private names cross from one folder of the package into another."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import attention_ref

PACKAGE = Path(attention_ref.__file__).resolve().parent
MAX_UNDERSCORE_IMPORTS_ACROSS_FOLDERS = 10


#: spot-the-bug exercises: source text handed to a student to fix (attention_ref.exercises.bugs reads
#: them as text, nothing imports them); each defines the function the student repairs under its own
#: name, which is not a definition of the library's
EXERCISE_TEXTS = PACKAGE / "exercises" / "bug_files"


def _sources():
    return {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(PACKAGE.rglob("*.py"))
            if EXERCISE_TEXTS not in path.parents}


def _top_level_definitions():
    """name -> the files that define it at their top level (def, class or assignment)."""
    found = defaultdict(list)
    for path, tree in _sources().items():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[node.name].append(path)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found.update({t.id: found[t.id] + [path] for t in targets if isinstance(t, ast.Name)})
    return found


def test_each_public_name_has_at_most_two_definitions():
    definitions = _top_level_definitions()
    many = {name: [str(p.relative_to(PACKAGE)) for p in definitions[name]]
            for name in attention_ref.__all__ if len(definitions[name]) > 2}
    assert not many, many


def test_the_fast_path_has_its_own_names():
    """attention_ref.X is defined once outside core; the fast path is attention_ref.fast.X_fast."""
    definitions = _top_level_definitions()
    for name in ("linear_forward", "linear_backward", "scaled_dot_product_attention_forward",
                 "scaled_dot_product_attention_backward", "multi_head_attention_forward",
                 "multi_head_attention_backward"):
        files = sorted(str(p.relative_to(PACKAGE).parent) for p in definitions[name])
        assert files[0] == "core" and len(files) == 2, (name, files)
        assert getattr(attention_ref.fast, f"{name}_fast").__module__.startswith("attention_ref.fast.")
        assert getattr(attention_ref, name) is not getattr(attention_ref.core, name)


def test_init_imports_every_name_by_name_from_its_definition():
    tree = _sources()[PACKAGE / "__init__.py"]
    imported = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            assert all(a.name != "*" for a in node.names), f"star import from {node.module}"
            imported.update({a.asname or a.name: node.module for a in node.names})
    definitions = _top_level_definitions()
    for name in attention_ref.__all__:
        assert name in imported, f"{name} is not imported by name in __init__.py"
        module = imported[name]
        defining = [p.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".") for p in definitions[name]]
        private_home = all(d.startswith("_") for d in defining)  # PARAM_NAMES: _pair_checks, shown by core
        assert module in defining or private_home, f"{name} is imported from {module}, defined in {defining}"


def test_no_docstring_is_assigned_at_import():
    for path, tree in _sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    assert not (isinstance(target, ast.Attribute) and target.attr == "__doc__"), \
                        f"{path.relative_to(PACKAGE)}:{node.lineno} assigns a __doc__"
    for name in attention_ref.__all__:
        obj = getattr(attention_ref, name)
        if callable(obj) and getattr(obj, "__module__", "").startswith("attention_ref"):
            assert obj.__doc__ and obj.__doc__.strip(), f"attention_ref.{name} has no docstring"


def _folder(parts) -> str:
    """The layer folder of a module's path parts under the package ('' for the top level)."""
    return parts[0] if len(parts) > 1 and (PACKAGE / parts[0]).is_dir() else ""


def underscore_imports_across_folders():
    """(file, module, name) of every ``from X import _name`` where X is in another folder."""
    found = []
    for path, tree in _sources().items():
        rel = path.relative_to(PACKAGE).parts
        package = list(rel[:-1])
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = package[: len(package) - (node.level - 1)]
            target = base + (node.module.split(".") if node.module else [])
            if _folder(target + ["x"]) == _folder(list(rel)):
                continue
            found += [("/".join(rel), ".".join(target), a.name) for a in node.names if a.name.startswith("_")]
    return found


def test_few_private_names_cross_folders():
    found = underscore_imports_across_folders()
    assert len(found) <= MAX_UNDERSCORE_IMPORTS_ACROSS_FOLDERS, "\n".join(map(str, found))


def test_the_counter_sees_a_private_import_across_folders(tmp_path, monkeypatch):
    """The counter above can fail: a file in nn/ importing core's _split is counted, one importing
    a private name of its own folder is not."""
    package = tmp_path / "attention_ref"
    (package / "nn").mkdir(parents=True)
    (package / "core").mkdir()
    (package / "nn" / "a.py").write_text("from ..core.heads import _split\nfrom .b import _c\n")
    (package / "core" / "heads.py").write_text("def _split(x, h):\n    return x\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", package)
    assert underscore_imports_across_folders() == [("nn/a.py", "core.heads", "_split")]


def test_the_token_checks_live_in_their_own_module():
    """_pair_checks.py holds the core pairs' checks; the token checks of nn and models are in
    _token_checks.py."""
    from attention_ref import _pair_checks, _token_checks

    for name in ("as_token_ids", "check_embedding_inputs", "check_cross_entropy_inputs", "as_attention_mask",
                 "check_next_token_inputs"):
        assert hasattr(_token_checks, name) and not hasattr(_pair_checks, name), name
