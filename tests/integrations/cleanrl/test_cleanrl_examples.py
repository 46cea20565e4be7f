"""Smoke tests of the CleanRL-style examples (a few iterations on the CPU), and the slow
end-to-end check that the discrete example solves CartPole."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import rl_triton_core

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
DISCRETE = EXAMPLES / "cleanrl_ppo.py"
CONTINUOUS = EXAMPLES / "cleanrl_ppo_continuous.py"

# CartPole with a 20-step time limit, so that a few iterations see truncations.
SHORT_CARTPOLE = "rl_triton_tests/CartPoleShort-v1"
if SHORT_CARTPOLE not in gym.registry:
    gym.register(
        SHORT_CARTPOLE,
        entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        max_episode_steps=20,
    )


def load_example(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_main(path: Path, argv: list[str], capsys) -> str:
    num_threads = torch.get_num_threads()
    try:
        load_example(path).main(argv)
    finally:
        torch.set_num_threads(num_threads)
    return capsys.readouterr().out


def check_log(out: str, iterations: int) -> None:
    lines = [line for line in out.splitlines() if line.startswith("iteration=")]
    assert len(lines) == iterations, out
    for line in lines:
        assert "global_step=" in line and "episodic_return=" in line, line
        assert re.search(r"SPS=\d+", line), line
        assert re.search(r"gae_time_share=\d+\.\d+%", line), line
    assert "finished:" in out, out


def subprocess_env() -> dict[str, str]:
    """The examples import rl_triton_core and rl_triton_cleanrl: make the test's own
    import paths visible to a child interpreter (no-op once the project is installed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


TINY = ["--no-cuda", "--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2"]


@pytest.mark.parametrize("gae_backend", ["triton", "loop"])
@pytest.mark.parametrize("bootstrap", ["--bootstrap-truncated", "--no-bootstrap-truncated"])
def test_discrete_smoke(gae_backend, bootstrap, capsys):
    argv = TINY + ["--env-id", SHORT_CARTPOLE, "--total-timesteps", "384"]
    out = run_main(DISCRETE, argv + ["--gae-backend", gae_backend, bootstrap], capsys)
    check_log(out, iterations=3)
    assert f"gae_backend={gae_backend}" in out
    # the backend that really ran (numba here on CPU tensors, Triton's interpreter under
    # TRITON_INTERPRET=1 with RL_TRITON_CORE_BACKEND=triton), never a claim of Triton
    ran = "loop" if gae_backend == "loop" else rl_triton_core.backend_for("cpu")
    assert f"gae_ran_on={ran}" in out


@pytest.mark.parametrize("gae_backend", ["triton", "loop"])
@pytest.mark.parametrize("bootstrap", ["--bootstrap-truncated", "--no-bootstrap-truncated"])
def test_continuous_smoke(gae_backend, bootstrap, capsys):
    # Pendulum truncates every episode at 200 steps: 256 steps per env see one.
    argv = TINY + ["--total-timesteps", "512", "--update-epochs", "2"]
    out = run_main(CONTINUOUS, argv + ["--gae-backend", gae_backend, bootstrap], capsys)
    check_log(out, iterations=4)
    assert re.search(r"episodic_return=-\d+\.\d \(mean of last 2,", out), out


def test_discrete_cli():
    """The script runs as a file with tyro's command line, as in the docs."""
    cmd = [sys.executable, str(DISCRETE), *TINY, "--total-timesteps", "256"]
    cmd += ["--gae-backend", "loop", "--no-bootstrap-truncated"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr
    check_log(proc.stdout, iterations=2)


def test_target_return_not_reached_exits_nonzero(capsys):
    argv = TINY + ["--env-id", SHORT_CARTPOLE, "--total-timesteps", "256", "--target-return", "1e9"]
    with pytest.raises(SystemExit, match="did not reach"):
        run_main(DISCRETE, argv, capsys)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("path", [DISCRETE, CONTINUOUS], ids=["discrete", "continuous"])
def test_cuda_smoke(path, capsys):
    argv = ["--num-envs", "4", "--num-steps", "128", "--num-minibatches", "2"]
    argv += ["--total-timesteps", "1024"]
    if path == DISCRETE:
        argv += ["--env-id", SHORT_CARTPOLE]
    out = run_main(path, argv, capsys)
    check_log(out, iterations=2)


@pytest.mark.slow
def test_discrete_solves_cartpole():
    """The demo (`nox -s demo`): CartPole-v1 to a mean return >= 475 over 20 episodes."""
    cmd = [sys.executable, str(DISCRETE), "--no-cuda", "--target-return", "475"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    final = re.search(r"final_mean_return=(\d+\.\d)", proc.stdout)
    assert final is not None and float(final.group(1)) >= 400, proc.stdout[-3000:]
    assert "solved=True" in proc.stdout


@pytest.mark.slow
def test_continuous_learns_pendulum():
    """Pendulum-v1 from about -1200 (random policy) to a mean return >= -500 over 20 episodes
    (about 120k steps, under a minute on two idle CPU cores)."""
    cmd = [sys.executable, str(CONTINUOUS), "--no-cuda", "--target-return", "-500"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(), timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "solved=True" in proc.stdout
