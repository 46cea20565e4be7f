"""The switches that travel with an RLlib config in ``learner_config_dict["rl_triton"]``.

Kept free of Ray and torch imports: ``enable`` writes the entry on the driver, and every
(local or remote) learner reads it back in ``build()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

LEARNER_CONFIG_KEY = "rl_triton"


@dataclass(frozen=True)
class RLTritonOptions:
    """Which RLlib pieces run on the ``rl_triton_core`` kernels.

    Attributes:
        gae: PPO (and any learner with RLlib's ``GeneralAdvantageEstimation`` piece):
            compute advantages and value targets with ``rl_triton_core.gae``.
        vtrace: IMPALA / APPO: compute V-trace with ``rl_triton_core.vtrace`` instead
            of RLlib's ``vtrace_torch``.
        fix_truncation: IMPALA / APPO only. ``False`` (default) reproduces RLlib's
            numbers exactly, including its convention that cancels the bootstrap value
            at a truncated or cut chunk end when the chunk's extra final step lies in the
            same V-trace row. ``True`` bootstraps there from V(s_{t+1}) as the V-trace
            formula says (see ``docs/rllib.md`` for a worked example).
        synchronize: after the GAE connector, wait for the device (CUDA) so that
            RLlib's connector timer measures the computation and not just its launch.
            For benchmarks; costs one device sync per training batch.
    """

    gae: bool = True
    vtrace: bool = True
    fix_truncation: bool = False
    synchronize: bool = False

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, bool):
                raise TypeError(
                    f"rl_triton option {f.name!r} must be a bool, got "
                    f"{type(value).__name__} ({value!r})"
                )

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any] | None) -> RLTritonOptions:
        entry = dict(entry or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(entry) - known)
        if unknown:
            raise ValueError(
                f"unknown rl_triton option(s) {unknown} in "
                f"learner_config_dict[{LEARNER_CONFIG_KEY!r}]; expected a subset of "
                f"{sorted(known)}"
            )
        return cls(**entry)

    @classmethod
    def from_config(cls, config) -> RLTritonOptions:
        """Read the options from an AlgorithmConfig (defaults when the entry is absent,
        e.g. a Triton learner class set by hand without ``enable``)."""
        learner_config_dict = getattr(config, "learner_config_dict", None) or {}
        return cls.from_dict(learner_config_dict.get(LEARNER_CONFIG_KEY))

    def to_dict(self) -> dict:
        return asdict(self)
