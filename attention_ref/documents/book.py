"""``python -m attention_ref book [OUT]``: the lessons and docs as a website, built offline.

The book is built with Sphinx, myst-nb (the notebooks with their committed outputs, never
executed here: the test suite executes and checks them) and sphinx-book-theme, with MathJax
served from the built folder (``sphinx-mathjax-offline``): building needs no network beyond
installing the ``book`` extra, and reading none at all. It renders, in the reading guide's
order, the README's first screen as the home page, the numbered notebooks and the docs pages.

The sources are this checkout's files, copied into a scratch folder and lightly rewritten:
links between them become links between pages, links to files the book does not hold become
plain text, and each lesson gets a line under its title saying that its numbers are asserted
by the test suite, with the command that re-runs it. Nothing in the checkout is written, and
nothing outside OUT: the build happens in a temporary folder beside OUT and is renamed into place;
OUT must be new, empty or an earlier build (a marker file says so), never ``.``, the checkout or
the home folder.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["build", "check_out", "main", "DOC_PAGES", "MARKER"]

ROOT = Path(__file__).resolve().parents[2]
#: the docs pages, in the book's order, after the lessons
DOC_PAGES = ("reading_guide", "notation", "answers", "bibliography", "claims", "variants", "training", "whole_models",
             "for_courses", "exercises", "performance", "model_mappings", "development")
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")

_CONF = '''
project = "attention_ref"
author = "attention_ref"
extensions = ["myst_nb", "sphinx-mathjax-offline"]
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath", "amsmath"]
html_theme = "sphinx_book_theme"
html_title = "attention_ref"
html_theme_options = {"show_navbar_depth": 1, "use_download_button": False, "use_fullscreen_button": False}
html_show_sourcelink = False
html_context = {"default_mode": "light"}  # the theme's mode is set, so its script has nothing to reset
exclude_patterns = ["_build", "notebooks/data"]  # the lessons' data (a kept model's README.md is not a page)
html_static_path = ["_static"]
html_css_files = ["wide.css"]  # a text column wide enough for the lessons' code lines
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]


def setup(app):
    app.set_html_assets_policy("always")  # MathJax on every page: titles with maths sit in every sidebar
'''


#: the theme's article column is about 50em: the lessons' code lines (up to about 110 characters)
#: wrapped or scrolled in it; this widens the column and the page to hold them, and wraps whatever is still
#: wider (a narrow window, a long output line) inside the column instead of letting it overflow
_WIDE_CSS = """
.bd-page-width { max-width: 96rem; }
.bd-main .bd-content .bd-article-container { max-width: 72em; }
div.highlight pre, div.cell_output pre, div.output pre {
  white-space: pre-wrap; overflow-wrap: anywhere; overflow-x: hidden; max-width: 100%;
}
"""


def _sources():
    """(lessons, docs pages) of this checkout, or SystemExit when it is not one."""
    lessons = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    docs = [ROOT / "docs" / f"{name}.md" for name in DOC_PAGES]
    missing = [str(p) for p in docs if not p.exists()]
    if not lessons or missing or not (ROOT / "README.md").exists():
        raise SystemExit(f"the book is built from a checkout of attention_ref (notebooks/, docs/, README.md next to"
                         f" the package); not found under {ROOT}: {missing or 'notebooks/'}")
    return lessons, docs


def _rewrite(text: str, origin: Path, pages: dict, copied: set) -> str:
    """Markdown links of a file at ``origin``: to a page -> the page, to a copied file -> its
    copy, anything else (source files, folders, the web) -> text, or kept when external."""
    def link(m):
        bang, label, target = m.groups()
        if re.match(r"[a-z]+://|mailto:", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        if not path:  # an anchor on the same page; the home page holds only the README's first screen
            return label if origin.name == "README.md" and not bang else m.group(0)
        resolved = (origin.parent / path).resolve()
        if resolved in pages:
            return f"{bang}[{label}]({pages[resolved]}{'#' + anchor if anchor else ''})"
        if resolved in copied:
            return f"{bang}[{label}]({resolved.relative_to(ROOT).as_posix()})"
        return label if not bang else ""  # not in the book: the words stay, the link goes
    return _LINK.sub(link, text)


def _front_page(readme: str) -> str:
    """The README's first screen: everything before its first section after "Start here"."""
    lines = readme.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "## Start here")
        end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    except StopIteration:
        end = len(lines)
    return "\n".join(lines[:end]) + "\n"


def _banner(name: str) -> str:
    return (f"> **Checked on every run of the tests.** Every number this page prints is asserted in the"
            f" notebook itself, and `tests/test_notebooks.py` executes it and compares its outputs with"
            f" these: `python -m pytest tests/test_notebooks.py -k {name}`.\n")


MARKER = ".attention_ref_book"  # left in every build: a folder holding it may be replaced by the next


def check_out(out) -> Path:
    """The resolved folder ``out`` if the book may be built there, else ValueError in one line:
    a file, ``.`` or a folder holding it, the checkout, the home folder (or one above them), or a
    non-empty folder that is not an earlier build of the book (no marker) are refused."""
    given = str(out)
    out = Path(os.path.realpath(os.path.abspath(os.path.expanduser(given))))
    if out.exists() and not out.is_dir():
        raise ValueError(f"book OUT {given!r} is a file, not a folder: give a new or empty folder")
    here = Path(os.path.realpath(os.getcwd()))
    for name, keep in (("this checkout", Path(os.path.realpath(ROOT))), ("the current folder", here),
                       ("the home folder", Path(os.path.realpath(os.path.expanduser("~"))))):
        if out == keep or out in keep.parents:
            raise ValueError(f"book OUT {given!r} is {name} or holds it ({keep}): give a new folder, such as"
                             f" _build/book")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise ValueError(f"book OUT {given!r} is a non-empty folder that is not an earlier build of the book (it"
                         f" has no {MARKER}): give a new or empty folder; nothing was written")
    return out


