"""rl_triton_torchrl: TorchRL's GAE, TD(1), TD(lambda) and V-trace on ``rl_triton_core``.

Same numbers as TorchRL 0.14, the recursion run by one Triton kernel on CUDA
tensors (the core's compiled CPU path on CPU tensors). Three levels of use:

1. everywhere, one call::

       import rl_triton_torchrl
       rl_triton_torchrl.install()        # undo with rl_triton_torchrl.uninstall()

2. one estimator or one loss: TorchRL's classes under the same names (or with a
   ``Triton`` prefix), e.g. ``rl_triton_torchrl.GAE(gamma=..., lmbda=...,
   value_network=critic)`` or
   ``loss.make_value_estimator(rl_triton_torchrl.TritonGAE, gamma=..., lmbda=...,
   value_network=critic)``;

3. by hand: the functional drop-ins with TorchRL's names and signatures,
   ``from rl_triton_torchrl.functional import vec_generalized_advantage_estimate``.

The adapter holds no math: it maps TorchRL's conventions onto the core's
(``rl_triton_torchrl.functional`` says how) and falls back to TorchRL's own code,
saying why, where the core cannot express a configuration. TorchRL is imported
on first use of anything here, not by ``import rl_triton_torchrl``.
"""

from __future__ import annotations

import importlib

from rl_triton_torchrl._install import install, is_installed, uninstall

_FUNCTIONAL = (
    "generalized_advantage_estimate",
    "vec_generalized_advantage_estimate",
    "td0_advantage_estimate",
    "td0_return_estimate",
    "td1_return_estimate",
    "vec_td1_return_estimate",
    "td1_advantage_estimate",
    "vec_td1_advantage_estimate",
    "td_lambda_return_estimate",
    "vec_td_lambda_return_estimate",
    "td_lambda_advantage_estimate",
    "vec_td_lambda_advantage_estimate",
    "vtrace_advantage_estimate",
)
_ESTIMATORS = {
    "TritonGAE": "TritonGAE",
    "TritonMultiAgentGAE": "TritonMultiAgentGAE",
    "TritonTD1Estimator": "TritonTD1Estimator",
    "TritonTDLambdaEstimator": "TritonTDLambdaEstimator",
    "TritonVTrace": "TritonVTrace",
    # TorchRL's own names, so that swapping one import is enough
    "GAE": "TritonGAE",
    "MultiAgentGAE": "TritonMultiAgentGAE",
    "TD1Estimator": "TritonTD1Estimator",
    "TDLambdaEstimator": "TritonTDLambdaEstimator",
    "VTrace": "TritonVTrace",
}

__all__ = ["install", "uninstall", "is_installed", *_ESTIMATORS, *_FUNCTIONAL]


def __getattr__(name: str):
    if name in _ESTIMATORS:
        module = importlib.import_module("rl_triton_torchrl.estimators")
        value = getattr(module, _ESTIMATORS[name])
    elif name in _FUNCTIONAL:
        value = getattr(importlib.import_module("rl_triton_torchrl.functional"), name)
    elif name in ("functional", "estimators"):
        value = importlib.import_module(f"rl_triton_torchrl.{name}")
    else:
        raise AttributeError(f"module 'rl_triton_torchrl' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
