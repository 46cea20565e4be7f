"""No development history where users and readers of the code look.

The pages (``docs/**/*.md``, the data pages under ``docs/bench`` with their ``.txt`` and
``.json`` files, ``docs/notes.md`` and ``README.md``) and the package's comments and
docstrings (``rl_triton_core/**/*.py`` and ``*.c``, ``integrations/**/*.py``) say what a
figure or a choice means, not how the work went: no device or GPU sessions, no
deadlines a run stopped at, no working-tree ranges, no notes items or issues cited by
number. A commit hash as the provenance of a figure is fine.

Only the comments and docstrings of the code are read (``tokenize`` and ``ast`` for
Python, ``/* */`` and ``//`` for C), so a string the code prints or an option such as
the benchmark's ``--deadline-s`` is not a finding. The words "session" alone (a nox
session, an HTTP or Ray session) and "issue" alone (a GPU issues instructions) are
allowed; the patterns below name the history forms. Fast: regular expressions over a
few hundred files, no imports of the package.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PATTERNS = [
    (re.compile(r"\bdevice\s+sessions?\b", re.I), "a device session"),
    (
        re.compile(r"\b(next|this|that|same|previous|last)\s+sessions?\b", re.I),
        "a session of the work",
    ),
    (
        re.compile(
            r"\b(gpu|cpu|first|second|third|fourth|earlier|later|one|two|three|several|"
            r"each|every|many)\s+sessions?\b",
            re.I,
        ),
        "a session of the work",
    ),
    (re.compile(r"\bsessions?\s*#?\d", re.I), "a session number"),
    # the benchmark's option --deadline-s / deadline_s is a name, not history
    (re.compile(r"(?<![-_\w])deadlines?(?![-_\w])", re.I), "a deadline"),
    (
        re.compile(
            r"\bworking[\s-]+trees?\b[^.\n]{0,40}?\b[0-9a-f]{7,40}\s*(\.\.|to|-)\s*"
            r"[0-9a-f]{7,40}\b",
            re.I,
        ),
        "a range of working trees",
    ),
    (
        re.compile(r"\bworking[\s-]+trees?\s+(between|of\s+commits)\b", re.I),
        "a range of working trees",
    ),
    (re.compile(r"\+wip\b", re.I), "an uncommitted working tree"),
    (re.compile(r"\bnotes(\.md)?\s*,?\s*items?\s+\d", re.I), "a notes item by number"),
    (re.compile(r"\bnotes(\.md)?\s*,?\s*\d", re.I), "a notes item by number"),
    # "issue 37", not "the warps issue 2.5M instructions"
    (re.compile(r"\bissue\s*#\s*\d|\bissues?\s+\d+(?!\.\d|\d|\w)", re.I), "an issue by number"),
    (re.compile(r"\bthe\s+issue'?s\s+targets?\b", re.I), "the issue's targets"),
    (
        re.compile(r"\bno\s+device\s+time\s+left\b|\bdevice\s+time\s+(was\s+)?spent\b", re.I),
        "the work's device budget",
    ),
]


def _pages() -> list[Path]:
    docs = ROOT / "docs"
    files = sorted(docs.rglob("*.md")) + sorted((docs / "bench").glob("*.txt"))
    files += sorted((docs / "bench").glob("*.json"))
    return [*files, ROOT / "README.md"]


def _py_text(path: Path) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python file, as (line, text)."""
    src = path.read_text(encoding="utf-8")
    out: list[tuple[int, str]] = []
    last = -2
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            # a comment continued on the next lines is read as one text
            if out and tok.start[0] == last + 1:
                out[-1] = (out[-1][0], out[-1][1] + "\n" + tok.string)
            else:
                out.append((tok.start[0], tok.string))
            last = tok.start[0]
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                out.append((body[0].lineno, body[0].value.value))
    return out


C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def _c_text(path: Path) -> list[tuple[int, str]]:
    src = path.read_text(encoding="utf-8")
    return [(src.count("\n", 0, m.start()) + 1, m.group()) for m in C_COMMENT.finditer(src)]


def _code_files() -> list[Path]:
    core = ROOT / "rl_triton_core"
    files = sorted(core.rglob("*.py")) + sorted(core.rglob("*.c"))
    files += sorted((ROOT / "integrations").rglob("*.py"))
    return [f for f in files if "__pycache__" not in f.parts]


def _findings(chunks: list[tuple[int, str]], rel: str) -> list[str]:
    out = []
    for line, text in chunks:
        # a phrase may be wrapped over two lines of a comment or a page
        flat = re.sub(r"\s*\n\s*(#\s*|\*\s*|//\s*)?", " ", text)
        for pat, what in PATTERNS:
            for m in pat.finditer(flat):
                out.append(f"{rel}:{line}: {what}: {m.group()!r}")
    return out


def test_patterns_catch_the_history_forms():
    bad = [
        "one device session",
        "For the next GPU session",
        "in this session",
        "stopped at its deadline",
        "working trees 407b72b..ea75c05",
        "docs/notes.md, item 36",
        "notes 65",
        "docs/notes.md items 59",
        "issue #37",
        "commit `7051ece+wip`",
        "several device sessions",
    ]
    good = [
        "a nox session",
        "the Ray session",
        "requests.Session()",
        "--deadline-s 480",
        "deadline_s",
        "the warps issue 2.5M instructions",
        "commit 0b705a9",
        "measured on 2026-12-03 at commit ea75c05",
        "`nox -s docs`",
        "see docs/notes.md",
    ]
    for s in bad:
        assert _findings([(1, s)], "x"), s
    for s in good:
        assert not _findings([(1, s)], "x"), s


def test_pages_tell_no_history():
    found = []
    for page in _pages():
        rel = page.relative_to(ROOT).as_posix()
        lines = page.read_text(encoding="utf-8").splitlines()
        # a paragraph at a time, so phrases wrapped over lines are read whole
        para: list[str] = []
        start = 1
        for i, ln in enumerate([*lines, ""], 1):
            if ln.strip():
                if not para:
                    start = i
                para.append(ln)
            elif para:
                found += _findings([(start, "\n".join(para))], rel)
                para = []
    assert not found, "history in the pages:\n" + "\n".join(found)


def test_code_comments_tell_no_history():
    found = []
    for path in _code_files():
        rel = path.relative_to(ROOT).as_posix()
        chunks = _py_text(path) if path.suffix == ".py" else _c_text(path)
        found += _findings(chunks, rel)
    assert not found, "history in comments or docstrings:\n" + "\n".join(found)
