"""Fixtures of the TRL adapter tests.

TRL's PPO advantages are an inline block of ``PPOTrainer.train()`` in
``trl/experimental/ppo/ppo_trainer.py`` (TRL 1.12.0, the last release with PPO, installed
with ``--no-deps``). Importing that module needs accelerate, datasets, pandas and more;
the ``trl_ppo`` fixture instead reads the INSTALLED file (found with
``importlib.util.find_spec``, without importing ``trl``) and compiles from its source:

* TRL's ``masked_mean``, ``masked_var`` and ``masked_whiten`` functions, unchanged;
* the block from ``lastgaelam = 0`` to ``advantages = torch.masked_fill(advantages,
  padding_mask, 0)``, dedented into a function of ``(rewards, values, padding_mask,
  responses, args)``, run exactly as TRL's train() runs it.
"""

from __future__ import annotations

import ast
import importlib.util
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

PPO_FILE = "experimental/ppo/ppo_trainer.py"
BLOCK_START = "lastgaelam = 0"
BLOCK_END = "advantages = torch.masked_fill(advantages, padding_mask, 0)"


def _ppo_source() -> tuple[Path, str]:
    spec = importlib.util.find_spec("trl")
    if spec is None or spec.origin is None:
        pytest.skip("needs TRL (pip install --no-deps trl==1.12.0)")
    path = Path(spec.origin).parent / PPO_FILE
    if not path.exists():
        pytest.skip(f"this TRL has no {PPO_FILE} (PPO was removed in TRL 1.13)")
    return path, path.read_text()


@pytest.fixture(scope="session")
def trl_ppo():
    import torch

    path, src = _ppo_source()
    tree = ast.parse(src)
    helpers = [n for n in tree.body if isinstance(n, ast.FunctionDef)
               and n.name in ("masked_mean", "masked_var", "masked_whiten")]
    assert len(helpers) == 3, "TRL's masked_* helpers moved"
    ns = {"torch": torch}
    exec(compile(ast.Module(body=helpers, type_ignores=[]), str(path), "exec"), ns)
    lines = src.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == BLOCK_START)
    end = next(i for i, line in enumerate(lines) if line.strip() == BLOCK_END and i > start)
    block = textwrap.dedent("\n".join(lines[start:end + 1]))
    fn_src = ("def trl_block(rewards, values, padding_mask, responses, args):\n"
              + textwrap.indent(block, "    ") + "\n    return advantages, returns\n")
    exec(compile(fn_src, f"{path}:{start + 1}", "exec"), ns)

    def advantages(rewards, values, padding_mask, gamma, lam):
        args = SimpleNamespace(gamma=gamma, lam=lam)
        return ns["trl_block"](rewards, values, padding_mask, rewards, args)

    return SimpleNamespace(advantages=advantages, masked_whiten=ns["masked_whiten"],
                           block=block, path=path)
