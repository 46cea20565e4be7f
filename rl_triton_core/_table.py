"""The table of estimators: the row type, one frozen row per public estimator.

Everything that plumbs an estimator through the layers below is derived from its row:
the public front door (which arguments are tensors, coefficients or options, which
take gradients), the cached launch's slots, the custom op's schema and the autograd
wiring. The rows are declared in ``estimators.py``, each above its public function,
and collected in :data:`TABLE`. Adding an estimator is that row and function, one
coefficient builder per backend (``scan/_kernel.py``, ``scan/_cpu.py``) and one
reference loop (docs/design.md walks through it).

This module imports nothing heavy: the CPU path and the Triton path both read it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

# Kernel modes: which coefficient builder runs, by name (a compile-time constant of the
# Triton kernel and of the numba loop: each backend's chain of builders compares with it)
MODE_LINREC = "linrec"  # alpha = X, beta = V
MODE_GAE = "gae"  # A_t = delta_t + gamma lambda (1 - done_t) A_{t+1}; OUT1 = A + V
MODE_TDLAMBDA = "tdlambda"  # TD(lambda) / discounted returns
MODE_TRACE = "trace"  # forward trace; run in reverse it is its own adjoint
MODE_VTRACE = "vtrace"  # D_t = rho_t delta_t + gamma (1 - done_t) c_t D_{t+1}; OUT1 = pg
MODE_RETRACE = "retrace"  # D_t = delta_t + gamma (1 - done_t) c_{t+1} D_{t+1}
MODE_GAE_BWD = "gae_bwd"  # the adjoint of GAE (a forward scan)
MODE_TD_BWD = "td_bwd"  # the adjoint of TD(lambda)
MODE_VTRACE_BWD = "vtrace_bwd"  # the adjoint of V-trace (shifted values)

# The kernel's input slots. Data slots are addressed as [N1, N2, T]; BOOT and INIT have
# no time axis ([N1, N2]). A public argument maps to one slot (see Estimator.slots).
DATA_SLOTS = ("x", "v", "nv", "term", "trunc", "rho")
NOTIME_SLOTS = ("boot", "init")
# coefficient slots: a Python number (a scalar kernel argument) or a per-step tensor
COEF_SLOTS = ("g", "lm", "rb", "cb", "pb")
# the order of the scan kernel's per-slot strides (its STR argument where the slots'
# strides differ): the output and the per-step slots, 3 strides each, then the no-time
# slots, 2 each
STRIDE_SLOTS = ("out",) + DATA_SLOTS + COEF_SLOTS + NOTIME_SLOTS
COEF_OF = {"gamma": "g", "lmbda": "lm", "rho_bar": "rb", "c_bar": "cb", "pg_rho_bar": "pb"}
# the valid range of each coefficient given as a number ([lo, hi], hi None: unbounded)
COEF_RANGE = {"g": (0.0, 1.0), "lm": (0.0, 1.0), "rb": (0.0, None), "cb": (0.0, None),
              "pb": (0.0, None)}


@dataclass(frozen=True)
class Estimator:
    """One public estimator.

    ``inputs``: its tensor arguments in signature order, mapped by ``slots`` to the
    kernel's slots; ``coefs``: its coefficient arguments (numbers or tensors);
    ``outputs``: what it returns; ``grads``: the inputs that take gradients;
    ``checks``: which validation applies (``_call.CHECKS``: ``returns``: rewards-shaped
    data with step-aligned flags; ``forward``: ``x`` with ``done`` and ``init``;
    ``linrec``: the primitive); ``backward``: its backward pass (``_autograd.BACKWARDS``:
    ``gae``, ``td``, ``vtrace``, ``trace``, ``linrec``; None: not differentiable);
    ``reverse``: the scan's direction (None: a ``reverse`` argument).
    ``bwd_mode``: the kernel mode of its fused backward pass (None: torch ops and the
    primitive's scan).
    """

    name: str
    checks: str
    mode: str
    inputs: tuple
    slots: tuple  # (input name, kernel slot) pairs
    coefs: tuple = ()
    outputs: tuple = ("out",)
    grads: tuple = ()
    reverse: bool | None = True
    backward: str | None = None
    bwd_mode: str | None = None
    required: tuple = ()  # inputs that must be tensors (the rest may be None)

    @property
    def n_out(self) -> int:
        return len(self.outputs)

    @property
    def args(self) -> tuple:
        """The op's arguments in order: tensors, coefficients, options."""
        return self.inputs + self.coefs + (("reverse",) if self.reverse is None else ())

    @functools.cached_property
    def grad_pos(self) -> tuple:
        """Positions in ``args`` of the inputs that take gradients."""
        return tuple(self.args.index(n) for n in self.grads)


# name -> row, in the order the rows are declared: filled by ``estimators.py``, where each
# row sits above its public function (``estimators._row``); every layer below reads rows
# from here, or is handed its row, at call time
TABLE: dict = {}
