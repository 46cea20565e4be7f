"""The documentation site's pages: written for users, and every link leads somewhere.

Fast, no network, no mkdocs build (CI's ``mkdocs build --strict`` does that, with the
``validation:`` settings of ``mkdocs.yml``). Checked here:

* ``mkdocs.yml``'s nav names only pages that exist;
* no page of the built site (the nav pages and the ``not_in_nav`` data pages, i.e. every
  ``docs/**/*.md`` not under ``exclude_docs``) speaks of the project's history: session
  or issue numbers, or paths that only the developers have (``shared/spec``). The
  development log, ``docs/notes.md``, is excluded from the site and so not checked;
* every relative link and image in ``docs/**/*.md`` (code blocks and code spans aside)
  points to an existing file, and a ``#anchor`` into a Markdown page (or within the
  page) to one of its headings;
* no page of the built site links to an excluded page: mkdocs only logs such a link
  (at INFO, which ``--strict`` lets through) and the built link is dead.
"""

from __future__ import annotations

import fnmatch
import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

HISTORY = re.compile(
    r"\b(session\s*\d+|sessions?\s+[0-9]|issue\s*#?\d+|notes(\.md)?\s+items?\s+\d+)\b"
    r"|shared/spec",
    re.IGNORECASE,
)
FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title") and ![alt](target); text may hold one level of brackets
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
REF_DEF = re.compile(r"^[ ]{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_ATTR = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")


class _Loader(yaml.SafeLoader):
    """mkdocs.yml may carry tags (``!ENV``, ``!!python/name``): read them as None."""


_Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def _config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)


def _nav_pages(nav) -> list[str]:
    """The doc paths of the nav (external URLs left out)."""
    out = []
    items = nav if isinstance(nav, list) else [nav]
    for item in items:
        if isinstance(item, str):
            value = item
        elif isinstance(item, dict):
            (value,) = item.values()
        else:
            continue
        if isinstance(value, (list, dict)):
            out += _nav_pages(value)
        elif isinstance(value, str) and "://" not in value:
            out.append(value)
    return out


def _spec_lines(value) -> list[str]:
    if not value:
        return []
    lines = value.splitlines() if isinstance(value, str) else list(value)
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def _matcher(lines: list[str]):
    """gitignore-style matching, as mkdocs applies ``exclude_docs`` / ``not_in_nav``."""
    try:
        import pathspec.gitignore  # mkdocs' own dependency: the same matcher
    except ImportError:  # a subset of the syntax: enough for this repository's patterns

        def match(rel: str) -> bool:
            for pat in lines:
                neg = pat.startswith("!")
                pat = pat.lstrip("!")
                if pat.endswith("/"):
                    hit = rel.startswith(pat.lstrip("/")) or f"/{pat}" in f"/{rel}"
                elif "/" in pat.rstrip("/"):
                    hit = fnmatch.fnmatch(rel, pat.lstrip("/"))
                else:
                    hit = any(fnmatch.fnmatch(part, pat) for part in rel.split("/"))
                if hit:
                    return not neg
            return False

        return match
    return pathspec.gitignore.GitIgnoreSpec.from_lines(lines).match_file


