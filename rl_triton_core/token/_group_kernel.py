"""Triton kernel of the group outcome advantages (GRPO, Dr. GRPO, RLOO): one launch.

One program holds the whole batch (``B <= MAX_B`` scores). It sorts the keys
``group * 2**16 + index`` (``tl.sort``: a fixed network, so the same order every call),
numbers the groups in sorted order (``r``, from a cumulative sum of the group starts),
and sums each group's float64 scores (and, for GRPO, squared deviations from the mean)
with one segmented ``tl.associative_scan``: the scan's tree is fixed, so the sums, and
the outputs, repeat bit for bit. A group's total sits at its last element; it is
written to a per-group slot of the workspace and read back by every member after a
barrier. The advantage of each score is then written to its own position::

    "grpo"       (s_i - mean_g) / (std_g + eps)      n_g == 1: s_i / (1 + eps)
    "grpo_mean"  s_i - mean_g                        n_g == 1: s_i
    "rloo"       s_i k - mean_g k, k = n_g/(n_g - 1) n_g == 1: s_i

(``rl_triton_core.groups.group_advantages``; the same float64 operations as its PyTorch
path, summed in another order; a half-precision result is rounded from float32.)
Workspace: ``4 * BLOCK`` float64 (the sorted group ids, then the per-group sums, counts
and squared deviations), never read before it is written. No atomics, no host
synchronisation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_triton_core import _tl
from rl_triton_core._host import split

MAX_B = 4096  # scores one program holds (4096: 8 a thread on 16 warps, no spills)
_SHIFT = tl.constexpr(16)  # key = group << _SHIFT | index: indices below 2**16
METHODS = {"grpo": 0, "grpo_mean": 1, "rloo": 2}


@triton.jit
def _seg_add(r1, a1, r2, a2):
    # sums restarted where the group number changes (sorted order: a group is one run)
    return r2, a2 + tl.where(r1 == r2, a1, 0.0)


@triton.jit
def _group_totals(r, x, last, valid, SLOT):
    """Each element's group total of ``x`` (in sorted order; ``r`` the group number):
    a segmented scan, the last element's sum written to slot ``r``, read back."""
    _, tot = tl.associative_scan((r, x), 0, _seg_add)
    tl.store(SLOT + r, tot, mask=last)
    tl.debug_barrier()
    return tl.load(SLOT + r, mask=valid, other=0.0, volatile=True)


@triton.jit
def group_kernel(S, G, OUT, WS, B, s_stride, g_stride, o_stride, eps_hi, eps_lo,
                 METHOD: tl.constexpr, BLOCK: tl.constexpr, OUT64: tl.constexpr):
    i = tl.arange(0, BLOCK)
    valid = i < B
    g = tl.load(G + i.to(tl.int64) * g_stride, mask=valid, other=0).to(tl.int64)
    big = tl.full([BLOCK], 0x7FFFFFFFFFFFFFFF, tl.int64)
    key = tl.where(valid, (g << _SHIFT) | i.to(tl.int64), big)  # padding sorts last
    key = tl.sort(key)
    gs = key >> _SHIFT
    idx = key & 0xFFFF
    # neighbours in sorted order, through the workspace: group starts and ends
    WG = WS.to(tl.pointer_type(tl.int64))
    tl.store(WG + i, gs)
    tl.debug_barrier()
    prev = tl.load(WG + i - 1, mask=valid & (i > 0), other=0, volatile=True)
    nxt = tl.load(WG + i + 1, mask=valid & (i + 1 < B), other=0, volatile=True)
    first = valid & ((i == 0) | (prev != gs))
    last = valid & ((i + 1 == B) | (nxt != gs))
    r = tl.cumsum(first.to(tl.int32), 0) - 1  # the group's number, 0 .. groups - 1
    r = tl.where(valid, r, 0)
    s = tl.load(S + idx * s_stride, mask=valid, other=0.0).to(tl.float64)
    one = tl.where(valid, 1.0, 0.0).to(tl.float64)
    n = _group_totals(r, one, last, valid, WS + 2 * BLOCK)
    tot = _group_totals(r, s, last, valid, WS + BLOCK)
    mean = tot / tl.maximum(n, 1.0)
    single = n <= 1.0
    if METHOD == 1:
        adv = tl.where(single, s, s - mean)
    elif METHOD == 2:
        k = n / tl.maximum(n - 1.0, 1.0)
        adv = tl.where(single, s, s * k - mean * k)
    else:
        eps = _tl.number(eps_hi, eps_lo, True)
        c = s - mean
        sq = _group_totals(r, c * c, last, valid, WS + 3 * BLOCK)
        std = tl.sqrt(sq / tl.maximum(n - 1.0, 1.0))
        adv = tl.where(single, s / (1.0 + eps), c / (std + eps))
    if not OUT64:  # float32 first: a float64 to bfloat16 or float16 conversion goes
        adv = adv.to(tl.float32)  # through it on the GPU (and not at all in the interpreter)
    tl.store(OUT + idx * o_stride, adv.to(OUT.dtype.element_ty), mask=valid)


def block_for(b: int) -> tuple:
    """(BLOCK, warps) for ``b`` scores (``b <= MAX_B``)."""
    block = max(triton.next_power_of_2(b), 32)
    return block, max(1, min(16, block // 256))


def run(method, scores, group, out, eps):
    """Launch the kernel; returns its launch and workspace, ``[(kernel, compiled, grid,
    constexprs, arguments)], [(workspace, False)]`` (what a recorded launch needs)."""
    b = scores.shape[0]
    block, warps = block_for(b)
    ws = torch.empty(4 * block, dtype=torch.float64, device=scores.device)
    hi, lo = split(float(eps))
    kw = dict(S=scores, G=group, OUT=out, WS=ws, B=b, s_stride=scores.stride(0),
              g_stride=group.stride(0), o_stride=out.stride(0), eps_hi=hi, eps_lo=lo)
    consts = dict(METHOD=METHODS[method], BLOCK=block, OUT64=out.dtype == torch.float64)
    grid = (1, 1)
    compiled, args = _tl.launch(group_kernel, grid, kw, consts, warps)
    return [(group_kernel, compiled, grid, consts, args)], [(ws, False)]
