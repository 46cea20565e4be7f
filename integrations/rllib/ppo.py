"""PPO: RLlib's GeneralAdvantageEstimation learner connector on the core's ``gae``.

RLlib 2.60's ``GeneralAdvantageEstimation`` piece runs the value function over the
train batch, copies values, rewards and flags to NumPy, removes zero-padding, runs a
Python loop over every step, standardises the advantages and copies the results back
to the learner's device. :class:`TritonGeneralAdvantageEstimation` does the same with
the batch's own tensors on the learner's device: the value forward pass under
``no_grad``, one ``rl_triton_core.gae`` call over the whole flat stream, the same
standardisation, no host round trip and no per-episode loop.

The layout needs no translation. ``AddOneTsToEpisodesAndTruncate`` lays each episode
chunk out as its real steps plus one extra (phantom) step holding the successor state,
and writes step-aligned flags: the last real step of a chunk is ``terminateds`` if the
episode ended there and ``truncateds`` otherwise (time limit or rollout cut); the
phantom step is flagged neither. So on the flat stream, with shifted values
(V'_t = V_{t+1}):

* a truncated chunk end bootstraps from V'_t = V(phantom) = V(s_{t+1}) and stops the
  trace; a terminated one neither bootstraps nor traces;
* nothing flows backwards into a chunk from the next one (its last real step is done);
* the phantom step's own outputs (which borrow the next chunk's first value) are
  garbage that the loss masks out, exactly as in RLlib. They are computed the same way
  as RLlib's because RLlib's mean and standard deviation for the standardisation
  include them.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.connectors.learner.general_advantage_estimation import (
    GeneralAdvantageEstimation,
)
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.evaluation.postprocessing import Postprocessing
from rl_triton_rllib import _core
from rl_triton_rllib._options import RLTritonOptions

logger = logging.getLogger(__name__)

__all__ = [
    "TritonGeneralAdvantageEstimation",
    "TritonGAEMixin",
    "TritonPPOTorchLearner",
    "swap_gae_connector",
    "restore_gae_connector",
]


def _column(module_batch, column, device, dtype=None) -> torch.Tensor:
    x = module_batch[column]
    x = x.to(device) if isinstance(x, torch.Tensor) else torch.as_tensor(x, device=device)
    return x if dtype is None or x.dtype == dtype else x.to(dtype)


class TritonGeneralAdvantageEstimation(GeneralAdvantageEstimation):
    """RLlib's ``GeneralAdvantageEstimation`` learner connector on ``rl_triton_core.gae``.

    Same constructor arguments, inputs and output columns
    (``Postprocessing.ADVANTAGES`` standardised, ``Postprocessing.VALUE_TARGETS``), for
    stateless modules (flat stream) and stateful ones (zero-padded ``[B, max_seq_len]``
    rows, unpadded through the batch's ``seq_lens`` by one boolean index).

    Its ``__name__`` is ``"GeneralAdvantageEstimation"`` on purpose: RLlib's pipelines
    find pieces by class name (``remove("GeneralAdvantageEstimation")``,
    ``insert_before/after``, ``get_state``/``set_state`` keys, the connector timer
    ``general_advantage_estimation``), so code elsewhere treats it as the stock piece.
    Look it up by class with ``isinstance(piece, TritonGeneralAdvantageEstimation)``;
    ``str(piece)`` says ``[rl_triton]``. A swapped-in instance keeps the stock piece it
    replaced as ``__wrapped__``.
    """

    def __init__(self, input_observation_space=None, input_action_space=None, *, gamma,
                 lambda_, synchronize: bool = False):
        super().__init__(input_observation_space, input_action_space, gamma=gamma,
                         lambda_=lambda_)
        self.synchronize = bool(synchronize)

    def __str__(self, indentation: int = 0):
        return " " * indentation + "GeneralAdvantageEstimation [rl_triton]"

    def __call__(self, *, rl_module, episodes, batch: dict[str, Any], **kwargs):
        with torch.no_grad():
            vf_preds = rl_module.foreach_module(
                func=lambda mid, module: (
                    module.compute_values(batch[mid])
                    if mid in batch and isinstance(module, ValueFunctionAPI)
                    else None
                ),
                return_dict=True,
            )
            for module_id, values in vf_preds.items():
                if values is None:
                    continue
                module_batch = batch[module_id]
                if rl_module[module_id].is_stateful():
                    advantages, value_targets = self._padded(module_batch, values)
                else:
                    advantages, value_targets = self._flat(module_batch, values)
                module_batch[Postprocessing.ADVANTAGES] = advantages
                module_batch[Postprocessing.VALUE_TARGETS] = value_targets
                if self.synchronize and values.is_cuda:
                    torch.cuda.synchronize(values.device)
        return batch

    def _flat(self, module_batch, values):
        """One core call over the flat stream; RLlib's flags used as they are."""
        values = values.detach()
        advantages, value_targets = _core.gae(
            _column(module_batch, Columns.REWARDS, values.device, values.dtype),
            values,
            _column(module_batch, Columns.TERMINATEDS, values.device),
            _column(module_batch, Columns.TRUNCATEDS, values.device),
            gamma=self.gamma, lmbda=self.lambda_, time_dim=-1,
            # bootstrap_value=None: V' of the stream's last (phantom) step is 0, RLlib's
            # dummy; only that masked-out step sees it.
        )
        return _standardize(advantages.to(values.dtype)), value_targets.to(values.dtype)

    def _padded(self, module_batch, values):
        """Zero-padded ``[B, T]`` rows (stateful module): gather the valid slots in row
        order (the flat stream RLlib unpads to), compute, scatter back into zeros."""
        if Columns.SEQ_LENS not in module_batch:
            raise ValueError(
                "TritonGeneralAdvantageEstimation: a stateful module's batch must hold "
                f"{Columns.SEQ_LENS!r} (added by AddTimeDimToBatchAndZeroPad) to remove "
                "the zero-padding; got columns " + str(sorted(module_batch.keys()))
            )
        values = values.detach()
        seq_lens = _column(module_batch, Columns.SEQ_LENS, values.device)
        valid = torch.arange(values.shape[1], device=values.device) < seq_lens[:, None]
        flat = {"values": values[valid]}
        for name, column, dtype in (
            ("rewards", Columns.REWARDS, values.dtype),
            ("terminated", Columns.TERMINATEDS, None),
            ("truncated", Columns.TRUNCATEDS, None),
        ):
            flat[name] = _column(module_batch, column, values.device, dtype)[valid]
        advantages, value_targets = _core.gae(
            flat["rewards"], flat["values"], flat["terminated"], flat["truncated"],
            gamma=self.gamma, lmbda=self.lambda_, time_dim=-1,
        )
        padded_adv = values.new_zeros(values.shape)
        padded_adv[valid] = _standardize(advantages.to(values.dtype))
        padded_targets = values.new_zeros(values.shape)
        padded_targets[valid] = value_targets.to(values.dtype)
        return padded_adv, padded_targets


# RLlib looks pipeline pieces up by ``__class__.__name__``; keep ``__qualname__`` (which
# pickle and cloudpickle use to find the class) as it is.
TritonGeneralAdvantageEstimation.__name__ = "GeneralAdvantageEstimation"


def _standardize(advantages: torch.Tensor) -> torch.Tensor:
    """RLlib's ``(A - mean) / max(1e-4, std)`` (population std), on the device."""
    std = advantages.std(correction=0).clamp_min(1e-4)
    return (advantages - advantages.mean()) / std


# ------------------------------------------------------------------ swapping pieces


def swap_gae_connector(pipeline, *, synchronize: bool = False) -> int:
    """Replace every stock ``GeneralAdvantageEstimation`` piece of a learner connector
    pipeline by a :class:`TritonGeneralAdvantageEstimation` in the same place.

    Idempotent (a Triton piece already there only takes the new ``synchronize``
    setting). A subclass of the stock piece with logic of its own is left in place, with
    a warning. Returns the number of pieces swapped; 0 when the pipeline has none
    (e.g. after ``remove("GeneralAdvantageEstimation")``).
    """
    swapped = 0
    for i, piece in enumerate(pipeline.connectors):
        if isinstance(piece, TritonGeneralAdvantageEstimation):
            piece.synchronize = bool(synchronize)
        elif type(piece) is GeneralAdvantageEstimation:
            new = TritonGeneralAdvantageEstimation(
                piece.input_observation_space, piece.input_action_space,
                gamma=piece.gamma, lambda_=piece.lambda_, synchronize=synchronize,
            )
            new.__wrapped__ = piece
            pipeline.connectors[i] = new
            swapped += 1
        elif isinstance(piece, GeneralAdvantageEstimation):
            logger.warning(
                "rl_triton: keeping %s: it subclasses GeneralAdvantageEstimation with "
                "logic of its own, which the Triton piece would drop",
                type(piece).__qualname__,
            )
    return swapped


def restore_gae_connector(pipeline) -> int:
    """Undo :func:`swap_gae_connector`: put the stock pieces back. Returns the count."""
    restored = 0
    for i, piece in enumerate(pipeline.connectors):
        if isinstance(piece, TritonGeneralAdvantageEstimation):
            original = getattr(piece, "__wrapped__", None)
            if original is None:
                original = GeneralAdvantageEstimation(
                    piece.input_observation_space, piece.input_action_space,
                    gamma=piece.gamma, lambda_=piece.lambda_,
                )
            pipeline.connectors[i] = original
            restored += 1
    return restored


class TritonGAEMixin:
    """Learner mixin: after ``build()``, swap the learner connector's stock
    ``GeneralAdvantageEstimation`` piece for :class:`TritonGeneralAdvantageEstimation`.

    Put it first among the bases: ``class MyLearner(TritonGAEMixin, PPOTorchLearner)``.
    Reads :class:`RLTritonOptions` from ``config.learner_config_dict["rl_triton"]``
    (all on when absent), so it behaves the same in local and remote learners.
    """

    def build(self) -> None:
        super().build()
        options = RLTritonOptions.from_config(self.config)
        if not options.gae:
            logger.info("rl_triton: gae=False, keeping RLlib's GeneralAdvantageEstimation")
            return
        pipeline = getattr(self, "_learner_connector", None)
        if pipeline is None:
            logger.info("rl_triton: the learner has no learner connector; nothing to swap")
            return
        if swap_gae_connector(pipeline, synchronize=options.synchronize) == 0 and not any(
            isinstance(p, TritonGeneralAdvantageEstimation) for p in pipeline.connectors
        ):
            logger.info(
                "rl_triton: the learner connector has no GeneralAdvantageEstimation piece "
                "(removed elsewhere, or not part of this algorithm); nothing to swap"
            )


class TritonPPOTorchLearner(TritonGAEMixin, PPOTorchLearner):
    """RLlib's ``PPOTorchLearner`` with GAE on the ``rl_triton_core`` kernels."""
