"""Token-level test cases shared by the verl, OpenRLHF and TRL adapter tests.

``token_batch`` builds right-padded ``[B, T]`` rewards, values and a response mask whose
rows cover what the frameworks produce: a full row, right padding, left padding,
multi-turn responses (observation spans of zeros in the middle), a row with no valid
token, a length-1 response, and random rows. Rewards and values are random everywhere
(never zeros), masked positions included, so a masked value that leaks shows.
"""

from __future__ import annotations

import torch

F64 = torch.float64


def row_masks(T: int, gen: torch.Generator, n_random: int = 4) -> torch.Tensor:
    """[R, T] 0/1 float64 masks, one per pattern (T >= 6)."""
    rows = []
    full = torch.ones(T)
    rows.append(full)
    right = torch.zeros(T)
    right[: T // 2] = 1  # right padding
    rows.append(right)
    left = torch.zeros(T)
    left[T // 3:] = 1  # left padding
    rows.append(left)
    turns = torch.ones(T)
    turns[2:4] = 0  # an observation span in the middle
    turns[-1] = 0  # and padding at the end
    rows.append(turns)
    turns2 = torch.zeros(T)
    turns2[1:3] = 1
    turns2[4:5] = 1  # two short turns, padding around
    rows.append(turns2)
    rows.append(torch.zeros(T))  # all masked
    one = torch.zeros(T)
    one[0] = 1  # a length-1 response
    rows.append(one)
    one_end = torch.zeros(T)
    one_end[-1] = 1
    rows.append(one_end)
    for _ in range(n_random):
        rows.append((torch.rand(T, generator=gen) > 0.35).to(F64))
    return torch.stack(rows).to(F64)


def token_batch(seed: int, T: int = 9, n_random: int = 4, dtype=F64):
    """``(rewards, values, mask)``: float ``[B, T]`` data of ``dtype``, float64 0/1 mask."""
    gen = torch.Generator().manual_seed(seed)
    mask = row_masks(T, gen, n_random)
    perm = torch.randperm(mask.shape[0], generator=gen)
    mask = mask[perm]
    B = mask.shape[0]
    rewards = torch.randn(B, T, generator=gen, dtype=F64) * 0.5 + 0.1
    values = torch.randn(B, T, generator=gen, dtype=F64)
    return rewards.to(dtype), values.to(dtype), mask


def as_mask(mask: torch.Tensor, kind: str) -> torch.Tensor:
    """The 0/1 mask as the framework holds it: bool, int64, float32 or float64."""
    return {"bool": mask.bool(), "int64": mask.long(), "float32": mask.float(),
            "float64": mask.to(F64)}[kind]


def lengths_trimmed(mask: torch.Tensor) -> list:
    """Each row's length without its trailing masked tokens (at least 1)."""
    out = []
    for row in mask:
        idx = torch.nonzero(row).flatten()
        out.append(max(int(idx[-1]) + 1 if idx.numel() else 1, 1))
    return out


def pack(lengths: list, *rows: torch.Tensor):
    """Each ``[B, T]`` tensor's rows cut to ``lengths`` and put back to back (1-D), and
    ``cu_seqlens`` (int32 ``[B + 1]``), as flash-attention packs sequences."""
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    flat = [torch.cat([r[i, :n] for i, n in enumerate(lengths)]) for r in rows]
    return (*flat, cu)


def unpack_like(flat: torch.Tensor, lengths: list, like: torch.Tensor) -> torch.Tensor:
    """The packed values back in ``like``'s ``[B, T]`` layout (NaN past each length)."""
    out = torch.full(like.shape, float("nan"), dtype=flat.dtype)
    start = 0
    for i, n in enumerate(lengths):
        out[i, :n] = flat[start:start + n]
        start += n
    return out
