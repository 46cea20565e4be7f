"""The core's public estimators, as the adapter uses them (``gae`` and ``vtrace``).

The adapter modules call them as ``_core.gae`` / ``_core.vtrace``, looked up at call time.
"""

from __future__ import annotations

from rl_triton_core import gae, vtrace

__all__ = ["gae", "vtrace"]
