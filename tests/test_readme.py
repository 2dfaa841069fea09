"""The README runs as written: every Python block, each on its own in an empty folder (as a reader
pastes it into a fresh session), and those followed by "prints" print exactly what the README shows.

A block whose first line is ``# needs torch and transformers: ...`` is skipped (saying so) where
torch or transformers is not installed; the README says how to install them before the first such
block."""
import contextlib
import io
import pathlib
import re

import pytest

import attention_ref  # noqa: F401  (imported before the blocks change folder: the one of this checkout)

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
TEXT = README.read_text(encoding="utf-8")
# every ```python block, with the ```text block after it when "prints" follows it
# (a code block never spans a fence)
BLOCKS = re.findall(r"```python\n((?:(?!```).)*?)```(\s*\nprints\s*\n\s*```text\n(.*?)```)?", TEXT, flags=re.S)
EXAMPLES = [(code, expected) for code, follows, expected in BLOCKS if follows]
NEEDS_TORCH = "# needs torch and transformers"


def test_readme_has_examples():
    assert len(EXAMPLES) >= 4 and len(BLOCKS) >= 4


@pytest.mark.parametrize("code, follows, expected", BLOCKS, ids=[f"block {i}" for i in range(len(BLOCKS))])
def test_every_python_block_runs_in_an_empty_folder(code, follows, expected, tmp_path, monkeypatch):
    if code.startswith(NEEDS_TORCH):
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)  # empty: whatever a block reads, it writes first
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})
    if follows:
        assert buffer.getvalue().strip() == expected.strip()


def test_torch_is_installed_before_it_is_needed():
    """The install line of the interop extra comes before the first block that needs it, and every
    block that imports torch or transformers says so on its first line."""
    first = min(TEXT.index(f"```python\n{code}") for code, _, _ in BLOCKS if code.startswith(NEEDS_TORCH))
    assert TEXT.index('pip install -e ".[interop]"') < first
    for code, _, _ in BLOCKS:
        if re.search(r"^\s*(import|from) (torch|transformers)\b", code, flags=re.M):
            assert code.startswith(NEEDS_TORCH), code.splitlines()[0]


def test_the_loading_dtype_is_said_as_it_is():
    """load_pretrained keeps the stored dtype: the README says so and shows dtype=np.float64."""
    assert "float64 by default" not in TEXT
    assert "load_pretrained(folder, dtype=np.float64)" in TEXT and 'dtype=np.float64)' in TEXT


def test_readme_starts_with_the_two_commands():
    lines = TEXT.splitlines()
    fence = lines.index("```")
    assert lines[fence + 1:fence + 3] == ['python -m pip install -e . && python -m attention_ref',
                                          'python -m pip install -e ".[test]" && python -m pytest']
    assert lines[fence + 3] == "```"


def test_linked_files_exist():
    root = README.parent
    for target in re.findall(r"\]\(([^)#]+)\)", TEXT):
        assert (root / target).exists(), target


def test_training_line_matches_the_recorded_demo():
    """The README quotes the demo's final line; the numbers come from the JSON that
    tests/documents/test_toy_task.py re-trains and checks (seed 0, full length)."""
    import json

    demo = json.loads((README.parent / "docs" / "training_results.json").read_text())["demo"]
    line = f"single-head final loss: {demo['single']:.4f}  multi-head final loss: {demo['multi']:.4f}"
    assert f"`{line}`" in TEXT


def test_performance_table_matches_the_recorded_benchmark():
    """The README's headline rows are the committed benchmark run, not hand-typed numbers."""
    import json

    run = json.loads((README.parent / "docs" / "performance_table.json").read_text())
    torch_rows = {(r["dtype"], r["B"], r["N"]): r for r in run["torch"]["rows"]}
    for r in run["numpy"]["rows"]:
        fast, reference = r["fast"]["median"], r["reference"]["median"]
        theirs = torch_rows[(r["dtype"], r["B"], r["N"])]["torch"]["median"]
        gflops = r["flops"] / fast / 1e9
        row = (f"| {r['dtype']} | {r['B']} | {r['N']:,} | {fast * 1e3:.0f} ms | {gflops:.1f} |"
               f" {100 * gflops / r['peak']:.0f}% | {reference * 1e3:.0f} ms | {theirs * 1e3:.0f} ms |"
               f" {fast / theirs:.2f} |")
        assert row in TEXT, row
