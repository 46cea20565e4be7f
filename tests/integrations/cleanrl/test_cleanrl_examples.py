"""Smoke tests of the CleanRL-style examples (a few iterations on the CPU), and the slow
end-to-end check that the discrete example solves CartPole."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rl_triton_core

gym = pytest.importorskip("gymnasium")  # the examples' environments (the [cleanrl] extra)

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


WIDTH = 88  # the lines fit a terminal of this width


def check_log(out: str, iterations: int) -> None:
    lines = out.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("iteration=")]
    assert len(starts) == iterations, out
    for n, i in enumerate(starts):
        line, losses, gae = lines[i:i + 3]
        assert "global_step=" in line and "episodic_return=" in line, line
        assert re.search(r"SPS=\d+", line), line
        assert "value_loss=" in losses and "approx_kl=" in losses, losses
        # per call: the first apart, then the median of the calls after it
        calls = "call 2" if n == 1 else f"calls 2-{n + 1}"
        median = rf" gae_median_ms=\d+\.\d{{3}} \({calls}\)" if n else ""
        assert re.fullmatch(rf"  gae_first_ms=\d+\.\d{{3}}{median} gae_time_share=\d+\.\d+%",
                            gae), gae
    assert "finished:" in out, out
    calls = "call 2" if iterations == 2 else f"calls 2-{iterations}"
    assert re.search(rf"^gae_first_ms=\d+\.\d+ gae_median_ms=\d+\.\d+ \({calls}\)$", out,
                     re.M), out
    too_long = [line for line in lines if len(line) > WIDTH]
    assert not too_long, too_long


def expected_runner(gae_backend: str) -> str:
    """What computed GAE on CPU tensors, as the examples must report it."""
    if gae_backend == "cleanrl-loop":
        return "cleanrl-loop"
    backend = rl_triton_core.backend_for("cpu")
    if backend == "interpreter":
        return "triton-interpreter"
    from rl_triton_core.scan import _cpu_c

    return "c-kernel-cpu" if _cpu_c.enabled() else "numba-cpu"


def subprocess_env() -> dict[str, str]:
    """The examples import rl_triton_core and rl_triton_cleanrl: make the test's own
    import paths visible to a child interpreter (no-op once the project is installed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


TINY = ["--no-cuda", "--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2"]


@pytest.mark.parametrize("gae_backend", ["rl-triton-core", "cleanrl-loop"])
@pytest.mark.parametrize("bootstrap", ["--bootstrap-truncated", "--no-bootstrap-truncated"])
def test_discrete_smoke(gae_backend, bootstrap, capsys):
    argv = TINY + ["--env-id", SHORT_CARTPOLE, "--total-timesteps", "384"]
    out = run_main(DISCRETE, argv + ["--gae-backend", gae_backend, bootstrap], capsys)
    check_log(out, iterations=3)
    # what really ran (on CPU tensors: the C kernel, numba without it, Triton's interpreter
    # under TRITON_INTERPRET=1 with RL_TRITON_CORE_BACKEND=triton), never a claim of Triton
    assert f"gae_backend={gae_backend} gae_ran_on={expected_runner(gae_backend)}" in out
    assert "triton-cuda" not in out


@pytest.mark.parametrize("gae_backend", ["rl-triton-core", "cleanrl-loop"])
@pytest.mark.parametrize("bootstrap", ["--bootstrap-truncated", "--no-bootstrap-truncated"])
def test_continuous_smoke(gae_backend, bootstrap, capsys):
    # Pendulum truncates every episode at 200 steps: 256 steps per env see one.
    argv = TINY + ["--total-timesteps", "512", "--update-epochs", "2"]
    out = run_main(CONTINUOUS, argv + ["--gae-backend", gae_backend, bootstrap], capsys)
    check_log(out, iterations=4)
    assert f"gae_ran_on={expected_runner(gae_backend)}" in out
    assert re.search(r"episodic_return=-\d+\.\d \(mean of last 2,", out), out


def test_discrete_cli():
    """The script runs as a file with tyro's command line, as in the docs."""
    cmd = [sys.executable, str(DISCRETE), *TINY, "--total-timesteps", "256"]
    cmd += ["--gae-backend", "cleanrl-loop", "--no-bootstrap-truncated"]
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
