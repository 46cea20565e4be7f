"""Sessions: tests, tests_long, extras, lint, demo, bench, docs, compat.
Run `python3 -m nox -s <name>`.

torch is pinned and installed first, explicitly: a bare `torch` requirement
would pull a multi-GB CUDA build on a CPU-only machine. Without an NVIDIA GPU, torch
comes from PyTorch's CPU index where that index is reachable. `RL_TRITON_CORE_TORCH`
overrides what is installed (pip arguments, split like a shell line), e.g.

    RL_TRITON_CORE_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" \
        python3 -m nox -s tests
"""

import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _torch_spec() -> list:
    """What installs torch: ``RL_TRITON_CORE_TORCH`` if set (pip arguments), else
    torch 2.13.0 -- from PyTorch's CPU index on a machine without an NVIDIA GPU where that
    index answers (PyPI's Linux wheels of torch are CUDA builds of several GB), else from
    the configured index (a local CPU wheel on an offline machine, a CUDA build on a GPU
    machine)."""
    if "RL_TRITON_CORE_TORCH" in os.environ:
        return shlex.split(os.environ["RL_TRITON_CORE_TORCH"])
    spec = ["torch==2.13.0"]
    gpu = shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0")
    if not gpu and sys.platform == "linux" and _reachable("download.pytorch.org"):
        spec += ["--index-url", CPU_INDEX]
    return spec


def _reachable(host: str) -> bool:
    import socket

    try:
        with socket.create_connection((host, 443), timeout=3):
            return True
    except OSError:
        return False


TORCH = _torch_spec()


def _install(session, extras):
    session.install(*TORCH)
    session.install("-e", f".[{extras}]")


# The LLM post-training frameworks the verl / OpenRLHF / TRL adapters are tested against.
# Their own requirements (vLLM, DeepSpeed, flash-attn, Ray pins, tensordict<=0.10) would
# replace torch or cannot install on a CPU machine, so they come without dependencies,
# plus what verl.trainer.ppo.core_algos imports (transformers < 5.11 per verl). The
# OpenRLHF tests load its experience maker with stand-ins for DeepSpeed / vLLM imports,
# the TRL tests compile the advantage block from TRL's file: neither needs more.
LLM_DEPS = ["transformers==5.10.4", "omegaconf==2.4.0", "codetiming==1.4.0"]
LLM_FRAMEWORKS = ["verl==0.9.1", "openrlhf==0.11.2", "trl==1.12.0"]  # trl 1.13 dropped PPO


def _install_llm_frameworks(session):
    session.install(*LLM_DEPS)
    session.install("--no-deps", *LLM_FRAMEWORKS)


def _copy_source(session, dest):
    """The files git would commit (tracked, and new ones it does not ignore), copied to
    ``dest``: a stale ``build/`` or ``*.egg-info`` in the checkout cannot leak into the
    wheel (setuptools reuses ``build/lib``, so a package dropped from the list would still
    ship from a local build)."""
    listing = session.run("git", "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard", silent=True, external=True)
    for name in filter(None, listing.split("\0")):
        path = Path(name)
        if path.is_file():  # not a deletion that is not committed yet
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / path)


