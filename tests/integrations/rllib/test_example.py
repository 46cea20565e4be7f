"""examples/rllib_ppo.py's command line: every flag has help text that fits a terminal
(the run itself needs Ray; nox runs its --help)."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "rllib_ppo.py"


def test_every_flag_has_help():
    spec = importlib.util.spec_from_file_location("rllib_ppo_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        assert set(module.HELP) == {f.name for f in dataclasses.fields(module.Args)}
        assert all(module.HELP.values())
    finally:
        sys.modules.pop(spec.name, None)
    out = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True,
                         text=True, check=True, env={"COLUMNS": "88", "PATH": ""}).stdout
    assert all(len(line) <= 88 for line in out.splitlines()), out
    for name in module.HELP:
        assert "--" + name.replace("_", "-") in out
