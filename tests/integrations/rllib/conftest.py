"""Shared fixtures for the RLlib adapter tests.

* Makes ``rl_triton_rllib`` and ``rl_triton_core`` importable from a source checkout
  that is not pip-installed (also in Ray's worker processes, through PYTHONPATH).
* One Ray instance for the whole directory (Ray's start-up is the slow part).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("ray.rllib", reason="needs the [rllib] extra (ray[rllib]==2.60.0)")

REPO = Path(__file__).resolve().parents[3]


def _prepend_path(path: str) -> None:
    sys.path.insert(0, path)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = path if not old else path + os.pathsep + old


def _installed(name: str) -> bool:
    """A regular package by that name is importable (a namespace package is what an
    editable install made before the package had its ``__init__.py`` resolves to)."""
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin not in (None, "namespace")


if not _installed("rl_triton_core"):
    _prepend_path(str(REPO))
if not _installed("rl_triton_rllib"):
    # Not installed (or a stale editable install): expose integrations/rllib under its
    # package name.
    _links = tempfile.mkdtemp(prefix="rl_triton_rllib_src_")
    os.symlink(REPO / "integrations" / "rllib", os.path.join(_links, "rl_triton_rllib"))
    _prepend_path(_links)


@pytest.fixture(scope="session")
def ray_session():
    """One small local Ray instance shared by every test that needs one."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