def _end_with_parent():
    """For Sphinx's process: on Linux, the kernel sends it SIGTERM when this process dies, even
    by SIGKILL (``PR_SET_PDEATHSIG``); elsewhere None (an exception here still kills it)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def set_death_signal():  # runs in the child, between fork and exec
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # this process died before the line above
            os._exit(1)

    return set_death_signal


def build(out="_build/book", quiet=True) -> Path:
    """Build the book into the folder ``out``; returns the path of its ``index.html``.

    ``out`` must be new, empty or an earlier build (see :func:`check_out`). The book is built in a
    temporary folder beside ``out`` and renamed into place, so ``out`` is always a whole build;
    the previous build is removed only once the new one is there. Nothing is written outside
    ``out`` (the temporary folder, Sphinx's doctrees and myst-nb's scratch folder are removed)."""
    out = check_out(out)
    lessons, docs = _sources()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        src, html = work / "src", work / "html"
        src.mkdir()
        pages = {ROOT / "README.md": "index.md"}
        pages.update({p.resolve(): p.name for p in lessons})
        pages.update({p.resolve(): p.name for p in docs})
        copied = set()
        for folder in ("docs/figures", "notebooks/data"):
            if (ROOT / folder).is_dir():
                shutil.copytree(ROOT / folder, src / folder)
                copied |= {p.resolve() for p in (ROOT / folder).rglob("*") if p.is_file()}
        for png in (ROOT / "docs").glob("*.png"):
            (src / "docs").mkdir(exist_ok=True)
            shutil.copy(png, src / "docs" / png.name)
            copied.add(png.resolve())
        # the home page, then the docs pages: links rewritten
        home = _rewrite(_front_page((ROOT / "README.md").read_text(encoding="utf-8")), ROOT / "README.md", pages,
                        copied)
        order = [p.stem for p in lessons] + [p.stem for p in docs]
        toc = "\n".join(["", "```{toctree}", ":maxdepth: 1", ":caption: Lessons", ""] + [p.stem for p in lessons]
                        + ["```", "", "```{toctree}", ":maxdepth: 1", ":caption: Docs", ""]
                        + [p.stem for p in docs] + ["```", ""])
        (src / "index.md").write_text(home + toc, encoding="utf-8")
        for page in docs:
            text = _rewrite(page.read_text(encoding="utf-8"), page, pages, copied)
            (src / page.name).write_text(text, encoding="utf-8")
        # the lessons: their markdown cells' links rewritten, the banner under the title
        for lesson in lessons:
            nb = json.loads(lesson.read_text(encoding="utf-8"))
            for cell in nb["cells"]:
                if cell["cell_type"] == "markdown":
                    source = "".join(cell["source"])
                    cell["source"] = _rewrite(source, lesson, pages, copied)
            first = nb["cells"][0]
            title, _, rest = "".join(first["source"]).partition("\n")
            if first["cell_type"] == "markdown" and title.startswith("# "):  # the line right under the title
                first["source"] = f"{title}\n\n{_banner(lesson.stem)}\n{rest}"
            else:
                nb["cells"].insert(0, {"cell_type": "markdown", "id": "checked-by-the-tests", "metadata": {},
                                       "source": _banner(lesson.stem)})
            (src / lesson.name).write_text(json.dumps(nb), encoding="utf-8")
        (src / "conf.py").write_text(_CONF, encoding="utf-8")
        (src / "_static").mkdir(exist_ok=True)
        (src / "_static" / "wide.css").write_text(_WIDE_CSS, encoding="utf-8")
        # doctrees in the scratch folder; myst-nb writes its jupyter_execute/ beside the html folder: inside too
        cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-d", str(work / "doctrees"), str(src), str(html)]
        result = subprocess.run(cmd, capture_output=True, text=True, cwd=work, preexec_fn=_end_with_parent())
        if result.returncode:
            raise SystemExit(f"sphinx-build failed:\n{result.stderr[-4000:]}")
        if not quiet and result.stderr.strip():
            print(result.stderr.strip(), file=sys.stderr)
        (html / MARKER).write_text("built by python -m attention_ref book; the next build may replace this folder\n",
                                   encoding="utf-8")
        if out.exists():  # empty, or an earlier build (check_out said so): it goes only after the new one is in
            check_out(out)  # still so, after the build's minutes
            os.replace(out, work / "previous")
        os.replace(html, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert order  # every page is in one of the two tables of contents
    return out / "index.html"


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m attention_ref book",
                                     description="Build the lessons and docs as a website (needs the book extra).")
    parser.add_argument("out", nargs="?", default="_build/book", help="output folder (default: _build/book)")
    args = parser.parse_args(argv)
    try:
        check_out(args.out)  # the target first: a refused OUT is refused whatever is installed
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if sys.version_info < (3, 11):
        print("the book's tools (Sphinx 9, myst-nb 1.4) need Python 3.11 or newer", file=sys.stderr)
        return 2
    try:
        import myst_nb  # noqa: F401
        import sphinx_book_theme  # noqa: F401
    except ImportError:
        print('the book needs its tools: python -m pip install -e ".[book]"', file=sys.stderr)
        return 2
    print("building the book (Sphinx, myst-nb; the notebooks' committed outputs, no execution) ...", flush=True)

    def stop(signum, frame):  # SIGTERM unwinds: Sphinx is killed and the temporary folder removed
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        index = build(args.out, quiet=False)
    except (ValueError, OSError) as e:
        print(f"book: {e}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"wrote {index}: open it in a browser (no network needed)")
    return 0
