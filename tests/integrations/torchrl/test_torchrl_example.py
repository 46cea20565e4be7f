"""examples/torchrl_ppo.py: runs with both estimators, learns the same (slow: learns at all)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import rl_triton_core

pytest.importorskip("torchrl")
pytest.importorskip("gymnasium")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torchrl_ppo.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("torchrl_ppo_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_both_estimators_train_identically(example):
    """Two iterations with each estimator: the same episodes, so the same advantages."""
    results = [
        example.main(example.Args(estimator=e, total_frames=512, frames_per_batch=256,
                                  minibatch_size=128, num_epochs=1, target_return=0))
        for e in ("torchrl", "rl-triton-core")
    ]
    assert [r["iterations"] for r in results] == [2, 2]
    assert results[0]["return"] == pytest.approx(results[1]["return"], rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["rl-triton-core", "torchrl"])
def test_learns_cartpole(example, estimator):
    result = example.main(example.Args(estimator=estimator))
    assert result["return"] >= 400, result


def test_cuda_without_a_gpu_falls_back_with_a_message(example, capsys):
    """--device cuda on a machine without CUDA runs on the CPU and says so (it used to
    die with "Torch not compiled with CUDA enabled"); the run prints what computed GAE."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = example.main(example.Args(estimator="rl-triton-core", device="cuda", total_frames=256,
                                       frames_per_batch=256, minibatch_size=128,
                                       num_epochs=1, target_return=0))
    assert result["iterations"] == 1
    captured = capsys.readouterr()
    assert "no CUDA GPU here, running on the CPU instead" in captured.err
    from rl_triton_core.scan import _cpu_c

    ran = {"interpreter": "triton-interpreter"}.get(
        rl_triton_core.backend_for("cpu"), "c-kernel-cpu" if _cpu_c.enabled() else "numba-cpu")
    assert f"estimator=rl-triton-core gae_ran_on={ran} " in captured.out
    assert result["gae_ran_on"] == ran


def test_help_text_and_line_width(example, capsys):
    """Every flag has help text; what a run prints fits an 88-column terminal; the first
    calls are shown apart from the per-call medians."""
    import dataclasses

    assert set(example.HELP) == {f.name for f in dataclasses.fields(example.Args)}
    example.main(example.Args(total_frames=512, frames_per_batch=256, minibatch_size=128,
                              num_epochs=2, target_return=0))
    out = capsys.readouterr().out
    assert "first calls: GAE module" in out and "gae_module_first_ms=" in out
    assert all(len(line) <= 88 for line in out.splitlines()), out
