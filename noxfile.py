"""Sessions: tests, lint, demo, bench, docs, compat.  Run `python3 -m nox -s <name>`.

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
def compat(session):
    """The oldest supported pair (torch 2.11, triton 3.6): the core tests on the CPU path
    and in that Triton's interpreter, the compile tests under that torch's dynamo.
    Not in CI (a second torch install); run it when the launch or compile path changes."""
    # numpy < 2.3: triton 3.6's interpreter turns 1-element arrays into loop bounds with
    # int(), which newer numpy refuses
    session.install(os.environ.get("RL_TRITON_CORE_TORCH_OLD", "torch==2.11.0"),
                    "triton==3.6.0", "numpy<2.3")
    session.install("-e", ".[dev,bench]")
    session.env["TRITON_INTERPRET"] = "1"
    session.run("python", "-c", "import torch, triton; print('torch', torch.__version__, "
                "'triton', triton.__version__)")
    args = session.posargs or ["tests/core", "-m", "not gpu and not multigpu and not slow",
                               "-n", "2", "-p", "no:cacheprovider"]
    session.run("python", "-m", "pytest", *args)


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
