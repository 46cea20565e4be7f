"""rl_triton_openrlhf.install() where OpenRLHF cannot be imported: an ImportError that
says what is missing and why, not the raw ModuleNotFoundError from deep inside OpenRLHF.

A stand-in ``openrlhf`` package in a temporary folder mirrors the real import chain
(``trainer/ppo_utils/experience_maker.py`` -> ``models/ring_attn_utils.py`` ->
``import flash_attn``), with ``flash_attn`` made unimportable, so these tests do not
depend on what is installed. Every ``openrlhf`` module is put back afterwards (the
``experience_maker`` fixture of conftest.py keeps its stand-ins there for the session).
"""

from __future__ import annotations

import sys

import pytest
import rl_triton_openrlhf

FILES = {
    "__init__.py": "",
    "trainer/__init__.py": "",
    "trainer/ppo_utils/__init__.py": "",
    "trainer/ppo_utils/experience_maker.py":
        "from openrlhf.models.ring_attn_utils import gather\n\n"
        "class RemoteExperienceMaker:\n    pass\n",
    "models/__init__.py": "",
    "models/ring_attn_utils.py": "import flash_attn\n\ngather = None\n",
}


@pytest.fixture
def no_openrlhf(monkeypatch):
    """sys.modules without any ``openrlhf`` module; restored afterwards."""
    saved = {k: v for k, v in sys.modules.items() if k == "openrlhf" or k.startswith("openrlhf.")}
    for k in saved:
        del sys.modules[k]
    try:
        yield monkeypatch
    finally:
        for k in [k for k in sys.modules if k == "openrlhf" or k.startswith("openrlhf.")]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.fixture
def openrlhf_without_gpu_stack(no_openrlhf, tmp_path):
    for rel, text in FILES.items():
        path = tmp_path / "openrlhf" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    no_openrlhf.syspath_prepend(str(tmp_path))
    for name in rl_triton_openrlhf.GPU_STACK:
        no_openrlhf.setitem(sys.modules, name, None)  # import raises ModuleNotFoundError


@pytest.mark.parametrize("call", ["install", "uninstall", "is_installed"])
def test_gpu_stack_missing(openrlhf_without_gpu_stack, call):
    with pytest.raises(ImportError) as info:
        getattr(rl_triton_openrlhf, call)()
    e = info.value
    assert type(e) is ImportError  # not the raw ModuleNotFoundError
    assert e.name == "flash_attn"
    assert isinstance(e.__cause__, ModuleNotFoundError)
    text = str(e)
    assert "no module named 'flash_attn'" in text
    assert "imported by openrlhf/models/ring_attn_utils.py" in text  # where
    assert "OpenRLHF's own modules import its dependencies when they load, its GPU " \
        "stack (flash-attn, DeepSpeed, vLLM) included" in text  # why
    assert "flash_attn (flash-attn), deepspeed (deepspeed), vllm (vllm)" in text  # what else
    assert "OpenRLHF environment" in text  # what to do


def test_openrlhf_missing(no_openrlhf):
    no_openrlhf.setitem(sys.modules, "openrlhf", None)
    with pytest.raises(ImportError) as info:
        rl_triton_openrlhf.install()
    e = info.value
    assert type(e) is ImportError and e.name == "openrlhf"
    assert "OpenRLHF is not installed" in str(e)
    assert "OpenRLHF environment" in str(e)


def test_other_errors_pass_through(no_openrlhf, tmp_path):
    """A failure that is not a missing module is OpenRLHF's own: raised as it is."""
    (tmp_path / "openrlhf" / "trainer" / "ppo_utils").mkdir(parents=True)
    for rel in ["__init__.py", "trainer/__init__.py", "trainer/ppo_utils/__init__.py"]:
        (tmp_path / "openrlhf" / rel).write_text("")
    (tmp_path / "openrlhf/trainer/ppo_utils/experience_maker.py").write_text(
        "raise RuntimeError('broken')\n")
    no_openrlhf.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError, match="broken"):
        rl_triton_openrlhf.install()
