"""``python -m attention_ref book OUT`` deletes nothing it did not create and writes nothing outside OUT.

Refusals (a file, ``.``, a folder above it, the checkout, the home folder, a non-empty folder that is
not an earlier build) are one line on stderr with exit status 2 and leave everything as it was. The
build itself is tested with Sphinx replaced by a stand-in that writes what Sphinx and myst-nb write
(the html folder, and ``jupyter_execute/`` beside it), so these tests run without the book's tools;
``tests/test_book.py`` builds the real book.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attention_ref.documents import book
from tests._helpers import run_package

ROOT = Path(__file__).resolve().parents[1]


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


def _cli(out, cwd, env=None):
    return run_package("book", str(out), cwd=cwd, env=env)


@pytest.fixture
def fake_sphinx(monkeypatch):
    """Sphinx's stand-in: writes OUTDIR/index.html and OUTDIR/../jupyter_execute/x, as myst-nb does."""
    calls = []

    def run(cmd, **kwargs):
        html = Path(cmd[-1])
        html.mkdir(parents=True)
        (html / "index.html").write_text(f"<p>build {len(calls)}</p>")
        (html.parent / "jupyter_execute").mkdir(exist_ok=True)
        (html.parent / "jupyter_execute" / "x.ipynb").write_text("{}")
        calls.append(cmd)
        if getattr(run, "fail", False):
            return subprocess.CompletedProcess(cmd, 1, "", "sphinx says no")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(book.subprocess, "run", run)
    return run


@pytest.mark.parametrize("case", ["file", "foreign", "dot", "above_dot", "checkout", "docs", "home"])
def test_refused_targets_are_one_line_and_untouched(tmp_path, case):
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "thesis.tex").write_text("my thesis")
    env = {}
    if case == "file":
        out = cwd / "thesis.tex"
    elif case == "foreign":
        out = cwd / "thesis"
        out.mkdir()
        (out / "chapter1.md").write_text("words")
    elif case == "dot":
        out = "."
    elif case == "above_dot":
        out = ".."
    elif case == "checkout":
        out = ROOT
    elif case == "docs":
        out = ROOT / "docs"
    else:
        env = {"HOME": str(cwd)}
        out = "~"
    before, root_before = _snapshot(tmp_path), _snapshot(ROOT / "docs")
    result = _cli(out, cwd, env)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "book OUT" in lines[0]
    assert _snapshot(tmp_path) == before and _snapshot(ROOT / "docs") == root_before


def test_messages_say_why():
    with pytest.raises(ValueError, match="is a file, not a folder"):
        book.check_out(ROOT / "README.md")
    with pytest.raises(ValueError, match="this checkout"):
        book.check_out(ROOT)
    with pytest.raises(ValueError, match="not an earlier build"):
        book.check_out(ROOT / "docs")


def test_a_build_goes_into_place_with_a_marker_and_nothing_beside_it(tmp_path, monkeypatch, fake_sphinx):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("mine")
    index = book.build("site")
    assert index == tmp_path / "site" / "index.html" and index.read_text() == "<p>build 0</p>"
    assert (tmp_path / "site" / book.MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt", "site"]  # no jupyter_execute, no temp
    assert fake_sphinx  # the stand-in ran
    # an earlier build is replaced; an empty folder is used
    assert book.build("site").read_text() == "<p>build 1</p>"
    (tmp_path / "empty").mkdir()
    book.build(tmp_path / "empty")
    assert (tmp_path / "empty" / "index.html").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "keep.txt", "site"]


def test_a_failed_build_leaves_the_earlier_one_and_no_temporary_folder(tmp_path, monkeypatch, fake_sphinx):
    monkeypatch.chdir(tmp_path)
    book.build("site")
    before = _snapshot(tmp_path)
    fake_sphinx.fail = True
    with pytest.raises(SystemExit, match="sphinx-build failed"):
        book.build("site")
    assert _snapshot(tmp_path) == before


def test_a_folder_filled_by_someone_during_the_build_is_not_replaced(tmp_path, monkeypatch, fake_sphinx):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site").mkdir()
    real = fake_sphinx

    def run(cmd, **kwargs):
        (tmp_path / "site" / "notes.txt").write_text("written meanwhile")
        return real(cmd, **kwargs)

    monkeypatch.setattr(book.subprocess, "run", run)
    with pytest.raises(ValueError, match="not an earlier build"):
        book.build("site")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]
    assert (tmp_path / "site" / "notes.txt").read_text() == "written meanwhile"


def test_the_book_command_sits_beside_the_other_commands():
    assert not (ROOT / "attention_ref" / "book.py").exists()
    assert (ROOT / "attention_ref" / "documents" / "book.py").exists()


_FAKE_SPHINX = '''
import os, sys, time
out = sys.argv[-1]
os.makedirs(out)
with open(os.environ["FAKE_SPHINX_PID"] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(os.environ["FAKE_SPHINX_PID"] + ".tmp", os.environ["FAKE_SPHINX_PID"])
time.sleep(120)
'''


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads processes from /proc")
@pytest.mark.skipif(sys.version_info < (3, 11), reason="the book command needs Python 3.11 (its tools' releases) and"
                    " stops before starting Sphinx on 3.10")
@pytest.mark.parametrize("signum", [15, 9])
def test_sphinx_ends_with_the_book_command(tmp_path, signum):
    """A stand-in Sphinx that sleeps; the book command gets SIGTERM or SIGKILL: Sphinx is gone
    within seconds, the earlier build is untouched, and after SIGTERM no temporary folder is left."""
    fake = tmp_path / "fake"
    (fake / "sphinx").mkdir(parents=True)
    (fake / "sphinx" / "__init__.py").write_text("")
    (fake / "sphinx" / "__main__.py").write_text(_FAKE_SPHINX)
    for name in ("myst_nb", "sphinx_book_theme"):
        (fake / f"{name}.py").write_text("")
    work = tmp_path / "work"
    (work / "site").mkdir(parents=True)
    (work / "site" / book.MARKER).write_text("an earlier build")
    (work / "site" / "index.html").write_text("old")
    before = _snapshot(work)
    pid_file = tmp_path / "sphinx.pid"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)]), "FAKE_SPHINX_PID": str(pid_file)}
    command = subprocess.Popen([sys.executable, "-m", "attention_ref", "book", "site"], cwd=work, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline and command.poll() is None:
            time.sleep(0.05)
        assert pid_file.exists(), command.stderr.read().decode()[-2000:]
        sphinx = int(pid_file.read_text())
        assert _alive(sphinx)
        command.send_signal(signum)
        command.wait(timeout=30)
        deadline = time.monotonic() + 3
        while _alive(sphinx) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(sphinx), "Sphinx outlived the book command"
        assert (work / "site" / "index.html").read_text() == "old"
        if signum == 15:
            assert _snapshot(work) == before, "a temporary folder was left beside OUT"
            assert "Traceback" not in command.stderr.read().decode()
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
        command.stderr.close()
