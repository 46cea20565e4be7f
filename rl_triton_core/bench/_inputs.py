"""Inputs the peers build from a case (a harness ``View``), outside the timed call:
shared by ``peers.py`` and ``ext_peers.py`` (which sits below ``peers.py``)."""

from __future__ import annotations

import torch


def _explicit_next_values(d):
    """V'_t as a tensor in the case's layout (TorchRL's API needs one): ``next_values``
    when the case passes them, else the shifted values with the bootstrap at the end.
    Built once per case, outside the timed call."""
    if d.next_values is not None:
        return d.next_values
    v = d.values
    td = d.time_dim % v.dim()
    return torch.cat([v.narrow(td, 1, v.shape[td] - 1), d.bootstrap.unsqueeze(td)], dim=td)
