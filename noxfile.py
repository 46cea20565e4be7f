"""Sessions: tests, lint, demo, bench, docs.  Run `python3 -m nox -s <name>`.

torch is pinned and installed first, explicitly: a bare `torch` requirement
would pull a multi-GB CUDA build on a CPU-only machine.
"""

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]

TORCH = os.environ.get("RL_TRITON_CORE_TORCH", "torch==2.13.0")


def _install(session, extras):
    session.install(TORCH)
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session):
    """The CI suite (CPU only): core on the numba path and in the Triton interpreter,
    the adapters against the real TorchRL, RLlib and gymnasium."""
    _install(session, "dev,torchrl,rllib,cleanrl,bench,docs")
    session.env["TRITON_INTERPRET"] = "1"
    session.env["PYTHONHASHSEED"] = "0"
    args = session.posargs or ["-m", "not gpu and not multigpu and not slow", "-n", "2",
                               "--durations=15"]
    session.run("python", "-m", "pytest", *args)
    if not session.posargs:  # the docs site must build cleanly too (API pages import the code)
        session.env["NO_MKDOCS_2_WARNING"] = "1"
        session.run("mkdocs", "build", "--strict", "--site-dir", str(session.create_tmp()) +
                    "/site")


@nox.session
def lint(session):
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session
def demo(session):
    """The main job: CleanRL PPO on CartPole with GAE on the kernels, solved on the CPU."""
    _install(session, "cleanrl")
    args = session.posargs or ["--no-cuda", "--target-return", "475"]
    session.run("python", "examples/cleanrl_ppo.py", *args)


@nox.session
def bench(session):
    """The benchmark on whatever GPU is present (CPU peers where there is none)."""
    _install(session, "bench,torchrl")
    session.run("python", "-m", "rl_triton_core.bench", *session.posargs)


@nox.session
def docs(session):
    _install(session, "docs")
    session.run("mkdocs", "build", "--strict")
