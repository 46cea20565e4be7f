"""Retrace's per-step inputs from per-action tensors in one Triton pass.

For :func:`rl_triton_core.retrace_from_actions` on the Triton backend: one kernel reads
Q(s_t, .) and pi(.|s_t) ``[..., T, A]`` once and writes, per step,

    Q_t     = q[t, a_t]
    log rho = log pi[t, a_t] - log mu(a_t|s_t)
    E_t     = sum_a pi'[t, a] q'[t, a]

where (q', pi') is (next_q_values, next_target_probs) where given, else row t+1 of
(q_values, target_probs) and the bootstrap rows at the window's end (each step's own
expectation stored one step earlier). The scan then runs on these three (as
:func:`rl_triton_core.retrace`). Torch ops did the same in about ten launches and
passes over memory.

Every per-step tensor is addressed as [N1, N2, T] (``_layout``), a per-action one with
its action stride on top. A program takes a tile of BLOCK steps, as long as it can be
along the contiguous axis (time in batch-major data, streams in time-major data), so
its loads are coalesced either way and short sequences still fill it.
An action outside [0, A) gives NaN for that step's Q_t and log rho (no host check,
no device assert). Computed in float32 (float64 data takes the torch ops: this
kernel's log is float32-accurate).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rl_triton_core import _dispatch, _launch
from rl_triton_core._layout import Layout


@triton.jit
def actions_kernel(q_ptr, p_ptr, act_ptr, blp_ptr, nq_ptr, np_ptr, bq_ptr, bp_ptr,
                   lr_ptr, qt_ptr, e_ptr, N2, T, A, NROWS,
                   S_Q, S_P, S_ACT, S_BLP, S_NQ, S_NP, S_BQ, S_BP, S_OUT,
                   HAS_NEXT: tl.constexpr, HAS_BOOT: tl.constexpr, TIME_FAST: tl.constexpr,
                   BLOCK: tl.constexpr, INNER: tl.constexpr, BLOCK_A: tl.constexpr):
    # S_*: (s1, s2, st[, sa]) of each tensor as [N1, N2, T(, A)]; boot: (s1, s2, sa).
    # A tile of BLOCK steps: INNER along the contiguous axis (time or streams) times
    # BLOCK // INNER along the other; grid axis 1 walks the contiguous axis
    lane = tl.arange(0, BLOCK)
    fast = (tl.program_id(1) * INNER + lane % INNER).to(tl.int64)
    slow = (tl.program_id(0) * (BLOCK // INNER) + lane // INNER).to(tl.int64)
    if TIME_FAST:
        t, row = fast, slow
        t_pid, t_programs = tl.program_id(1), tl.num_programs(1)
    else:
        t, row = slow, fast
        t_pid, t_programs = tl.program_id(0), tl.num_programs(0)
    ok = (t < T) & (row < NROWS)
    n1 = row // N2
    n2 = row - n1 * N2

    a = tl.load(act_ptr + n1 * S_ACT[0] + n2 * S_ACT[1] + t * S_ACT[2], mask=ok, other=0)
    a = a.to(tl.int64)
    taken = ok & (a >= 0) & (a < A)
    q_off = n1 * S_Q[0] + n2 * S_Q[1] + t * S_Q[2]
    p_off = n1 * S_P[0] + n2 * S_P[1] + t * S_P[2]
    q_t = tl.load(q_ptr + q_off + a * S_Q[3], mask=taken, other=float("nan")).to(tl.float32)
    p_t = tl.load(p_ptr + p_off + a * S_P[3], mask=taken, other=float("nan")).to(tl.float32)
    blp = tl.load(blp_ptr + n1 * S_BLP[0] + n2 * S_BLP[1] + t * S_BLP[2], mask=ok,
                  other=0.0).to(tl.float32)
    o_off = n1 * S_OUT[0] + n2 * S_OUT[1] + t * S_OUT[2]
    tl.store(qt_ptr + o_off, q_t, mask=ok)
    tl.store(lr_ptr + o_off, tl.log(p_t) - blp, mask=ok)

    # the expectation over actions, BLOCK_A actions at a time
    if HAS_NEXT:
        eq_off = n1 * S_NQ[0] + n2 * S_NQ[1] + t * S_NQ[2]
        ep_off = n1 * S_NP[0] + n2 * S_NP[1] + t * S_NP[2]
    else:
        eq_off = q_off
        ep_off = p_off
    e = tl.zeros([BLOCK], dtype=tl.float32)
    for a0 in range(0, A, BLOCK_A):
        ai = (a0 + tl.arange(0, BLOCK_A)).to(tl.int64)
        m = ok[:, None] & (ai < A)[None, :]
        if HAS_NEXT:
            qq = tl.load(nq_ptr + eq_off[:, None] + ai[None, :] * S_NQ[3], mask=m, other=0.0)
            pp = tl.load(np_ptr + ep_off[:, None] + ai[None, :] * S_NP[3], mask=m, other=0.0)
        else:
            qq = tl.load(q_ptr + eq_off[:, None] + ai[None, :] * S_Q[3], mask=m, other=0.0)
            pp = tl.load(p_ptr + ep_off[:, None] + ai[None, :] * S_P[3], mask=m, other=0.0)
        e += tl.sum(pp.to(tl.float32) * qq.to(tl.float32), axis=1)
    if HAS_NEXT:
        tl.store(e_ptr + o_off, e, mask=ok)
    else:  # E_{t-1} is this step's own expectation; E_{T-1} the bootstrap rows'
        tl.store(e_ptr + o_off - S_OUT[2], e, mask=ok & (t > 0))
        if t_pid == t_programs - 1:  # the tiles that hold the window's last step
            last = ok & (t == T - 1)
            bq_off = n1 * S_BQ[0] + n2 * S_BQ[1]
            bp_off = n1 * S_BP[0] + n2 * S_BP[1]
            e_boot = tl.zeros([BLOCK], dtype=tl.float32)  # no bootstrap rows: 0
            if HAS_BOOT:
                for a0 in range(0, A, BLOCK_A):
                    ai = (a0 + tl.arange(0, BLOCK_A)).to(tl.int64)
                    mb = last[:, None] & (ai < A)[None, :]
                    bq = tl.load(bq_ptr + bq_off[:, None] + ai[None, :] * S_BQ[2], mask=mb,
                                 other=0.0)
                    bp = tl.load(bp_ptr + bp_off[:, None] + ai[None, :] * S_BP[2], mask=mb,
                                 other=0.0)
                    e_boot += tl.sum(bp.to(tl.float32) * bq.to(tl.float32), axis=1)
            tl.store(e_ptr + o_off, e_boot, mask=last)


BLOCK = 128  # steps per program
NUM_WARPS = 4


def _strides3(layout: Layout, t: torch.Tensor, action_axis: bool):
    """(tensor, (s1, s2, st[, sa])): ``t`` addressed as [N1, N2, T(, A)] (a contiguous
    copy where its axes cannot be merged so)."""
    step = t.select(-1, 0) if action_axis else t
    if not layout.mergeable(step):
        t = t.contiguous()
        step = t.select(-1, 0) if action_axis else t
    _, s1, s2, st = layout.view3(step)
    return t, (s1, s2, st, t.stride(-1)) if action_axis else (s1, s2, st)


# the arguments of a call, as pieces() and its recorded plan take them
RAW = ("q_values", "target_probs", "actions", "behaviour_log_probs", "next_q_values",
       "next_target_probs", "bootstrap_q_values", "bootstrap_target_probs", "like")


def pieces(layout: Layout, raw: tuple, record=None):
    """(log_rhos, q_taken, expected_next_q), float32, shaped and strided as ``like``
    (the rewards, when they are dense) -- see the module docstring; None where the
    grid would exceed CUDA's limits (the torch ops then). ``raw``: the tensors named by
    ``RAW``; a bootstrap pair of None means rows of 0 (they are used without ``next_*``;
    given, they broadcast to ``[*shape without time, A]``). ``record``: the cache key
    under which to keep this launch (``_dispatch.cached`` replays it)."""
    q_values, target_probs, actions, blp_in, next_q, next_p, boot_q, boot_p, like = raw
    A = q_values.shape[-1]
    lr = torch.empty_like(like, dtype=torch.float32)
    like_ok = layout.mergeable(lr)
    if not like_ok:
        lr = torch.empty(layout.shape, dtype=torch.float32, device=like.device)
    qt, e = torch.empty_like(lr), torch.empty_like(lr)
    N, T = layout.N, layout.T
    if N == 0 or T == 0:
        return lr, qt, e
    q, s_q = _strides3(layout, q_values, True)
    p, s_p = _strides3(layout, target_probs, True)
    act, s_act = _strides3(layout, actions, False)
    blp, s_blp = _strides3(layout, blp_in, False)
    _, *s_out = layout.view3(lr)
    has_next = next_q is not None
    has_boot = not has_next and boot_q is not None
    nq = np_ = bq = bp = None
    s_nq = s_np = (0, 0, 0, 0)
    s_bq = s_bp = (0, 0, 0)
    if has_next:
        nq, s_nq = _strides3(layout, next_q, True)
        np_, s_np = _strides3(layout, next_p, True)
    elif has_boot:
        notime = layout.lead + layout.trail + (A,)
        (bq, s_bq), (bp, s_bp) = (_notime(layout, b.expand(notime)) for b in (boot_q, boot_p))
    # a tile of BLOCK steps, as long along the contiguous axis as that axis allows
    time_fast = s_out[2] == 1 or T == 1
    fast, slow = (T, N) if time_fast else (N, T)
    inner = max(1, min(BLOCK, triton.next_power_of_2(fast)))
    grid = (triton.cdiv(slow, BLOCK // inner), triton.cdiv(fast, inner))
    if grid[1] > 65535:  # CUDA's limit on grid axis 1 (beyond 8M steps on the fast axis)
        return None
    args = [q, p, act, blp, nq, np_, bq, bp, lr, qt, e, layout.N2, T, A, N, s_q, s_p, s_act,
            s_blp, s_nq, s_np, s_bq, s_bp, tuple(s_out)]
    consts = dict(HAS_NEXT=has_next, HAS_BOOT=has_boot, TIME_FAST=time_fast, BLOCK=BLOCK,
                  INNER=inner, BLOCK_A=8)
    kernel = actions_kernel[grid](*args, **consts, num_warps=NUM_WARPS)
    if record is not None:
        _record(record, raw, args, kernel, grid, consts, like_ok, layout.shape)
    return lr, qt, e


class _Plan:
    """A recorded pass: a repeated call with the same key (shapes, strides, dtypes,
    devices) allocates the pieces and replays the launch, without checks or layout
    work (None: this Triton's launcher takes other arguments, ``broken``)."""

    __slots__ = ("template", "tensor_pos", "kernels", "like", "shape", "device", "broken")

    def __call__(self, raw):
        if self.like:
            lr = torch.empty_like(raw[8], dtype=torch.float32)
        else:
            lr = torch.empty(self.shape, dtype=torch.float32, device=self.device)
        qt, e = torch.empty_like(lr), torch.empty_like(lr)
        args = list(self.template)
        args[8], args[9], args[10] = lr, qt, e
        for pos, idx in self.tensor_pos:
            args[pos] = raw[idx]
        if not _launch.replay(actions_kernel, self.kernels, args, self.device):
            self.broken = True
            return None
        return lr, qt, e


def _record(key, raw, args, kernel, grid, consts, like_ok, shape):
    """Keep a launch whose tensors are all the caller's (none copied) under ``key``."""
    p = _Plan()
    p.broken = False
    p.tensor_pos = []
    for i in range(8):  # the kernel's first eight arguments are raw's first eight
        given, user = args[i], raw[i]
        if (given is None) != (user is None):
            if given is None and i in (6, 7):  # bootstrap rows unused beside next_*
                continue
            return
        if given is not None:
            if given.data_ptr() != user.data_ptr() or given.shape != user.shape:
                return  # a copy (or a broadcast bootstrap row made contiguous)
            p.tensor_pos.append((i, i))
    template = list(args)
    for pos, _ in p.tensor_pos:
        template[pos] = None
    template[8] = template[9] = template[10] = None
    p.template = tuple(template)
    names = actions_kernel.arg_names[len(args):]
    p.kernels = [(kernel, grid, [consts[n] for n in names])]
    p.like, p.shape, p.device = like_ok, shape, raw[0].device
    _dispatch._store(key, p)


def _notime(layout: Layout, t: torch.Tensor):
    """(tensor, (s1, s2, sa)) of bootstrap rows ``[*shape without time, A]``: contiguous
    (a broadcast one is copied; it has no time axis, so it is small)."""
    t = t.contiguous()
    A = t.shape[-1]
    return t, (layout.N2 * A, A, 1)
