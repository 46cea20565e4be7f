"""The documentation site as a reader sees it: built, served and opened in headless Chromium.

``mkdocs build --strict`` into a temporary directory, served on localhost, and the home,
API reference, LLM and semantics pages opened in Chromium (``--dump-dom`` after the
page's scripts, KaTeX included, have run). In each page's article it fails on:

* raw reStructuredText or Markdown left in the rendered text: directives
  (``.. math::``), roles (``:func:``), literal-block markers (``Example::``), docstring
  section headers as plain text (``Args:``), literal ``**``, stray backticks, ``$$``,
  ``\\(``, TeX commands, unrendered ``[text](link)`` or ``[text][ref]``;
* a doctest's ``>>>`` shown as text or as nested quotes, a docstring section item with
  nothing before its dash (``– (advantages, ...)``: a Returns section read line by line);
* unrendered math: an arithmatex span or block without KaTeX's markup in it, a KaTeX
  error, or (API page) no rendered math at all;
* broken cross-references: a link to a page or an anchor that the site does not have,
  mkdocs-autorefs' unresolved references, and ``<em>`` that Markdown made from the
  underscores of math (``V'<em>t = V</em>{t+1}``).

Skipped where Chromium is not installed (Debian: ``apt-get install -y chromium``).
``RL_TRITON_CORE_SCREENSHOTS=<dir>`` also saves a 1280-pixel-wide PNG of the home, API
and LLM pages there (docs/img holds the committed ones).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p),
    None,
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="needs headless Chromium on PATH (Debian/Ubuntu: apt-get install -y chromium)",
)

# page -> whether it must show rendered math
PAGES = {"index.html": False, "api/index.html": True, "llm/index.html": False,
         "semantics/index.html": False}
SCREENSHOTS = {"index.html": "site-home.png", "api/index.html": "site-api.png",
               "llm/index.html": "site-llm.png"}

# In the article's text outside code, math and generated section titles:
LEFTOVERS = [
    ("RST directive", re.compile(r"\.\.\s+[a-z][\w-]*::")),
    ("RST role", re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|ref|doc|"
                            r"math|term|any):")),
    ("RST literal-block marker", re.compile(r"\S::(?:\s|$)")),
    ("docstring section as text", re.compile(
        r"^\s*(?:Args|Arguments|Keyword Args|Parameters|Returns?|Raises|Yields|Attributes|"
        r"Examples?|Notes?|Warnings?)::?\s*$|^\s*(?:Args|Arguments|Returns|Raises|Yields):\s")),
    ("literal **", re.compile(r"\*\*")),
    ("stray backtick", re.compile(r"`")),
    ("raw math delimiter", re.compile(r"\$\$|\\[()\[\]]|(?<![\w$])\$[^\s$][^$]*\$")),
    ("raw TeX command", re.compile(r"\\[A-Za-z]{2,}")),
    ("doctest prompt as text", re.compile(r"(?:^|\s)>>>(?:\s|$)")),
    ("unrendered Markdown link", re.compile(r"\]\(\S*\)|\]\[[\w.:-]*\]")),
]
BLOCK = {"p", "div", "li", "ul", "ol", "td", "th", "tr", "table", "dd", "dt", "dl", "br",
         "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "details", "summary", "section",
         "pre", "hr"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}
# not prose: code, scripts, KaTeX's output (its MathML holds the TeX source), permalinks
# and mkdocstrings' generated section titles ("Parameters:")
SKIP_TAGS = {"code", "pre", "script", "style", "svg", "annotation", "math"}
SKIP_CLASSES = {"katex", "katex-display", "headerlink", "doc-section-title", "arithmatex"}


class _Page(HTMLParser):
    """Reads a dumped DOM: the article's prose, its math, <em>s, links and element ids."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool, bool]] = []  # (tag, in article, skipped)
        self.text: list[str] = []
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.problems: list[str] = []
        self.katex = 0
        # open arithmatex elements: [rendered, source text, stack depth outside it]
        self.math: list[list] = []
        self.ems: list[list] = []  # open <em>s: [text before, content, in skipped text]
        self.items: list[list] = []  # open docstring section items: [depth, all their text]

    def _state(self):
        return self.stack[-1][1:] if self.stack else (False, False)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = set((attrs.get("class") or "").split())
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        article, skipped = self._state()
        article = article or tag == "article"
        if article and tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if article and tag == "autoref":
            self.problems.append(f"unresolved cross-reference: {attrs}")
        if classes & {"katex", "katex-display"}:
            self.katex += 1
            for m in self.math:
                m[0] = True
        if "katex-error" in classes:
            self.problems.append(f"KaTeX error: {attrs.get('title', '')}")
        if article and "arithmatex" in classes and tag not in VOID:
            self.math.append([False, "", len(self.stack)])
        if article and tag == "em":
            self.ems.append(["".join(self.text)[-1:], "", skipped])
        if article and tag == "blockquote" and any(t == "blockquote" for t, _, _ in self.stack):
            self.problems.append("nested blockquotes: a doctest's >>> read as Markdown quotes "
                                 "(an Examples section the docstring parser did not see)")
        if article and tag == "li" and "doc-section-item" in classes:
            self.items.append([len(self.stack), ""])
        if article and tag in BLOCK:
            self.text.append("\n")
        skipped = skipped or tag in SKIP_TAGS or bool(classes & SKIP_CLASSES)
        if tag not in VOID:
            self.stack.append((tag, article, skipped))

    def handle_endtag(self, tag):
        if tag in VOID or not any(t == tag for t, _, _ in self.stack):
            return
        while self.stack:
            top, article, _ = self.stack.pop()
            if article and top in BLOCK:
                self.text.append("\n")
            if top == "em" and self.ems and article:
                before, inner, in_code = self.ems.pop()
                # Markdown's emphasis from math: "V'_t = V_{t+1}" -> V'<em>t = V</em>{t+1}
                if not in_code and re.match(r"[\w'}\])]", before) or re.search(r"[{}_^\\]", inner):
                    self.problems.append(f"<em> from math underscores: ...{before}<em>{inner}"
                                         "</em>...")
            if self.items and len(self.stack) == self.items[-1][0]:
                text = self.items.pop()[1].strip()
                if text.startswith("\u2013"):  # mkdocstrings' "name – description"
                    self.problems.append(f"section item with nothing before its dash: "
                                         f"{' '.join(text.split())[:80]!r}")
            if self.math and len(self.stack) == self.math[-1][2]:  # its element closed
                rendered, source, _ = self.math.pop()
                if not rendered:
                    self.problems.append(f"unrendered math: {source.strip()[:80]}")
            if top == tag:
                break

    def handle_data(self, data):
        article, skipped = self._state()
        for m in self.math:
            m[1] += data
        for item in self.items:
            item[1] += data
        if article and not skipped:
            self.text.append(data)
            for e in self.ems:
                e[1] += data

    def prose(self) -> str:
        return "".join(self.text)


