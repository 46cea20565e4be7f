"""Every extra that the README and the docs install is one that ``nox -s extras`` checks.

``nox -s extras`` (noxfile.py, run by .ci/run) installs or resolves each extra of its
``EXTRAS`` table on a CPU machine and runs its examples' ``--help``; ``.[openrlhf]``
is installed into the session's own venv, with ``rl_triton_openrlhf.install()``'s
errors checked; a pair of extras named together (``.[torchrl,verl]``) is one the docs
say cannot share an environment, and the session checks that it fails to resolve
(``CONFLICTS``). Fast: reads the files, imports nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

ROOT = Path(__file__).resolve().parents[2]
EXTRA = re.compile(r"\.\[([a-z_]+(?:,[a-z_]+)*)\]")


def _pages() -> list[Path]:
    pages = [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "notes.md"]
    return [ROOT / "README.md", *pages]


def _noxfile_tables() -> tuple[set, set]:
    """The keys of noxfile.py's EXTRAS and the pairs of its CONFLICTS, read from its AST."""
    tree = ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))
    extras, conflicts = set(), set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = getattr(node.targets[0], "id", None)
            if name == "EXTRAS":
                extras = {k.value for k in node.value.keys}
            elif name == "CONFLICTS":
                conflicts = {frozenset(ast.literal_eval(e)) for e in node.value.elts}
    return extras, conflicts


def _mentions() -> list[tuple[str, int, tuple[str, ...]]]:
    out = []
    for page in _pages():
        rel = page.relative_to(ROOT).as_posix()
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            out += [(rel, n, tuple(m.group(1).split(","))) for m in EXTRA.finditer(line)]
    return out


def test_documented_extras_are_checked_by_nox():
    checked, conflicts = _noxfile_tables()
    assert checked, "noxfile.py has no EXTRAS table"
    checked = checked | {"openrlhf"}  # installed into the extras session's own venv
    declared = None
    if tomllib is not None:
        table = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        declared = set(table["project"]["optional-dependencies"])
    mentions = _mentions()
    assert len(mentions) > 10, "no install lines found: the pattern no longer matches"
    problems = []
    for rel, n, names in mentions:
        for name in names:
            if declared is not None and name not in declared:
                problems.append(f"{rel}:{n}: .[{name}] is not an extra of pyproject.toml")
            if name not in checked:
                problems.append(f"{rel}:{n}: .[{name}] is not checked by nox -s extras")
        if len(names) > 1 and frozenset(names) not in conflicts:
            problems.append(f"{rel}:{n}: .[{','.join(names)}] together: neither checked to "
                            "install nor listed in noxfile.py's CONFLICTS")
    assert not problems, "\n".join(problems)