def _wheel_smoke(session):
    """The wheel as a user gets it: built from the tree, installed with its own
    dependencies (torch first, pinned) into a fresh venv, and run from a directory
    outside the source tree, so that nothing resolves to the checkout. Catches a
    package missing from ``[tool.setuptools] packages`` (e.g. ``rl_triton_core.bench``)
    and adapters that import their framework at ``import`` time."""
    tmp = Path(tempfile.mkdtemp(prefix="rl_triton_wheel_"))
    try:
        src, dist, venv, cwd = tmp / "src", tmp / "dist", tmp / "venv", tmp / "run"
        cwd.mkdir()
        _copy_source(session, src)
        session.run("python", "-m", "pip", "wheel", "-q", "--no-deps", str(src), "-w",
                    str(dist))
        (wheel,) = dist.glob("rl_triton_core-*.whl")
        session.run("python", "-m", "venv", str(venv))
        python = str(venv / ("Scripts" if sys.platform == "win32" else "bin") / "python")
        session.run(python, "-m", "pip", "install", "-q", *TORCH, external=True)
        session.run(python, "-m", "pip", "install", "-q", str(wheel), external=True)
        with session.chdir(cwd):
            session.run(python, "-m", "rl_triton_core.bench", "--help", external=True,
                        silent=True)
            # the adapters import their frameworks lazily: none is in this venv
            session.run(python, "-c", "import rl_triton_core, rl_triton_torchrl, "
                        "rl_triton_rllib, rl_triton_cleanrl, rl_triton_verl, "
                        "rl_triton_openrlhf, rl_triton_trl; "
                        "print('wheel OK:', rl_triton_core.__file__)", external=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


CI_MARKS = "not gpu and not multigpu and not slow"


def _suite(session):
    """What the CI test tiers install and set."""
    _install(session, "dev,torchrl,rllib,cleanrl,bench,docs")
    _install_llm_frameworks(session)
    session.env["TRITON_INTERPRET"] = "1"
    session.env["PYTHONHASHSEED"] = "0"


@nox.session
def tests(session):
    """The CI suite (CPU only): core on the numba path and in the Triton interpreter,
    the adapters against the real TorchRL, RLlib and gymnasium, verl, OpenRLHF and TRL.
    Tests marked ``long`` are left to ``tests_long``, which .ci/run runs after this."""
    _suite(session)
    args = session.posargs or ["-m", f"{CI_MARKS} and not long", "-n", "2",
                               "--durations=15"]
    session.run("python", "-m", "pytest", *args)
    if not session.posargs:  # the docs site must build cleanly too (API pages import the code)
        session.env["NO_MKDOCS_2_WARNING"] = "1"
        session.run("mkdocs", "build", "--strict", "--site-dir", str(session.create_tmp()) +
                    "/site")
        _wheel_smoke(session)  # and the wheel must install and run outside the tree


@nox.session(venv_backend="none")
def tests_long(session):
    """The long CI tier: the tests marked ``long`` (the second fuzz chunk of each
    estimator, the second share of the hypothesis examples, the interpreter's full
    gradchecks), run in the environment of ``tests`` (``.nox/tests``), not one of its own:
    a second copy of the suite's installs (Ray, torch, triton, transformers) is several
    GB of disk. Where ``tests`` has not run, its installs run first (``--install-only``)."""
    envdir = Path(session.invoked_from) / ".nox" / "tests"
    python = _venv_python(envdir)
    if not Path(python).exists():
        session.run(sys.executable, "-m", "nox", "-s", "tests", "--install-only",
                    external=True)
    session.env["TRITON_INTERPRET"] = "1"
    session.env["PYTHONHASHSEED"] = "0"
    session.env["PATH"] = os.pathsep.join([str(Path(python).parent),
                                           os.environ.get("PATH", "")])
    args = session.posargs or ["-m", f"long and {CI_MARKS}", "-n", "2", "--durations=15"]
    session.run(python, "-m", "pytest", *args, external=True)


def _venv_python(path: Path) -> str:
    return str(path / ("Scripts" if sys.platform == "win32" else "bin") / "python")


# What `extras` checks for each extra of pyproject.toml, installed as the docs say (torch
# first, then `pip install -e ".[extra]"`):
#   "fresh":   installed into a venv of its own;
#   "add":     installed into the session's venv, which holds torch and the core only
#              until then (one venv fewer to build: each builds the C kernels);
#   "resolve": `pip install --dry-run` in the session's venv, where the install is too big
#              for CI (Ray, verl's stack, TRL's datasets/transformers) or is what `tests`
#              installs anyway (dev, bench, docs).
# Then the commands, in that venv ("resolve": the session's; rllib_ppo.py imports Ray only
# after parsing its flags), and for "resolve" an optional check of what was resolved.
_HELP = "--help"
EXTRAS = {
    "torchrl": ("fresh", [["examples/torchrl_ppo.py", _HELP]]),
    "rllib": ("resolve", [["examples/rllib_ppo.py", _HELP]]),
    "verl": ("resolve", []),
    "trl": ("resolve", []),
    "dev": ("resolve", []),
    "bench": ("resolve", [["-m", "rl_triton_core.bench", _HELP]]),
    "docs": ("resolve", []),
    "cleanrl": ("add", [["examples/cleanrl_ppo.py", _HELP],
                        ["examples/cleanrl_ppo_continuous.py", _HELP]]),
}
# Extras that the docs say cannot share an environment: the resolve must fail.
CONFLICTS = [("torchrl", "verl")]  # tensordict 0.14 against verl's <= 0.10
_OPENRLHF_CHECK = """
import rl_triton_openrlhf
try:
    rl_triton_openrlhf.install()
except ImportError as e:
    assert type(e) is ImportError, repr(e)
    assert (e.name == "openrlhf") == {absent!r}, repr(e)  # OpenRLHF, or what it imports
    assert {absent!r} or "Not importable here: flash_attn (flash-attn)" in str(e), repr(e)
    print("rl_triton_openrlhf.install() ->", e)
else:
    raise SystemExit("rl_triton_openrlhf.install() did not raise")
"""


def _requirement_names(extras: str) -> set:
    try:
        import tomllib
    except ImportError:  # Python 3.10: no listing
        return set()
    table = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    return {re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower().replace("_", "-")
            for extra in extras.split(",") for req in table["optional-dependencies"][extra]}


def _dry_run(session, extras, ok=True) -> dict:
    """``pip install --dry-run -e .[extras]`` in the session's venv: {name: version} of
    what it would install (``ok``), or a check that it fails with ResolutionImpossible."""
    out = session.run("python", "-m", "pip", "install", "--dry-run", "-e", f".[{extras}]",
                      silent=True, success_codes=[0] if ok else [1])
    if not ok:
        if "ResolutionImpossible" not in out:
            session.error(f".[{extras}] failed to resolve for another reason:\n{out[-2000:]}")
        session.log(f".[{extras}] cannot be resolved together, as the docs say")
        return {}
    would = [line for line in out.splitlines() if line.startswith("Would install")]
    names = dict(n.rsplit("-", 1) for n in (would[-1].split()[2:] if would else []))
    names = {k.lower().replace("_", "-"): v for k, v in names.items()}
    direct = _requirement_names(extras)
    session.log(f".[{extras}] resolves: {len(names)} packages, among them " + ", ".join(
        f"{k} {v}" for k, v in sorted(names.items()) if k in direct))
    return names


def _trl_has_ppo(session, versions):
    """The TRL that .[trl] resolves to has PPOTrainer at trl.experimental.ppo (the docs
    say so), read from its wheel (TRL's import needs datasets/transformers)."""
    import zipfile

    version = versions["trl"]
    with tempfile.TemporaryDirectory() as tmp:
        session.run("python", "-m", "pip", "download", "-q", "--no-deps", f"trl=={version}",
                    "-d", tmp, silent=True)
        (wheel,) = Path(tmp).glob("trl-*.whl")
        with zipfile.ZipFile(wheel) as z:
            source = z.read("trl/experimental/ppo/ppo_trainer.py").decode()
            init = z.read("trl/experimental/ppo/__init__.py").decode()
    if "class PPOTrainer" not in source or "PPOTrainer" not in init:
        session.error(f"trl {version} has no trl.experimental.ppo.PPOTrainer")
    session.log(f"trl {version}: PPOTrainer in trl.experimental.ppo")


CHECKS = {"trl": _trl_has_ppo}


def _fresh_venv_install(session, extra, commands):
    tmp = Path(tempfile.mkdtemp(prefix=f"rl_triton_{extra}_"))
    try:
        session.run("python", "-m", "venv", str(tmp / "venv"))
        python = _venv_python(tmp / "venv")
        pip = [python, "-m", "pip", "install", "-q", "--no-compile"]
        session.run(*pip, *TORCH, external=True)
        session.run(*pip, "-e", f".[{extra}]", external=True)
        for command in commands:
            session.run(python, *command, external=True, silent=command[-1] == _HELP)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@nox.session
def extras(session):
    """Every extra of pyproject.toml as the docs install it on a CPU machine: installed
    (torch first) or, where too big for CI, resolved with `pip install --dry-run`; then
    its examples' --help. Also: the extras the docs say cannot share an environment do
    not resolve together, and rl_triton_openrlhf.install() names what is missing
    (OpenRLHF; then, with OpenRLHF --no-deps, its GPU stack). Reuses pip's cache, which
    `tests` has filled."""
    start = time.monotonic()
    timings = []
    # the session's venv: torch and the core (.[openrlhf] adds nothing: see pyproject.toml)
    session.install("--no-compile", *TORCH)
    session.install("--no-compile", "-e", ".[openrlhf]")
    session.run("python", "-c", _OPENRLHF_CHECK.format(absent=True))
    for extra, (how, commands) in EXTRAS.items():
        t0 = time.monotonic()
        if how == "fresh":
            _fresh_venv_install(session, extra, commands)
        else:
            if how == "resolve":
                versions = _dry_run(session, extra)
                if extra in CHECKS:
                    CHECKS[extra](session, versions)
            else:
                session.install("--no-compile", "-e", f".[{extra}]")
            for command in commands:
                session.run("python", *command, silent=command[-1] == _HELP)
        timings.append((extra, how, time.monotonic() - t0))
    for pair in CONFLICTS:
        t0 = time.monotonic()
        _dry_run(session, ",".join(pair), ok=False)
        timings.append(("+".join(pair), "no common resolve", time.monotonic() - t0))
    t0 = time.monotonic()
    session.install("--no-deps", next(f for f in LLM_FRAMEWORKS if f.startswith("openrlhf")))
    session.run("python", "-c", _OPENRLHF_CHECK.format(absent=False))
    timings.append(("openrlhf", "add (the core); install() errors", time.monotonic() - t0))
    for extra, how, seconds in timings:
        session.log(f"  .[{extra}]: {how}: OK in {seconds:.0f} s")
    session.log(f"extras: all OK in {time.monotonic() - start:.0f} s")


@nox.session
def compat(session):
    """The oldest supported pair (torch 2.11, triton 3.6): the core tests on the CPU path
    and in that Triton's interpreter, the compile tests under that torch's dynamo.
    Not in CI (a second torch install); run it when the launch or compile path changes."""
    # numpy < 2.3: triton 3.6's interpreter turns 1-element arrays into loop bounds with
    # int(), which newer numpy refuses
    session.install(*shlex.split(os.environ.get("RL_TRITON_CORE_TORCH_OLD", "torch==2.11.0")),
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
