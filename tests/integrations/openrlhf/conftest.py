"""Fixtures of the OpenRLHF adapter tests.

OpenRLHF 0.11 keeps ``get_advantages_and_returns`` and ``get_cumulative_returns`` as
methods of ``RemoteExperienceMaker`` in ``openrlhf/trainer/ppo_utils/experience_maker.py``.
That module's imports reach DeepSpeed (``openrlhf.models.utils``), vLLM and flash-attn
(``openrlhf.trainer.ray.launcher`` -> ``openrlhf.models``), which do not install on a CPU
machine. The ``experience_maker`` fixture loads the REAL installed module (OpenRLHF
0.11.2, ``pip install --no-deps``) with only those imports stood in for:

* the packages ``openrlhf``, ``openrlhf.trainer``, ``.ppo_utils``, ``.ray``, ``.utils``,
  ``.models`` are empty stand-ins whose ``__path__`` is the installed folders, so
  submodules load from OpenRLHF's own files and their ``__init__`` imports do not run;
* ``openrlhf.models.utils`` holds OpenRLHF's own ``compute_approx_kl``,
  ``compute_reward`` and ``masked_mean``, compiled from the installed file's source
  (without its ``import deepspeed``);
* ``openrlhf.trainer.ppo_utils.experience`` and ``openrlhf.trainer.ray.launcher``
  provide placeholder ``Experience`` / ``RayActorGroup`` classes (type annotations only);
* ``ray`` is the installed Ray, or a stand-in module where Ray is absent.

``openrlhf.utils.logging_utils``, ``seqlen_balancing`` and ``ppo_utils.length_penalty``
are OpenRLHF's real files. sys.modules is restored afterwards.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import types
import typing
from pathlib import Path

import pytest


def _root() -> Path:
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or spec.origin is None:
        pytest.skip("needs OpenRLHF (pip install --no-deps openrlhf==0.11.2)")
    return Path(spec.origin).parent


def _functions_from(path: Path, names, namespace: dict) -> types.ModuleType:
    """A module holding the named top-level functions / assignments of ``path``'s source."""
    tree = ast.parse(path.read_text())
    keep = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            keep.append(node)
        elif isinstance(node, ast.Assign) and all(
                isinstance(t, ast.Name) and t.id.isupper() for t in node.targets):
            keep.append(node)
    mod = types.ModuleType("openrlhf.models.utils")
    mod.__dict__.update(namespace)
    mod.__file__ = str(path)
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), mod.__dict__)
    return mod


def _stand_ins(root: Path) -> dict:
    import torch
    import torch.nn.functional as F

    mods = {}
    for name, sub in [("openrlhf", ""), ("openrlhf.trainer", "trainer"),
                      ("openrlhf.trainer.ppo_utils", "trainer/ppo_utils"),
                      ("openrlhf.trainer.ray", "trainer/ray"), ("openrlhf.utils", "utils"),
                      ("openrlhf.models", "models")]:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(root / sub)]
        mods[name] = pkg
    ns = {"torch": torch, "nn": torch.nn, "F": F, "Optional": typing.Optional,
          "Tuple": tuple, "Union": typing.Union, "os": __import__("os")}
    mods["openrlhf.models.utils"] = _functions_from(
        root / "models/utils.py", {"compute_approx_kl", "compute_reward", "masked_mean"}, ns)
    exp = types.ModuleType("openrlhf.trainer.ppo_utils.experience")
    exp.Experience = type("Experience", (), {})
    mods[exp.__name__] = exp
    launcher = types.ModuleType("openrlhf.trainer.ray.launcher")
    launcher.RayActorGroup = type("RayActorGroup", (), {})
    mods[launcher.__name__] = launcher
    if importlib.util.find_spec("ray") is None:
        mods["ray"] = types.ModuleType("ray")
    return mods


@pytest.fixture(scope="session")
def experience_maker():
    """OpenRLHF's real ``experience_maker`` module (see the module docstring)."""
    root = _root()
    saved = {k: v for k, v in sys.modules.items() if k == "openrlhf" or k.startswith("openrlhf.")}
    for k in saved:
        del sys.modules[k]
    stand_ins = _stand_ins(root)
    had_ray = "ray" in sys.modules
    sys.modules.update(stand_ins)
    try:
        module = importlib.import_module("openrlhf.trainer.ppo_utils.experience_maker")
        assert Path(module.__file__).resolve() == (
            root / "trainer/ppo_utils/experience_maker.py").resolve()
        yield module
    finally:
        for k in [k for k in sys.modules if k == "openrlhf" or k.startswith("openrlhf.")]:
            del sys.modules[k]
        if "ray" in stand_ins and not had_ray:
            sys.modules.pop("ray", None)
        sys.modules.update(saved)


@pytest.fixture
def installed(experience_maker):
    """For tests that call ``install()``: OpenRLHF's own methods again afterwards."""
    import rl_triton_openrlhf

    rl_triton_openrlhf.uninstall()
    yield rl_triton_openrlhf
    rl_triton_openrlhf.uninstall()
