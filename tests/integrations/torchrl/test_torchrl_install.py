"""install() / uninstall(): idempotent, undoable, and reaching every way TorchRL gets its math."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrl")

import torchrl.objectives.value as trl_value  # noqa: E402
import torchrl.objectives.value.advantages as trl_advantages  # noqa: E402
import torchrl.objectives.value.functional as trl_functional  # noqa: E402
from rl_triton_torchrl import functional as ours_functional  # noqa: E402
from rl_triton_torchrl.estimators import REPLACEMENTS  # noqa: E402
from torchrl.objectives import utils as trl_utils  # noqa: E402

import rl_triton_core  # noqa: E402

PATCHED_MODULES = (trl_functional, trl_advantages)


def snapshot():
    registry = {k: (e.cls, dict(e.default_kwargs))
                for k, e in trl_utils._VALUE_ESTIMATOR_REGISTRY.items()}
    names = {(m.__name__, n): getattr(m, n, None)
             for m in PATCHED_MODULES for n in ours_functional.REPLACED}
    return registry, names


def test_install_then_uninstall_restores_everything(installed):
    before = snapshot()
    assert installed.is_installed() == {"estimators": False, "functional": False}
    installed.install()
    assert installed.is_installed() == {"estimators": True, "functional": True}
    registry, names = snapshot()
    for key, (cls, defaults) in before[0].items():
        assert registry[key] == (REPLACEMENTS.get(cls, cls), defaults)
    for (module, name), fn in names.items():
        if fn is not None:
            assert fn is getattr(ours_functional, name), (module, name)
            assert fn.__wrapped__ is before[1][module, name]
    installed.uninstall()
    assert snapshot() == before
    assert installed.is_installed() == {"estimators": False, "functional": False}


def test_idempotent(installed):
    before = snapshot()
    installed.install()
    once = snapshot()
    installed.install()
    assert snapshot() == once
    installed.uninstall()
    installed.uninstall()
    assert snapshot() == before


def test_partial_installs(installed):
    before = snapshot()
    installed.install(functional=False)
    assert installed.is_installed() == {"estimators": True, "functional": False}
    assert snapshot()[1] == before[1]
    installed.uninstall()
    installed.install(estimators=False)
    assert installed.is_installed() == {"estimators": False, "functional": True}
    assert snapshot()[0] == before[0]


def test_a_users_own_estimator_is_left_alone(installed):
    from torchrl.objectives.utils import ValueEstimators

    class MyGAE(trl_advantages.GAE):
        pass

    table = trl_utils._VALUE_ESTIMATOR_REGISTRY
    saved = table[ValueEstimators.GAE]
    table[ValueEstimators.GAE] = trl_utils._ValueEstimatorRegistryEntry(MyGAE, {"gamma": 0.5})
    try:
        installed.install()
        assert table[ValueEstimators.GAE].cls is MyGAE
        installed.uninstall()
        assert table[ValueEstimators.GAE].cls is MyGAE
    finally:
        table[ValueEstimators.GAE] = saved


def test_torchrl_estimators_built_before_install_use_the_core(installed, monkeypatch):
    from tensordict import TensorDict

    est = trl_value.GAE(gamma=0.9, lmbda=0.9, value_network=None)
    td = TensorDict(
        {"state_value": torch.randn(2, 8, 1),
         "next": {"state_value": torch.randn(2, 8, 1), "reward": torch.randn(2, 8, 1),
                  "done": torch.zeros(2, 8, 1, dtype=torch.bool),
                  "terminated": torch.zeros(2, 8, 1, dtype=torch.bool)}},
        batch_size=(2, 8),
    )
    calls = []
    original = rl_triton_core.gae
    monkeypatch.setattr(rl_triton_core, "gae", lambda *a, **k: calls.append(1) or original(*a, **k))
    expected = est(td.clone())["advantage"]
    assert not calls
    installed.install()
    got = est(td.clone())["advantage"]
    assert calls == [1]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    installed.uninstall()
    est(td.clone())
    assert calls == [1]


def test_functional_module_calls_see_the_patch(installed):
    installed.install()
    v, nv, r = torch.randn(3, 2, 10, 1)
    done = torch.zeros(2, 10, 1, dtype=torch.bool)
    adv = trl_functional.td_lambda_advantage_estimate(0.9, 0.9, v, nv, r, done)
    assert trl_functional.td_lambda_return_estimate is ours_functional.td_lambda_return_estimate
    assert adv.shape == v.shape


def test_importing_does_not_patch():
    assert trl_functional.generalized_advantage_estimate.__module__ == (
        "torchrl.objectives.value.functional"
    )


def test_originals_are_found_while_installed(installed):
    """A (re-)import of the drop-ins while installed still falls back to TorchRL's own."""
    original = trl_functional.generalized_advantage_estimate
    installed.install()
    assert trl_functional.generalized_advantage_estimate is not original
    assert ours_functional._torchrl_original("generalized_advantage_estimate") is original
