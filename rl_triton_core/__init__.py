"""rl_triton_core: RL credit assignment as one associative linear-recurrence scan.

Every estimator (GAE, TD(lambda) and discounted returns, V-trace, Retrace(lambda),
eligibility traces, episodic sums) is a first-order linear recurrence

    backward:  h_t = alpha_t + beta_t * h_{t+1},   h_T = 0 (or ``init``)
    forward:   h_t = alpha_t + beta_t * h_{t-1},   h_{-1} = init

whose coefficients are built from the raw inputs inside one Triton kernel on CUDA
tensors, or inside one compiled loop on CPU tensors: C, built at install, for GAE,
TD(lambda), discounted returns and the token-level estimators; numba for the rest (and
for all where the C kernels were not built).

Layers, each importing only those below it: ``estimators`` (the public functions:
signatures, docstrings) over the ``scan`` sub-package -- ``_ops`` (one custom op per
estimator, for torch.compile) -> ``_autograd`` (the autograd Functions and backward
passes) -> ``_call`` (checks) -> ``_dispatch`` (the backend and the cached calls) ->
``_launch`` and ``_kernel`` (Triton, imported on first CUDA use) or the CPU path:
``_cpu_c`` (the C kernel ``_cscan``), ``_cpu_first`` and ``_cpu`` (numba); ``tokens``
over the ``token`` sub-package (its Triton, numba and C kernels). Shared by both:
``_record`` (the one recorded-call type), ``_host`` and ``_tl`` (host and Triton
helpers), ``_table`` (one row per estimator), ``_config`` (the tuning knobs),
``_layout`` and ``_validate``; ``_report`` says what ran. docs/design.md draws it.
"""

from rl_triton_core import estimators
from rl_triton_core._config import Tuning, current_tuning, tuning
from rl_triton_core._report import backend_for, describe
from rl_triton_core._version import __version__ as __version__
from rl_triton_core.estimators import *  # noqa: F403 (every estimator: estimators.__all__)
from rl_triton_core.groups import group_advantages
from rl_triton_core.tokens import masked_gae, masked_returns, masked_whiten

__all__ = [
    "group_advantages",
    "masked_gae",
    "masked_returns",
    "masked_whiten",
    "backend_for",
    "describe",
    "Tuning",
    "tuning",
    "current_tuning",
]
__all__ += estimators.__all__
