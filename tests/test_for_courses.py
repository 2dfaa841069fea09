"""docs/for_courses.md: its examples print what the page says (the adapters it describes are
checked against torch in tests/test_course_adapters.py)."""
import contextlib
import io
import pathlib
import re

import pytest

PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "for_courses.md"
TEXT = PAGE.read_text(encoding="utf-8")
EXAMPLES = re.findall(r"```python\n((?:(?!```).)*?)```\s*\nprints\s*\n\s*```text\n(.*?)```", TEXT, flags=re.S)


def test_the_page_has_its_examples():
    assert len(EXAMPLES) == 3


@pytest.mark.parametrize("code, expected", EXAMPLES, ids=[f"example {i}" for i in range(len(EXAMPLES))])
def test_example_prints_what_the_page_shows(code, expected):
    if re.search(r"^import torch", code, flags=re.M):
        pytest.importorskip("torch")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code, "docs/for_courses.md", "exec"), {})
    assert buffer.getvalue().strip() == expected.strip()


def test_the_page_links_exist():
    for target in re.findall(r"\]\(([^)#]+)\)", TEXT):
        assert (PAGE.parent / target).exists(), target
