"""Adding an estimator as docs/design.md says: its walkthrough's edits, made to a copy of
the package, give a working estimator on the CPU path and in the Triton kernel (the
interpreter without a GPU, CUDA with one), against its reference loop.

The edits are read from design.md itself (each code block of "Adding an estimator" whose
first line names a file and the line to insert before), so the page and this test
cannot drift apart; the test also holds the walkthrough to at most 6 edits in at most 4
files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAD = re.compile(r'^# (rl_triton_core/\S+), before "(.+)"$')


def walkthrough():
    """[(path, anchor, code)] from design.md's "Adding an estimator" section."""
    text = (ROOT / "docs" / "design.md").read_text()
    start = text.index("### Adding an estimator")
    section = text[start:text.index("\n## ", start)]
    edits = []
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        code = textwrap.dedent(block)
        first, _, rest = code.partition("\n")
        m = HEAD.match(first)
        assert m, f"a walkthrough block must start with '# <file>, before \"<line>\"': {first!r}"
        edits.append((m.group(1), m.group(2), rest))
    return edits


def apply(pkg_parent: Path, edits):
    for path, anchor, code in edits:
        f = pkg_parent / path
        src = f.read_text()
        lines = src.split("\n")
        hits = [i for i, line in enumerate(lines) if line.strip().startswith(anchor)]
        assert len(hits) == 1, f"{path}: {anchor!r} must name one line, found {len(hits)}"
        i = hits[0]
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        block = [indent + line if line.strip() else "" for line in code.rstrip("\n").split("\n")]
        trailing = len(code) - len(code.rstrip("\n")) - 1  # blank lines kept after the block
        f.write_text("\n".join(lines[:i] + block + [""] * trailing + lines[i:]))


def test_walkthrough_is_small():
    edits = walkthrough()
    files = {path for path, _, _ in edits}
    assert len(edits) <= 6 and len(files) <= 4, (len(edits), sorted(files))


CHECK = r'''
import sys
import torch
import rl_triton_core as rc
from rl_triton_core import reference

assert rc.__file__.startswith(sys.argv[1]), rc.__file__
assert "toy_ema" in rc.__all__
device, backend = sys.argv[2], sys.argv[3]
gen = torch.Generator().manual_seed(int(sys.argv[4]))
for dtype in (torch.float32, torch.float64):
    for td, shape in ((-1, (3, 37)), (0, (29, 5)), (1, (2, 41, 3))):
        x = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype).to(device)
        done = (torch.rand(shape[:2] if len(shape) == 3 else shape, generator=gen) < 0.1)
        done = done.to(device)
        init_shape = tuple(s for k, s in enumerate(shape) if k != (td % len(shape)))
        init = torch.randn(init_shape, generator=gen, dtype=torch.float64).to(dtype).to(device)
        gamma = float(torch.rand((), generator=gen))
        for kw in ({"gamma": gamma}, {"gamma": gamma, "init": init}):
            want = reference.toy_ema(x.cpu(), done.cpu(), time_dim=td, **{
                k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
            for _ in range(2):  # the full path, then the cached call
                got = rc.toy_ema(x, done, time_dim=td, **kw)
                assert got.dtype == dtype and got.shape == x.shape, (got.dtype, got.shape)
                err = (got.double().cpu() - want).abs().max().item()
                tol = 1e-10 if dtype == torch.float64 else 1e-5
                assert err <= tol * max(1.0, want.abs().max().item()), (dtype, td, kw, err)
        # a different estimator's numbers would not match: the row picks this builder
        assert not torch.allclose(rc.toy_ema(x, done, gamma=0.3, time_dim=td).double().cpu(),
                                  reference.episodic_cumsum(x.cpu(), done.cpu(), time_dim=td))
print("toy_ema OK", backend)
'''


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    parent = tmp_path_factory.mktemp("pkg")
    shutil.copytree(ROOT / "rl_triton_core", parent / "rl_triton_core",
                    ignore=shutil.ignore_patterns("__pycache__"))
    apply(parent, walkthrough())
    return parent


def test_toy_estimator_runs(patched, impl, seed):
    env = dict(os.environ, PYTHONPATH=str(patched), RL_TRITON_CORE_NUMBA_CACHE="0",
               RL_TRITON_CORE_BACKEND=impl.backend)
    res = subprocess.run([sys.executable, "-c", CHECK, str(patched), str(impl.device), impl.backend,
                          str(seed)], env=env, capture_output=True, text=True, timeout=900,
                         cwd=patched)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    assert "toy_ema OK" in res.stdout
