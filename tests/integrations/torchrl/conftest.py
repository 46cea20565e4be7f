"""Fixtures of the TorchRL adapter tests."""

import pytest


@pytest.fixture
def installed():
    """For tests that call ``install()``: TorchRL's own code again afterwards, whatever happens."""
    rl_triton_torchrl = pytest.importorskip("rl_triton_torchrl")
    pytest.importorskip("torchrl")
    rl_triton_torchrl.uninstall()
    yield rl_triton_torchrl
    rl_triton_torchrl.uninstall()


@pytest.fixture(autouse=True)
def _no_tf32_in_torchrl_convolutions(monkeypatch):
    """TorchRL's vectorized forms are a conv1d, which on CUDA runs in TF32 by default
    (errors of ~1e-3): compare against TorchRL's float32 numbers, not its TF32 ones."""
    import torch

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
