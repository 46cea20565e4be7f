"""IMPALA / APPO: RLlib's ``vtrace_torch`` on the core's ``vtrace``.

The IMPALA and APPO torch learners call the module-level name ``vtrace_torch`` inside
``compute_loss_for_module``. :func:`patch_vtrace` points that name, in both learner
modules, at a dispatcher that calls :func:`rl_triton_rllib.functional.vtrace_torch`
only while a learner with :class:`TritonVTraceMixin` is computing its loss (a
``ContextVar``, so other learners in the process, and other threads, keep RLlib's
function). The patch is idempotent, keeps the original as ``__wrapped__`` and is
undone by :func:`unpatch_vtrace`.
"""

from __future__ import annotations

import contextvars
import importlib
import logging
from dataclasses import dataclass

import torch
from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner
from ray.rllib.algorithms.impala.torch.impala_torch_learner import IMPALATorchLearner
from ray.rllib.algorithms.impala.torch.vtrace_torch_v2 import make_time_major
from ray.rllib.core.columns import Columns
from rl_triton_rllib import functional
from rl_triton_rllib._options import RLTritonOptions

logger = logging.getLogger(__name__)

__all__ = [
    "TritonVTraceMixin",
    "TritonIMPALATorchLearner",
    "TritonAPPOTorchLearner",
    "patch_vtrace",
    "unpatch_vtrace",
]

# The learner modules whose loss calls the global name ``vtrace_torch``.
_PATCH_TARGETS = (
    "ray.rllib.algorithms.impala.torch.impala_torch_learner",
    "ray.rllib.algorithms.appo.torch.appo_torch_learner",
)


@dataclass(frozen=True)
class _ActiveCall:
    """Set while a Triton V-trace learner computes one module's loss."""

    truncateds: torch.Tensor | None  # [T, B] chunk-end flags when fix_truncation


_ACTIVE: contextvars.ContextVar[_ActiveCall | None] = contextvars.ContextVar(
    "rl_triton_vtrace_call", default=None
)


def _make_dispatcher(original):
    def vtrace_torch(**kwargs):
        call = _ACTIVE.get()
        if call is None:
            return original(**kwargs)
        return functional.vtrace_torch(**kwargs, truncateds=call.truncateds)

    vtrace_torch.__wrapped__ = original
    vtrace_torch._rl_triton_dispatcher = True
    vtrace_torch.__doc__ = (
        "rl_triton dispatcher: rl_triton_rllib.functional.vtrace_torch inside a "
        "TritonVTraceMixin learner's loss, RLlib's vtrace_torch (__wrapped__) elsewhere."
    )
    return vtrace_torch


def patch_vtrace() -> None:
    """Route ``vtrace_torch`` of the IMPALA and APPO torch learners through the
    dispatcher. Idempotent; undo with :func:`unpatch_vtrace`."""
    for name in _PATCH_TARGETS:
        module = importlib.import_module(name)
        current = module.vtrace_torch
        if not getattr(current, "_rl_triton_dispatcher", False):
            module.vtrace_torch = _make_dispatcher(current)


def unpatch_vtrace() -> None:
    """Put RLlib's ``vtrace_torch`` back in the learner modules."""
    for name in _PATCH_TARGETS:
        module = importlib.import_module(name)
        current = module.vtrace_torch
        while getattr(current, "_rl_triton_dispatcher", False):
            current = current.__wrapped__
        module.vtrace_torch = current


class TritonVTraceMixin:
    """Learner mixin for IMPALA / APPO torch learners: V-trace on the core.

    Put it first among the bases: ``class MyLearner(TritonVTraceMixin, APPOTorchLearner)``.
    Reads :class:`RLTritonOptions` from ``config.learner_config_dict["rl_triton"]``:
    ``vtrace`` switches it, ``fix_truncation`` bootstraps truncated / cut chunk ends
    correctly instead of reproducing RLlib's numbers (see ``docs/rllib.md``).
    """

    def build(self) -> None:
        super().build()
        self._rl_triton_vtrace = None
        options = RLTritonOptions.from_config(self.config)
        if not options.vtrace:
            logger.info("rl_triton: vtrace=False, keeping RLlib's vtrace_torch")
            return
        patch_vtrace()
        self._rl_triton_vtrace = options

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        options = getattr(self, "_rl_triton_vtrace", None)
        if options is None:
            return super().compute_loss_for_module(
                module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        truncateds = None
        if options.fix_truncation:
            # The same [B*T] -> [T, B] layout the loss gives every other column.
            truncateds = make_time_major(
                batch[Columns.TRUNCATEDS],
                trajectory_len=config.get_rollout_fragment_length(),
                recurrent_seq_len=batch.get("seq_lens"),
            )
        token = _ACTIVE.set(_ActiveCall(truncateds=truncateds))
        try:
            return super().compute_loss_for_module(
                module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        finally:
            _ACTIVE.reset(token)


class TritonIMPALATorchLearner(TritonVTraceMixin, IMPALATorchLearner):
    """RLlib's ``IMPALATorchLearner`` with V-trace on the ``rl_triton_core`` kernels."""


class TritonAPPOTorchLearner(TritonVTraceMixin, APPOTorchLearner):
    """RLlib's ``APPOTorchLearner`` with V-trace on the ``rl_triton_core`` kernels."""
