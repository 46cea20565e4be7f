"""Fixtures of the verl adapter tests (verl 0.9.1 installed with ``--no-deps``, plus
omegaconf, transformers and codetiming: enough for ``verl.trainer.ppo.core_algos``)."""

import pytest


@pytest.fixture(scope="session")
def core_algos():
    return pytest.importorskip("verl.trainer.ppo.core_algos",
                               reason="needs verl (pip install --no-deps verl==0.9.1)")


@pytest.fixture
def installed(core_algos):
    """For tests that call ``install()``: verl's own functions again afterwards."""
    import rl_triton_verl

    rl_triton_verl.uninstall()
    yield rl_triton_verl
    rl_triton_verl.uninstall()