def _parse(dom: str) -> _Page:
    page = _Page()
    page.feed(dom)
    page.close()
    return page


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-extensions", "--no-first-run", "--no-default-browser-check",
           "--hide-scrollbars", f"--user-data-dir={profile}", "--virtual-time-budget=5000",
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built strictly and served on localhost: (base URL, site dir, scratch)."""
    tmp = tmp_path_factory.mktemp("site_browser")
    out = tmp / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                            str(out)], cwd=ROOT, capture_output=True, text=True, env=env,
                           timeout=600, check=False)
    assert build.returncode == 0, (
        "mkdocs build --strict failed (the docs extras: pip install -e '.[docs]'):\n"
        + build.stdout[-3000:] + build.stderr[-6000:])

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=out))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", out, tmp
    finally:
        server.shutdown()
        server.server_close()


def _dom(url: str, tmp: Path) -> str:
    res = _chromium("--dump-dom", url, profile=tmp / "profile-dom")
    assert res.returncode == 0 and "</html>" in res.stdout, (
        f"chromium --dump-dom {url} failed (rc {res.returncode}):\n{res.stderr[-3000:]}")
    return res.stdout


def _check(page: _Page, rel: str, needs_math: bool, site_dir: Path) -> list[str]:
    problems = list(page.problems)
    prose = page.prose()
    for line in prose.splitlines():
        for what, pattern in LEFTOVERS:
            m = pattern.search(line)
            if m:
                problems.append(f"{what}: {line.strip()[:160]!r}")
    if needs_math and page.katex == 0:
        problems.append("no rendered math (KaTeX did not run: is it loaded?)")
    base = "http://site/" + rel
    for href in page.links:
        url = urlsplit(urljoin(base, href))
        if url.netloc != "site":
            continue
        target = site_dir / unquote(url.path).lstrip("/")
        if target.is_dir() or url.path.endswith("/"):
            target = target / "index.html"
        if not target.is_file():
            problems.append(f"link to a missing page: {href}")
            continue
        if url.fragment:
            ids = page.ids if target == site_dir / rel else _ids(target)
            if unquote(url.fragment) not in ids:
                problems.append(f"link to a missing anchor: {href}")
    return problems


@functools.cache
def _ids(path: Path) -> frozenset:
    return frozenset(_parse(path.read_text(encoding="utf-8")).ids)


@pytest.mark.parametrize("rel", list(PAGES))
def test_page_renders(site, rel):
    base, site_dir, tmp = site
    page = _parse(_dom(base + rel, tmp))
    problems = _check(page, rel, PAGES[rel], site_dir)
    assert not problems, f"{rel} in Chromium:\n  " + "\n  ".join(problems)


def test_screenshots(site):
    """The home, API and LLM pages render to an image (saved where
    RL_TRITON_CORE_SCREENSHOTS says)."""
    base, _, tmp = site
    where = os.environ.get("RL_TRITON_CORE_SCREENSHOTS")
    out_dir = Path(where) if where else tmp / "shots"
    out_dir.mkdir(parents=True, exist_ok=True)
    for rel, name in SCREENSHOTS.items():
        png = out_dir / name
        res = _chromium(f"--screenshot={png}", "--window-size=1280,2000", base + rel,
                        profile=tmp / "profile-shot")
        assert res.returncode == 0 and png.is_file() and png.stat().st_size > 10_000, (
            f"chromium --screenshot {rel} failed (rc {res.returncode}):\n{res.stderr[-3000:]}")
