"""The README's examples run and print exactly what the README says they print."""
import contextlib
import io
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
TEXT = README.read_text(encoding="utf-8")
# every ```python block followed by "prints" and a ```text block with its output
# (a code block never spans a fence: a block without "prints" after it is not an example)
EXAMPLES = re.findall(r"```python\n((?:(?!```).)*?)```\s*\nprints\s*\n\s*```text\n(.*?)```", TEXT, flags=re.S)


def test_readme_has_examples():
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("code, expected", EXAMPLES, ids=[f"example {i}" for i in range(len(EXAMPLES))])
def test_example_prints_what_the_readme_shows(code, expected):
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code, "README.md", "exec"), {})
    assert buffer.getvalue().strip() == expected.strip()


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
