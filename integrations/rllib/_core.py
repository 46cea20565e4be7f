"""The core's public estimators, as the adapter uses them.

``gae`` is required. ``vtrace`` is looked up lazily: when the installed core does not
provide it yet, the V-trace switch falls back to RLlib's own ``vtrace_torch`` and says
why.
"""

from __future__ import annotations

from rl_triton_core import gae  # noqa: F401  (re-exported for the adapter modules)


def core_vtrace():
    """``(rl_triton_core.vtrace, None)``, or ``(None, reason)`` if the core lacks it."""
    try:
        from rl_triton_core import vtrace
    except ImportError as e:  # the core without V-trace (issue 3 not landed)
        return None, f"rl_triton_core provides no public `vtrace` ({e})"
    return vtrace, None
