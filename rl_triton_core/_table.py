"""The table of estimators: one frozen row per public estimator.

Everything that plumbs an estimator through the layers below is derived from its row:
the public front door (which arguments are tensors, coefficients or options, which
take gradients), the cached launch's slots, the custom op's schema and the autograd
wiring. Adding an estimator is one row here, one coefficient builder per backend
(``_kernel.py``, ``_cpu.py``), one reference loop and its tests.

This module imports nothing heavy: the CPU path and the Triton path both read it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

# Kernel modes: which coefficient builder runs (``_kernel.py`` / ``_cpu.py``).
MODE_LINREC = 0  # alpha = X, beta = V
MODE_GAE = 1  # A_t = delta_t + gamma lambda (1 - done_t) A_{t+1}; OUT1 = A + V
MODE_TDLAMBDA = 2  # TD(lambda) / discounted returns
MODE_TRACE = 3  # forward trace; run in reverse it is its own adjoint
MODE_VTRACE = 4  # D_t = rho_t delta_t + gamma (1 - done_t) c_t D_{t+1}; OUT1 = pg advantage
MODE_RETRACE = 5  # D_t = delta_t + gamma (1 - done_t) c_{t+1} D_{t+1}
MODE_GAE_BWD = 6  # the adjoint of GAE (a forward scan)
MODE_TD_BWD = 7  # the adjoint of TD(lambda)
MODE_VTRACE_BWD = 8  # the adjoint of V-trace (shifted values)

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
    mode: int
    inputs: tuple
    slots: tuple  # (input name, kernel slot) pairs
    coefs: tuple = ()
    outputs: tuple = ("out",)
    grads: tuple = ()
    reverse: bool | None = True
    backward: str | None = None
    bwd_mode: int | None = None
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


_RETURNS_IN = ("rewards", "values", "terminated", "truncated", "next_values", "bootstrap_value")
_RETURNS_SLOTS = (("rewards", "x"), ("values", "v"), ("terminated", "term"),
                  ("truncated", "trunc"), ("next_values", "nv"), ("bootstrap_value", "boot"))
_VALUE_GRADS = ("rewards", "values", "next_values", "bootstrap_value")

TABLE = {
    e.name: e
    for e in (
        Estimator("gae", "returns", MODE_GAE, _RETURNS_IN, _RETURNS_SLOTS, ("gamma", "lmbda"),
                  ("advantages", "value_targets"), _VALUE_GRADS, backward="gae",
                  bwd_mode=MODE_GAE_BWD,
                  required=("rewards", "terminated")),
        Estimator("gae_advantages", "returns", MODE_GAE, _RETURNS_IN, _RETURNS_SLOTS,
                  ("gamma", "lmbda"), ("advantages",), _VALUE_GRADS, backward="gae",
                  bwd_mode=MODE_GAE_BWD, required=("rewards", "terminated")),
        Estimator("lambda_returns", "returns", MODE_TDLAMBDA, _RETURNS_IN, _RETURNS_SLOTS,
                  ("gamma", "lmbda"), ("returns",), _VALUE_GRADS, backward="td",
                  bwd_mode=MODE_TD_BWD,
                  required=("rewards", "terminated")),
        Estimator("discounted_returns", "returns", MODE_TDLAMBDA,
                  ("rewards", "terminated", "truncated", "next_values", "bootstrap_value"),
                  tuple(p for p in _RETURNS_SLOTS if p[0] != "values"), ("gamma",),
                  ("returns",), ("rewards", "next_values", "bootstrap_value"),
                  backward="td", bwd_mode=MODE_TD_BWD, required=("rewards", "terminated")),
        Estimator("vtrace", "returns", MODE_VTRACE, ("log_rhos",) + _RETURNS_IN,
                  (("log_rhos", "rho"),) + _RETURNS_SLOTS,
                  ("gamma", "lmbda", "rho_bar", "c_bar", "pg_rho_bar"), ("vs", "pg_advantages"),
                  _VALUE_GRADS, backward="vtrace", bwd_mode=MODE_VTRACE_BWD,
                  required=("log_rhos", "rewards", "values", "terminated")),
        Estimator("retrace", "returns", MODE_RETRACE,
                  ("log_rhos", "rewards", "q_values", "expected_next_q", "terminated",
                   "truncated"),
                  (("log_rhos", "rho"), ("rewards", "x"), ("q_values", "v"),
                   ("expected_next_q", "nv"), ("terminated", "term"), ("truncated", "trunc")),
                  ("gamma", "lmbda", "c_bar"), ("q_targets",),
                  required=("log_rhos", "rewards", "q_values", "expected_next_q",
                            "terminated")),
        Estimator("eligibility_traces", "forward", MODE_TRACE, ("x", "done", "init"),
                  (("x", "x"), ("done", "term"), ("init", "init")), ("gamma", "lmbda"),
                  ("traces",), ("x", "init"), reverse=False, backward="trace",
                  bwd_mode=MODE_TRACE,
                  required=("x", "done")),
        Estimator("episodic_cumsum", "forward", MODE_TRACE, ("x", "done", "init"),
                  (("x", "x"), ("done", "term"), ("init", "init")), (), ("sums",),
                  ("x", "init"), reverse=False, backward="trace", bwd_mode=MODE_TRACE,
                  required=("x", "done")),
        Estimator("linear_recurrence", "linrec", MODE_LINREC, ("alpha", "beta", "init"),
                  (("alpha", "x"), ("beta", "v"), ("init", "init")), (), ("h",),
                  ("alpha", "beta", "init"), reverse=None, backward="linrec",
                  required=("alpha", "beta")),
    )
}
