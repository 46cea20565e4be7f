"""rl_triton_openrlhf: OpenRLHF's token-level GAE and REINFORCE returns on ``rl_triton_core``.

Same numbers as OpenRLHF 0.11's ``get_advantages_and_returns`` and
``get_cumulative_returns`` (methods of
``openrlhf.trainer.ppo_utils.experience_maker.RemoteExperienceMaker``), without the
Python loop over tokens. Two levels of use (``docs/llm.md``):

1. one call in the process that makes experiences (OpenRLHF's ``PPOTrainer`` is a Ray
   actor: patch its process, e.g. with Ray's setup hook)::

       import rl_triton_openrlhf
       rl_triton_openrlhf.install()      # undo with rl_triton_openrlhf.uninstall()

       ray.init(runtime_env={"worker_process_setup_hook": "rl_triton_openrlhf.install"})

2. by hand: :func:`get_advantages_and_returns` ``(values, rewards, action_mask, gamma,
   lambd)`` and :func:`get_cumulative_returns` ``(rewards, action_mask, gamma)``.

``install()`` sets both methods of ``RemoteExperienceMaker`` to these functions (as
static methods), keeps OpenRLHF's for :func:`uninstall`, and leaves a method that is
neither (a user's patch, made before or after the first ``install()``) alone. OpenRLHF's
method is recognised by what it is, the function that ``experience_maker``'s class body
defines (under its ``@torch.no_grad()``), not by what the class held when ``install()``
first ran. OpenRLHF is imported only by
``install()`` / ``uninstall()`` / ``is_installed()``.

OpenRLHF's own modules import its GPU stack (flash-attn, DeepSpeed, vLLM) when they
load, so ``install()`` works in an OpenRLHF environment (OpenRLHF installed as its docs
say); without OpenRLHF, or without a module of its stack, it raises an ``ImportError``
that names what is missing and the OpenRLHF file that imports it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import traceback

from rl_triton_openrlhf.functional import get_advantages_and_returns, get_cumulative_returns

__all__ = ["install", "uninstall", "is_installed", "get_advantages_and_returns",
           "get_cumulative_returns", "EXPERIENCE_MAKER"]

EXPERIENCE_MAKER = "openrlhf.trainer.ppo_utils.experience_maker"
_METHODS = {"get_advantages_and_returns": get_advantages_and_returns,
            "get_cumulative_returns": get_cumulative_returns}
_ORIGINALS: dict = {}


# What OpenRLHF's own modules import at import time (its GPU stack): module -> pip name
GPU_STACK = {"flash_attn": "flash-attn", "deepspeed": "deepspeed", "vllm": "vllm"}


def _maker_module():
    try:
        return importlib.import_module(EXPERIENCE_MAKER)
    except ModuleNotFoundError as e:
        raise _missing(e) from e


def _maker_class():
    return _maker_module().RemoteExperienceMaker


def _is_openrlhfs(method, module, name: str) -> bool:
    """``method`` is OpenRLHF's own ``RemoteExperienceMaker.<name>``: the function that
    the class body in ``module``'s source defines (its globals are that module's
    namespace), bare or as OpenRLHF decorates it (``@torch.no_grad()``: one wrapper made
    by torch around it). A user's replacement is not, even a ``functools.wraps`` wrapper
    that copies OpenRLHF's name, qualname and module (its globals are the user's)."""
    qualname = f"{module.RemoteExperienceMaker.__qualname__}.{name}"

    def defined_here(fn):
        return (getattr(fn, "__globals__", None) is vars(module)
                and getattr(fn, "__qualname__", None) == qualname)

    if defined_here(method):
        return True
    made_by = (getattr(method, "__globals__", None) or {}).get("__name__", "")
    return made_by.partition(".")[0] == "torch" and defined_here(
        getattr(method, "__wrapped__", None))


def _missing(e: ModuleNotFoundError) -> ImportError:
    """The error for an OpenRLHF that cannot be imported: what is missing and why."""
    missing = (e.name or "").partition(".")[0]
    if missing == "openrlhf":
        return ImportError(
            "rl_triton_openrlhf.install() patches OpenRLHF's RemoteExperienceMaker, and "
            "OpenRLHF is not installed here. Install rl-triton-core into your OpenRLHF "
            "environment (OpenRLHF with its GPU stack: flash-attn, DeepSpeed, vLLM).",
            name="openrlhf")
    # the last OpenRLHF file on the import chain: the one that imports the missing module
    sep = f"{os.sep}openrlhf{os.sep}"
    where = [f.filename for f in traceback.extract_tb(e.__traceback__) if sep in f.filename]
    origin = ""
    if where:
        rel = where[-1].rsplit(sep, 1)[1].replace(os.sep, "/")
        origin = f", imported by openrlhf/{rel}"
    absent = [f"{mod} ({pip})" for mod, pip in GPU_STACK.items() if not _importable(mod)]
    also = f" Not importable here: {', '.join(absent)}." if absent else ""
    return ImportError(
        f"rl_triton_openrlhf.install() needs OpenRLHF's {EXPERIENCE_MAKER}, and importing "
        f"it failed: no module named {e.name!r}{origin}. OpenRLHF's own modules import its "
        f"dependencies when they load, its GPU stack (flash-attn, DeepSpeed, vLLM) "
        f"included, so an OpenRLHF installed without them (pip install --no-deps "
        f"openrlhf) cannot be imported.{also} Call install() in your OpenRLHF environment "
        f"(OpenRLHF installed as its docs say, on a CUDA machine), with rl-triton-core "
        f"installed into it.",
        name=e.name)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def install() -> None:
    """Make OpenRLHF's experience maker compute GAE and REINFORCE returns on
    ``rl_triton_core``. Harmless twice; undo with :func:`uninstall`."""
    module = _maker_module()
    cls = module.RemoteExperienceMaker
    for name, ours in _METHODS.items():
        current = cls.__dict__.get(name)
        if not _is_openrlhfs(current, module, name):
            continue  # ours already, someone else's patch (left alone), or absent
        _ORIGINALS[name] = current
        setattr(cls, name, staticmethod(ours))


def uninstall() -> None:
    """Undo :func:`install`: OpenRLHF's own methods again; harmless twice."""
    cls = _maker_class()
    for name, ours in _METHODS.items():
        current = cls.__dict__.get(name)
        if isinstance(current, staticmethod) and current.__func__ is ours and name in _ORIGINALS:
            setattr(cls, name, _ORIGINALS[name])


def is_installed() -> dict:
    """``{method name: bool}``: which of the two methods are ours now."""
    cls = _maker_class()
    return {name: isinstance(cls.__dict__.get(name), staticmethod)
            and cls.__dict__[name].__func__ is ours for name, ours in _METHODS.items()}


def __dir__():
    return sorted(set(globals()) | set(__all__))
