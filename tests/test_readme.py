"""The README's first example runs and prints exactly what the README says it prints."""
import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _blocks(text, lang):
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_first_example_prints_what_the_readme_shows():
    text = README.read_text(encoding="utf-8")
    code, expected = _blocks(text, "python")[0], _blocks(text, "text")[0]
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code, "README.md", "exec"), {})
    assert buffer.getvalue().strip() == expected.strip()


def test_readme_starts_with_the_two_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    fence = lines.index("```")
    commands = lines[fence + 1:fence + 3]
    assert commands == ['python -m pip install -e . && python -m attention_ref',
                        'python -m pip install -e ".[test]" && python -m pytest']
