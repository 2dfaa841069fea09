"""The book in a real browser: ``python -m attention_ref book`` builds it, and headless Chromium
(Debian's ``chromium`` and ``chromium-driver``, driven by Selenium; nothing downloads a browser)
opens every page from disk: no console errors, every image loaded, the maths typeset where there
is maths (MathJax's elements present, no raw ``$$`` or ``\\frac`` left), every internal link
resolving to a built file, nothing fetched from the network. Screenshots of the home page and
two lessons are kept under ``OUT/screenshots/``.

Skipped cleanly where the book's tools (``pip install -e ".[book]"``) or the browser are absent.
"""
import re
import shutil
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

pytest.importorskip("myst_nb", reason='the book needs its tools: pip install -e ".[book]"')
pytest.importorskip("sphinx_book_theme", reason='the book needs its tools: pip install -e ".[book]"')
webdriver = pytest.importorskip("selenium.webdriver", reason='the browser test drives chromium with selenium')

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if not (CHROMIUM and DRIVER):
    pytest.skip("no chromium and chromedriver here (Debian: apt-get install chromium chromium-driver)",
                allow_module_level=True)

from attention_ref.documents.book import DOC_PAGES, MARKER, build  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    out = tmp_path_factory.mktemp("book") / "site"  # a folder of its own: what is beside it is checked
    build(out)
    return out


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,1600", "--allow-file-access-from-files"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _pages(book):
    lessons = [p.stem for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    return ["index"] + lessons + list(DOC_PAGES)


def test_every_page_is_built_in_order(book):
    names = _pages(book)
    assert all((book / f"{n}.html").exists() for n in names)
    home = (book / "index.html").read_text(encoding="utf-8")
    positions = [home.find(f'href="{n}.html"') for n in names[1:]]
    assert all(p > 0 for p in positions) and positions == sorted(positions), "the table of contents' order"
    for lesson in [n for n in names if n[:2].isdigit()]:
        text = (book / f"{lesson}.html").read_text(encoding="utf-8")
        words = " ".join(re.sub(r"<[^>]+>", "", text).split())  # the page's text, without its markup
        assert f"python -m pytest tests/test_notebooks.py -k {lesson}" in words, lesson
        assert 'rel="next"' in text or lesson == names[-1]


def test_nothing_is_written_beside_the_book(book):
    """Sphinx's doctrees and myst-nb's jupyter_execute/ stay in the temporary build, removed."""
    assert [p.name for p in book.parent.iterdir()] == [book.name]
    assert (book / MARKER).is_file()


def test_no_tex_outside_the_maths(book):
    """Every bit of TeX sits in a maths element for MathJax: a display block that myst-nb did not take as maths
    (for instance $$ glued to the line above it) leaves its TeX, and the dollars after it, as plain page text."""
    tex = re.compile(r"\\(mathrm|frac|sqrt|hat|odot|text|lVert|big|Big)\b|\$")
    for page in sorted(book.glob("[0-9][0-9]_*.html")):
        text = page.read_text(encoding="utf-8")
        main = text[text.find("<main"):text.find("</main>")]
        # the theme's print-only header repeats the title as plain text (never shown on screen): not the lesson's text
        main = re.sub(r'class="onlyprint">\s*<h1>.*?</h1>', 'class="onlyprint">', main, flags=re.S)
        for pattern in (r'<span class="math[^"]*">.*?</span>', r'<div class="math[^"]*"[^>]*>.*?</div>',
                        r"<pre.*?</pre>", r"<code.*?</code>"):
            main = re.sub(pattern, "", main, flags=re.S)
        words = re.sub(r"<[^>]+>", "", main)
        found = [words[max(0, m.start() - 30):m.end() + 30] for m in tex.finditer(words)]
        assert not found, f"{page.name}: TeX outside the maths: {found[:2]}"


def test_nothing_is_fetched_from_the_network(book):
    for page in book.glob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert not re.search(r'(src|href)="(https?:)?//[^"]*\.(js|css|woff2?)', text), page.name


def test_every_page_in_a_real_browser(book, browser):
    shots = book / "screenshots"
    shots.mkdir(exist_ok=True)
    for name in _pages(book):
        page = book / f"{name}.html"
        browser.get(page.as_uri())
        browser.get_log("browser")  # clear what the previous page left
        browser.get(page.as_uri())
        has_maths = 'class="math' in page.read_text(encoding="utf-8")  # maths in the page or its sidebar
        if has_maths:  # MathJax typesets after the page has loaded: wait until its count settles
            from selenium.webdriver.support.ui import WebDriverWait

            count = "return document.querySelectorAll('mjx-container').length"
            WebDriverWait(browser, 60).until(lambda b: b.execute_script(count) > 0, f"{name}: no maths typeset")
            seen = -1
            while seen != browser.execute_script(count):
                seen = browser.execute_script(count)
                time.sleep(0.3)
            body = browser.execute_script(  # the prose only: code may hold LaTeX for matplotlib's labels
                "const code = [...document.querySelectorAll('pre, code, div.cell_input')];"
                "code.forEach(e => { e.dataset.display = e.style.display; e.style.display = 'none'; });"
                "const text = document.querySelector('main, article, body').innerText;"
                "code.forEach(e => { e.style.display = e.dataset.display; });"
                "return text")
            assert not re.search(r"\$\$|\\(frac|mathrm|sqrt|hat|odot|text)\b", body), f"{name}: raw maths left"
        wide = browser.execute_script(  # code and outputs fit the text column (they wrap, see book.py's CSS)
            "return [...document.querySelectorAll('div.highlight pre, div.cell_output pre')]"
            ".filter(p => p.scrollWidth > p.clientWidth + 1).length")
        assert not wide, f"{name}: {wide} code blocks wider than the text column"
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, f"{name}: console errors {errors[:3]}"
        broken = browser.execute_script(
            "return [...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)")
        assert not broken, f"{name}: images not loaded {broken[:3]}"
        for href in browser.execute_script("return [...document.querySelectorAll('a[href]')].map(a => a.href)"):
            url = urlparse(href)
            if url.scheme == "file":
                target = Path(unquote(url.path))
                assert target.exists(), f"{name}: a link to {target.name}, which is not in the book"
        if name in ("index", "01_scaled_dot_product_attention", "07_backward_passes_and_gradcheck"):
            browser.save_screenshot(str(shots / f"{name}.png"))
    assert len(list(shots.glob("*.png"))) == 3
