"""Every ```python block in the docs runs on the CPU.

Collected: each fenced code block whose info string is ``python`` (or ``py``,
``python3``), at any indentation, in ``docs/**/*.md`` (``docs/bench/`` included)
and ``README.md``. One test per block, with the id ``<file>:<line of the opening fence>``.

How a block runs:

* alone, in a fresh namespace (``exec``): blocks never share names, not even within
  one file, so every block carries its own imports and data;
* in this process (fast: numba's compiled loops and imports are shared), with
  tracebacks pointing at the Markdown file and line;
* with ``RL_TRITON_CORE_BACKEND`` unset, so CPU tensors take the numba path; the
  global torch RNG is restored afterwards (``torch.random.fork_rng``), and so is
  ``rl_triton_torchrl.install()`` (undone if the block installed it).

A block passes when it runs without an exception; blocks state their results with
``assert`` / ``torch.testing.assert_close``.

Markers: an HTML comment on the line right before the opening fence (invisible on
the rendered site):

* ``<!-- docs-test: skip (reason) -->``: never run; reported as skipped with the
  reason. For partial snippets (names defined elsewhere, ``...``), blocks that start
  a Ray cluster, need the network, or take more than a few seconds.
* ``<!-- docs-test: cuda -->``: runs where CUDA is available, skipped ("needs CUDA")
  elsewhere, e.g. in CI.

A malformed or unknown marker, or one that is not right before a ``python`` fence,
fails ``test_markers_are_well_formed``.

``README.md`` carries no markers (yet): its blocks to skip are listed in
``SKIP_WITHOUT_MARKER`` below, keyed by their first line; an entry that matches no
block fails ``test_markers_are_well_formed`` too.
"""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PYTHON_INFO = {"python", "py", "python3"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
MARKER = re.compile(r"<!--\s*docs-test:(?P<body>.*?)-->")
SKIP = re.compile(r"^skip\s*\((?P<reason>.+)\)$")
# (file, first line of the block) -> reason, for files that carry no markers
SKIP_WITHOUT_MARKER = {
    ("README.md", "# TorchRL: every loss builds the Triton estimators (undo with uninstall())"):
        "fragments of three frameworks' scripts: config and the rollout buffers are "
        "defined there",
}


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    code: str  # dedented source
    first_code_line: int
    skip: str | None = None
    cuda: bool = False

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def doc_files() -> list[Path]:
    files = sorted((ROOT / "docs").rglob("*.md"))
    readme = ROOT / "README.md"
    if readme.exists():
        files.append(readme)
    return files


unmarked_skips: set = set()  # the SKIP_WITHOUT_MARKER entries that matched a block


def parse(path: Path) -> tuple[list[Block], list[str]]:
    """The python blocks of one Markdown file, and the problems with its markers."""
    rel = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, problems = [], []
    marker_lines = {}  # line index -> marker body
    for i, line in enumerate(lines):
        m = MARKER.search(line)
        if m:
            marker_lines[i] = m.group("body").strip()
    used = set()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m.group("indent"), m.group("fence")
        info = m.group("info").strip()
        lang = info.split()[0].lstrip(".{").rstrip("}") if info else ""
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        if lang in PYTHON_INFO:
            body = [ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[i + 1:j]]
            skip, cuda = None, False
            marker = marker_lines.get(i - 1)
            if marker is not None:
                used.add(i - 1)
                s = SKIP.match(marker)
                if s and s.group("reason").strip():
                    skip = s.group("reason").strip()
                elif marker == "cuda":
                    cuda = True
                else:
                    problems.append(f"{rel}:{i}: unknown marker {marker!r} (expected "
                                    "'skip (reason)' or 'cuda')")
            code = textwrap.dedent("\n".join(body)) + "\n"
            first = next((ln.strip() for ln in code.splitlines() if ln.strip()), "")
            if marker is None and (rel, first) in SKIP_WITHOUT_MARKER:
                skip = SKIP_WITHOUT_MARKER[(rel, first)]
                unmarked_skips.add((rel, first))
            blocks.append(Block(rel, i + 1, code, i + 2, skip, cuda))
        i = j + 1
    for k in sorted(set(marker_lines) - used):
        problems.append(f"{rel}:{k + 1}: docs-test marker not on the line right before a "
                        "```python fence")
    return blocks, problems


def collect() -> tuple[list[Block], list[str]]:
    blocks, problems = [], []
    for f in doc_files():
        b, p = parse(f)
        blocks += b
        problems += p
    for rel, first in sorted(set(SKIP_WITHOUT_MARKER) - unmarked_skips):
        problems.append(f"{rel}: SKIP_WITHOUT_MARKER entry {first!r} matches no block")
    return blocks, problems


BLOCKS, PROBLEMS = collect()


def _params() -> list:
    params = []
    for b in BLOCKS:
        marks = []
        if b.skip:
            marks.append(pytest.mark.skip(reason=f"docs-test: {b.id}: {b.skip}"))
        elif b.cuda:
            marks.append(pytest.mark.skipif(not torch.cuda.is_available(),
                                            reason=f"docs-test: {b.id}: needs CUDA"))
        params.append(pytest.param(b, id=b.id, marks=marks))
    return params


def test_markers_are_well_formed():
    assert any(b.path == "docs/semantics.md" for b in BLOCKS), "collector found no examples"
    assert not PROBLEMS, "\n".join(PROBLEMS)


def _torchrl_installed() -> bool:
    mod = sys.modules.get("rl_triton_torchrl")
    return bool(mod and any(mod.is_installed().values()))


@pytest.mark.parametrize("block", _params())
def test_docs_example(block: Block, monkeypatch):
    monkeypatch.delenv("RL_TRITON_CORE_BACKEND", raising=False)
    # padded so that line numbers in a traceback are the Markdown file's
    source = "\n" * (block.first_code_line - 1) + block.code
    code = compile(source, str(ROOT / block.path), "exec")
    namespace = {"__name__": "__docs_example__"}
    torchrl_before = _torchrl_installed()
    try:
        with torch.random.fork_rng(devices=[]):
            exec(code, namespace)  # noqa: S102 - the docs' own examples
    finally:
        if not torchrl_before and _torchrl_installed():
            sys.modules["rl_triton_torchrl"].uninstall()