CONFIG = _config()
NAV = _nav_pages(CONFIG.get("nav") or [])
_excluded = _matcher(_spec_lines(CONFIG.get("exclude_docs")))
_default_excluded = _matcher([".*", "/templates/"])  # mkdocs leaves these out by default
EXCLUDED = {
    rel
    for rel in (p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*") if p.is_file())
    if _excluded(rel) or _default_excluded(rel)
}
PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
SITE_PAGES = [p for p in PAGES if p not in EXCLUDED]


def _prose(text: str, code_spans: bool = False) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks; code spans blanked unless
    ``code_spans`` (a heading's slug includes them)."""
    out, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if m:
            fence = m.group(1)
            continue
        out.append(
            (n, line if code_spans else CODE_SPAN.sub(lambda s: " " * len(s.group(0)), line))
        )
    return out


def _slug(text: str) -> str:
    """Python-Markdown's toc slugify (mkdocs' default) of a heading's rendered text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"(\*\*|\*)(?=\S)(.+?)(?<=\S)\1", r"\2", text)
    text = re.sub(r"(?<!\w)(__|_)(?=\S)(.+?)(?<=\S)\1(?!\w)", r"\2", text)  # not intraword
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for _, line in _prose(path.read_text(encoding="utf-8"), code_spans=True):
        m = HEADING.match(line)
        if not m:
            continue
        slug = _slug(m.group(2))
        if slug in seen:  # mkdocs numbers repeated headings: x, x_1, x_2
            seen[slug] += 1
            slug = f"{slug}_{seen[slug]}"
        else:
            seen[slug] = 0
        anchors.add(slug)
    return anchors


def _links(path: Path) -> list[tuple[int, str]]:
    links = []
    for n, line in _prose(path.read_text(encoding="utf-8")):
        for rx in (INLINE_LINK, HTML_ATTR):
            links += [(n, m.group(1)) for m in rx.finditer(line)]
        m = REF_DEF.match(line)
        if m:
            links.append((n, m.group(1)))
    return links


def _is_external(target: str) -> bool:
    parts = urlsplit(target)
    return bool(parts.scheme or parts.netloc)


def _resolve(page: Path, target: str) -> tuple[Path | None, str]:
    """(the file a relative link points to, or None for the page itself; the anchor)."""
    parts = urlsplit(target)
    path, anchor = unquote(parts.path), unquote(parts.fragment)
    if not path:
        return None, anchor
    return (page.parent / path).resolve(), anchor


def test_nav_pages_exist():
    assert NAV, "mkdocs.yml has no nav"
    missing = [p for p in NAV if not (DOCS / p).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages that do not exist: {missing}"
    excluded = [p for p in NAV if p in EXCLUDED]
    assert not excluded, f"nav pages excluded from the site by exclude_docs: {excluded}"


@pytest.mark.parametrize("page", SITE_PAGES)
def test_no_project_history(page):
    """User pages hold facts (numbers with machine, date, commit), not how they came to
    be: no session or issue numbers, no developer-only paths."""
    hits = [
        f"docs/{page}:{n}: {m.group(0)!r} in: {line.strip()}"
        for n, line in enumerate((DOCS / page).read_text(encoding="utf-8").splitlines(), 1)
        for m in HISTORY.finditer(line)
    ]
    assert not hits, "project history on a page of the site:\n" + "\n".join(hits)


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
    src = DOCS / page
    problems = []
    for n, target in _links(src):
        if _is_external(target):
            continue
        if target.startswith("/"):
            problems.append(f"docs/{page}:{n}: absolute link {target!r} (use a relative one)")
            continue
        dest, anchor = _resolve(src, target)
        where = src if dest is None else dest
        if dest is not None and not dest.exists():
            problems.append(f"docs/{page}:{n}: {target!r}: no such file")
            continue
        if dest is not None and not dest.is_relative_to(ROOT):
            problems.append(f"docs/{page}:{n}: {target!r} points outside the repository")
            continue
        if anchor and where.suffix == ".md" and where.is_file() and anchor not in _anchors(where):
            problems.append(
                f"docs/{page}:{n}: {target!r}: no heading with the anchor "
                f"#{anchor} in {where.relative_to(ROOT).as_posix()}"
            )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", SITE_PAGES)
def test_site_pages_link_only_into_the_site(page):
    src = DOCS / page
    problems = []
    for n, target in _links(src):
        if _is_external(target) or target.startswith("/"):
            continue
        dest, _ = _resolve(src, target)
        if dest is None or not dest.exists():
            continue  # test_relative_links_resolve reports it
        try:
            rel = dest.relative_to(DOCS.resolve()).as_posix()
        except ValueError:
            problems.append(f"docs/{page}:{n}: {target!r} points outside docs/: not on the site")
            continue
        if rel in EXCLUDED:
            problems.append(
                f"docs/{page}:{n}: {target!r} is excluded from the site "
                "(exclude_docs in mkdocs.yml): a dead link on the built site"
            )
    assert not problems, "\n".join(problems)


def test_the_checks_see_the_site():
    """Guards against a collector that silently finds nothing."""
    assert "index.md" in NAV and "index.md" in SITE_PAGES
    assert any(p.startswith("bench/") for p in SITE_PAGES), "no data page on the site"
    assert "benchmarks" in _anchors(DOCS / "benchmarks.md")
    assert sum(len(_links(DOCS / p)) for p in SITE_PAGES) > 20
    assert HISTORY.search("as in Session 4") and HISTORY.search("the issue #12 target")
    assert not HISTORY.search("sessions of training, issues of the API")
