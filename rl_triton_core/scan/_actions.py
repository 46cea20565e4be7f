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
from triton import knobs

from rl_triton_core import _config, _record, _table, _tl
from rl_triton_core._layout import Layout
from rl_triton_core.scan import _claunch, _dispatch, _launch
from rl_triton_core.scan._kernel import _apply, _column, _combine


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


def _views(layout: Layout, raw: tuple):
    """The per-action inputs of ``raw`` (``RAW`` order) as the kernels address them:
    (tensors, strides, has_next, has_boot); next_* or the bootstrap rows absent: None."""
    q_values, target_probs, actions, blp_in, next_q, next_p, boot_q, boot_p = raw[:8]
    A = q_values.shape[-1]
    q, s_q = _strides3(layout, q_values, True)
    p, s_p = _strides3(layout, target_probs, True)
    act, s_act = _strides3(layout, actions, False)
    blp, s_blp = _strides3(layout, blp_in, False)
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
    return ((q, p, act, blp, nq, np_, bq, bp), (s_q, s_p, s_act, s_blp, s_nq, s_np, s_bq, s_bp),
            has_next, has_boot)


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
    (q, p, act, blp, nq, np_, bq, bp), (s_q, s_p, s_act, s_blp, s_nq, s_np, s_bq, s_bp), \
        has_next, has_boot = _views(layout, raw)
    _, *s_out = layout.view3(lr)
    # a tile of BLOCK steps, as long along the contiguous axis as that axis allows
    time_fast = s_out[2] == 1 or T == 1
    fast, slow = (T, N) if time_fast else (N, T)
    inner = max(1, min(BLOCK, triton.next_power_of_2(fast)))
    grid = (triton.cdiv(slow, BLOCK // inner), triton.cdiv(fast, inner))
    if grid[1] > 65535:  # CUDA's limit on grid axis 1 (beyond 8M steps on the fast axis)
        return None
    kw = dict(q_ptr=q, p_ptr=p, act_ptr=act, blp_ptr=blp, nq_ptr=nq, np_ptr=np_, bq_ptr=bq,
              bp_ptr=bp, lr_ptr=lr, qt_ptr=qt, e_ptr=e, N2=layout.N2, T=T, A=A, NROWS=N,
              S_Q=s_q, S_P=s_p, S_ACT=s_act, S_BLP=s_blp, S_NQ=s_nq, S_NP=s_np, S_BQ=s_bq,
              S_BP=s_bp, S_OUT=tuple(s_out))
    consts = dict(HAS_NEXT=has_next, HAS_BOOT=has_boot, TIME_FAST=time_fast, BLOCK=BLOCK,
                  INNER=inner, BLOCK_A=8)
    kernel, args = _tl.launch(actions_kernel, grid, kw, consts, NUM_WARPS)
    if record is not None:
        _record_pieces(record, raw, args, kernel, grid, consts, like_ok, layout.shape)
    return lr, qt, e


_PIECES = tuple(actions_kernel.arg_names.index(n) for n in ("lr_ptr", "qt_ptr", "e_ptr"))
# the per-action kernels' tensor parameters -> the argument of the call (RAW) they take
_TENSOR_OF = {"q_ptr": "q_values", "p_ptr": "target_probs", "act_ptr": "actions",
              "blp_ptr": "behaviour_log_probs", "nq_ptr": "next_q_values",
              "np_ptr": "next_target_probs", "bq_ptr": "bootstrap_q_values",
              "bp_ptr": "bootstrap_target_probs",
              # the fused kernel's
              "Q": "q_values", "PI": "target_probs", "ACT": "actions",
              "BLP": "behaviour_log_probs", "NQ": "next_q_values", "NP": "next_target_probs",
              "BQ": "bootstrap_q_values", "BP": "bootstrap_target_probs", "X": "rewards",
              "TERM": "terminated", "TRUNC": "truncated"}


def _users(jit_fn, args, raw, names, same_strides=False):
    """``[(kernel position, position in raw)]`` of the tensors a launch of ``jit_fn``
    received (``args``, in its parameter order) from the call's arguments (``raw``,
    named by ``names``); None where one is not the caller's own tensor as given (a copy,
    a broadcast bootstrap row made contiguous, a reshape where ``same_strides``)."""
    tensors = []
    for pos, param in enumerate(jit_fn.arg_names[:len(args)]):
        if param not in _TENSOR_OF:
            continue
        idx = names.index(_TENSOR_OF[param])
        given, user = args[pos], raw[idx]
        if (given is None) != (user is None):
            if given is None and param in ("bq_ptr", "bp_ptr", "BQ", "BP"):
                continue  # bootstrap rows unused beside next_*
            return None
        if given is not None:
            if (type(user) is not torch.Tensor or given.data_ptr() != user.data_ptr()
                    or given.shape != user.shape
                    or (same_strides and given.stride() != user.stride())):
                return None
            tensors.append((pos, idx))
    return tensors


def _record_pieces(key, raw, args, kernel, grid, consts, like_ok, shape):
    """Keep a launch whose tensors are all the caller's (none copied) under ``key``: a
    :class:`_record.Recorded` that allocates the three pieces and replays the launch."""
    tensors = _users(actions_kernel, args, raw, RAW)
    if tensors is None:
        return
    piece = _record.Alloc(RAW.index("like") if like_ok else None, shape, torch.float32,
                          raw[0].device)
    _dispatch._store(key, _record.Recorded(
        _tl.Replay(actions_kernel, [(kernel, grid, consts)], len(args), raw[0].device),
        args, tensors=tensors, allocs=(piece,) * 3,
        placed=tuple((pos, k) for k, pos in enumerate(_PIECES)),
        returns=((True, 0), (True, 1), (True, 2))))


def _notime(layout: Layout, t: torch.Tensor):
    """(tensor, (s1, s2, sa)) of bootstrap rows ``[*shape without time, A]``: contiguous
    (a broadcast one is copied; it has no time axis, so it is small)."""
    t = t.contiguous()
    A = t.shape[-1]
    return t, (layout.N2 * A, A, 1)


# ------------------------------------------------------------------ one fused pass
# Where the scan needs no time segments (the plan gives S = 1) and the coefficients are
# numbers, one kernel does both: each step's Q_t, log rho_{t+1} and E_t are built in
# registers from the per-action tensors, as the coefficients of retrace's scan, and
# only the targets are written (no 12 B a step written and read back, one launch).


@triton.jit
def _taken(P, off, a, A, SA, m):
    """P[off + a * SA] where ``m`` and the action lies in [0, A); NaN for an action out
    of range; float32."""
    ok = m & (a >= 0) & (a < A)  # (a masked lane's address stays in its row too)
    x = tl.load(P + off + tl.where(ok, a, 0) * SA, mask=ok, other=float("nan")).to(tl.float32)
    return tl.where(m, x, 0.0)


@triton.jit
def _dot_actions(Q, PI, qoff, poff, SQA, SPA, A, m):
    """sum_a PI[poff + a] Q[qoff + a] where ``m`` (0 elsewhere), one action at a time in
    the caller's layout (the other actions' loads hit the lines the first brought into
    L1; a [.., A] tile, or a view with consecutive steps on consecutive lanes, needed
    layout conversions and measured slower on the H200)."""
    e = tl.zeros(qoff.shape, dtype=tl.float32)
    for a in range(0, A):
        qq = tl.load(Q + qoff + a * SQA, mask=m, other=0.0).to(tl.float32)
        pp = tl.load(PI + poff + a * SPA, mask=m, other=0.0).to(tl.float32)
        e += pp * qq
    return e


@triton.jit(do_not_specialize=["UNIT"])
def fused_kernel(OUT, Q, PI, ACT, BLP, NQ, NP, BQ, BP, X, TERM, TRUNC, g, lm, cb,
                 S_OUT, S_Q, S_P, S_ACT, S_BLP, S_NQ, S_NP, S_BQ, S_BP, S_X, S_TERM, S_TRUNC,
                 N, N2, T, A, UNIT,
                 HAS_NEXT: tl.constexpr, HAS_BOOT: tl.constexpr, SCALAR_N: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, ONE: tl.constexpr):
    """retrace_from_actions in one pass: OUT = Q_t + D_t with

        D_t = r_t + gamma (1 - term_t) E_t - Q_t + gamma (1 - done_t) c_{t+1} D_{t+1},
        c_{t+1} = lambda min(pi(a_{t+1}|s_{t+1}) / mu(a_{t+1}|s_{t+1}), c_bar) (0 at T-1),

    Q_t = Q[t, a_t] and E_t as in the module docstring, scanned from the end as
    ``_kernel.scan_kernel``'s PHASE 0 (the same tiles and association, so the targets
    equal the two-pass path's). Strides: (s1, s2, st[, sa]) of each tensor as
    [N1, N2, T(, A)]; the bootstrap rows' (s1, s2, sa)."""
    n = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    nmask = n < N
    n1 = n // N2
    n2 = n % N2
    if SCALAR_N:  # time-major: one thread per stream (see scan_kernel)
        n1 = tl.max_contiguous(tl.multiple_of(n1 * UNIT, 1), 2)
        n2 = tl.max_contiguous(tl.multiple_of(n2 * UNIT, 1), 2)
    o1 = n1[:, None]
    o2 = n2[:, None]
    nm2 = nmask[:, None]
    cols = tl.arange(0, BLOCK_T)[None, :]
    carry = tl.zeros([BLOCK_N], dtype=tl.float32)
    if HAS_BOOT:  # E_{T-1} of each stream from its bootstrap rows, once: [BLOCK_N, 1]
        e_boot = _dot_actions(BQ, BP, o1 * S_BQ[0] + o2 * S_BQ[1], o1 * S_BP[0] + o2 * S_BP[1],
                              S_BQ[2], S_BP[2], A, nm2)
    if ONE:
        n_chunks = 1
    else:
        n_chunks = tl.cdiv(T, BLOCK_T)
    for kk in range(0, n_chunks):
        t = ((n_chunks - 1 - kk) * BLOCK_T + cols).to(tl.int64)
        m = nm2 & (t < T)
        mn = m & (t + 1 < T)
        # step t + 1's addresses, clamped into the window. Its lanes at t = T - 1 are
        # masked, but triton 3.6 on the H200 still read BLP one element past the end there
        # (compute-sanitizer): an illegal address where the next page was unmapped
        t1 = tl.minimum(t + 1, T - 1)
        x = tl.load(X + o1 * S_X[0] + o2 * S_X[1] + t * S_X[2], mask=m, other=0).to(tl.float32)
        term = tl.load(TERM + o1 * S_TERM[0] + o2 * S_TERM[1] + t * S_TERM[2], mask=m, other=0)
        if term.dtype.is_fp16() or term.dtype.is_bf16():
            term = term.to(tl.float32)
        done = term != 0
        if TRUNC is not None:
            tr = tl.load(TRUNC + o1 * S_TRUNC[0] + o2 * S_TRUNC[1] + t * S_TRUNC[2], mask=m,
                         other=0)
            if tr.dtype.is_fp16() or tr.dtype.is_bf16():
                tr = tr.to(tl.float32)
            done = done | (tr != 0)
        # Q_t, and the ratio of step t + 1 (the trace of step t uses it)
        q_row = o1 * S_Q[0] + o2 * S_Q[1]
        p_row = o1 * S_P[0] + o2 * S_P[1]
        a = tl.load(ACT + o1 * S_ACT[0] + o2 * S_ACT[1] + t * S_ACT[2], mask=m, other=0)
        q = _taken(Q, q_row + t * S_Q[2], a.to(tl.int64), A, S_Q[3], m)
        a1 = tl.load(ACT + o1 * S_ACT[0] + o2 * S_ACT[1] + t1 * S_ACT[2], mask=mn, other=0)
        p1 = _taken(PI, p_row + t1 * S_P[2], a1.to(tl.int64), A, S_P[3], mn)
        blp1 = tl.load(BLP + o1 * S_BLP[0] + o2 * S_BLP[1] + t1 * S_BLP[2], mask=mn,
                       other=0).to(tl.float32)
        ratio = tl.exp(tl.log(tl.where(mn, p1, 1.0)) - blp1)  # (1: no log of 0 past T-1)
        c_next = tl.where(t + 1 < T, lm * tl.minimum(ratio, cb), 0.0)
        # E_t: next_* at t, else rows t + 1 (at T - 1 the bootstrap rows, or 0)
        if HAS_NEXT:
            e = _dot_actions(NQ, NP, o1 * S_NQ[0] + o2 * S_NQ[1] + t * S_NQ[2],
                             o1 * S_NP[0] + o2 * S_NP[1] + t * S_NP[2], S_NQ[3], S_NP[3],
                             A, m)
        else:
            e = _dot_actions(Q, PI, q_row + t1 * S_Q[2], p_row + t1 * S_P[2], S_Q[3],
                             S_P[3], A, mn)
            if HAS_BOOT:
                e = tl.where(t == T - 1, e_boot, e)
        alpha = x + tl.where(term != 0, 0.0, g * e) - q
        beta = tl.where(done, 0.0, g * c_next)
        alpha = tl.where(m, alpha, 0.0)
        beta = tl.where(m, beta, 1.0)
        A_, B_ = tl.associative_scan((alpha, beta), 1, _combine, reverse=True)
        h = _apply(A_, B_, carry[:, None])
        tl.store(OUT + o1 * S_OUT[0] + o2 * S_OUT[1] + t * S_OUT[2],
                 (h + q).to(OUT.dtype.element_ty), mask=m)
        if not ONE:
            carry = _column(h, cols, 0)


# the arguments of a fused call (``fused`` and its record take them in this order)
RAW_FUSED = RAW[:8] + ("rewards", "terminated", "truncated", "gamma", "lmbda", "c_bar")
# the numbers: (the kernel's argument, found by the coefficient slot's name; its place in
# RAW_FUSED; its largest value)
_FUSED_NUMBERS = tuple(
    (fused_kernel.arg_names.index(_table.COEF_OF[name]), RAW_FUSED.index(name), hi)
    for name, hi in (("gamma", 1.0), ("lmbda", 1.0), ("c_bar", float("inf"))))


def _fused_tile(T: int) -> tuple:
    """(BLOCK_N, BLOCK_T, num_warps) of the fused pass on batch-major rows: the whole row
    in one chunk, one row a program from 64 steps (2 and 4 rows of 32 and 16 steps), one
    step a thread for rows of 64-512 steps, two for shorter rows, four at 1024 steps: the
    per-action loads of a warp then span few rows, and many small programs hide their
    latency. Measured on the H200 (A = 6, device time, rfa_tiles.py at 50f9ca7,
    docs/bench/h200-2026-12-03-rfa-tiles.md): 512x128 4.4 -> 3.2 µs, 4096x128 15.4 -> 10.6, 32768x32
    51.9 -> 25.9, 16384x16 18.6 -> 6.9, 16384x512 211 -> 173 against the scan's tiles."""
    tp = max(16, triton.next_power_of_2(max(T, 1)))
    block_n = max(1, 64 // tp)
    if tp <= 32:
        ept = 2
    elif tp <= 512:
        ept = 1
    else:
        ept = 4
    return block_n, tp, max(1, min(16, block_n * tp // (32 * ept)))


def _fused_pays(N, T, block_n, block_t, S, num_warps, time_contiguous, tune) -> bool:
    """Whether the fused pass takes this plan. Never where time is split into segments
    (S > 1) or a tile holds more than 4 steps a thread: whole rows of 2048-4096 steps
    (16 warps, 8 steps a thread) gave wrong targets on the H200 with int64 actions
    (triton 3.6; int32 actions were right), and the two passes were faster there
    (docs/notes.md, "The fused `retrace_from_actions` pass"). Where
    ``Tuning.fused_actions`` is None (the default), only where it measured faster
    than the two passes on the H200: batch-major rows of 16-1024 steps with
    ``_fused_tile``'s tiles (above 1024 steps the two passes won)."""
    if tune.fused_actions is False or S > 1 or triton.cdiv(N, block_n) >= 2**31:
        return False
    if block_n * block_t > 4 * 32 * num_warps:
        return False
    return tune.fused_actions is True or (time_contiguous and 16 <= T <= 1024)


def _targets(layout: Layout, rewards: torch.Tensor):
    """(fresh float32 targets laid out like ``rewards`` where the layout can address
    them, else contiguous; whether they are like ``rewards``)."""
    out = torch.empty_like(rewards, dtype=torch.float32)
    if layout.mergeable(out):
        return out, True
    return torch.empty(layout.shape, dtype=torch.float32, device=rewards.device), False


def fused(layout: Layout, ins: dict, coefs: dict, raw: tuple, record=None):
    """retrace_from_actions' targets in one launch (``fused_kernel``), float32 (None
    where the two-pass path applies: per-step coefficient tensors, or a plan that
    splits time into segments). ``ins``, ``coefs``: retrace's validated slots (x, term,
    trunc; g, lm, cb); ``raw``: the arguments named by ``RAW_FUSED``. ``record``: the
    cache key under which to keep this launch."""
    tune = _config.current_tuning()
    if tune.fused_actions is False or any(coefs[s][1] is not None for s in ("g", "lm", "cb")):
        return None
    q_values, target_probs, actions, blp_in, next_q, next_p, boot_q, boot_p, rewards = raw[:9]
    N, T = layout.N, layout.T
    if N == 0 or T == 0:
        return _targets(layout, rewards)[0]
    x, *s_x = layout.view3(ins["x"])
    term, *s_term = layout.view3(ins["term"])
    trunc, s_trunc = None, (0, 0, 0)
    if ins.get("trunc") is not None:
        trunc, *s_trunc = layout.view3(ins["trunc"])
    time_contiguous = s_x[2] == 1 or T == 1
    block_n, block_t, _, S, num_warps, scalar_n, _ = _launch.plan(
        N, T, time_contiguous, rewards.device, _table.MODE_RETRACE, 4, tune, sub=False)
    if time_contiguous and tune.tile is None and T <= 1024:
        block_n, block_t, num_warps = _fused_tile(T)
    if not _fused_pays(N, T, block_n, block_t, S, num_warps, time_contiguous, tune):
        return None  # decided before the targets are allocated: nothing wasted
    out, like_ok = _targets(layout, rewards)
    _, *s_out = layout.view3(out)
    A = q_values.shape[-1]
    (q, p, act, blp, nq, np_, bq, bp), (s_q, s_p, s_act, s_blp, s_nq, s_np, s_bq, s_bp), \
        has_next, has_boot = _views(layout, raw)
    kw = dict(OUT=out, Q=q, PI=p, ACT=act, BLP=blp, NQ=nq, NP=np_, BQ=bq, BP=bp, X=x,
              TERM=term, TRUNC=trunc, g=coefs["g"][0], lm=coefs["lm"][0], cb=coefs["cb"][0],
              S_OUT=tuple(s_out), S_Q=s_q, S_P=s_p, S_ACT=s_act, S_BLP=s_blp, S_NQ=s_nq,
              S_NP=s_np, S_BQ=s_bq, S_BP=s_bp, S_X=tuple(s_x), S_TERM=tuple(s_term),
              S_TRUNC=tuple(s_trunc), N=N, N2=layout.N2, T=T, A=A, UNIT=1)
    consts = dict(HAS_NEXT=has_next, HAS_BOOT=has_boot, SCALAR_N=scalar_n, BLOCK_N=block_n,
                  BLOCK_T=block_t, ONE=block_t >= T)
    grid = (triton.cdiv(N, block_n), 1)
    kernel, args = _tl.launch(fused_kernel, grid, kw, consts, num_warps)
    if record is not None:
        _record_fused(record, raw, args, kernel, grid, consts, like_ok, layout.shape)
    return out


_FUSED_OUT = fused_kernel.arg_names.index("OUT")


def _record_fused(key, raw, args, kernel, grid, consts, like_ok, shape):
    """Keep a fused launch whose tensors are all the caller's (none copied, none
    reshaped) under ``key``: a :class:`_record.Recorded` that checks the three
    coefficients' ranges, allocates the targets and replays the launch; and, for CUDA
    calls, the same record for the C replay under its key."""
    tensors = _users(fused_kernel, args, raw, RAW_FUSED, same_strides=True)
    if tensors is None:
        return
    for _, idx, _ in _FUSED_NUMBERS:
        if type(raw[idx]) not in (float, int):
            return
    device = raw[0].device
    rec = _record.Recorded(
        _tl.Replay(fused_kernel, [(kernel, grid, consts)], len(args), device), args,
        tensors=tensors, numbers=[(pos, idx) for pos, idx, _ in _FUSED_NUMBERS],
        checks=[(idx, 0.0, hi) for _, idx, hi in _FUSED_NUMBERS],
        allocs=(_record.Alloc(RAW_FUSED.index("rewards") if like_ok else None, shape,
                              torch.float32, device),),
        placed=((_FUSED_OUT, 0),), returns=((True, 0),))
    _dispatch._store(key, rec)
    if device.type == "cuda" and _claunch.enabled():  # for the C replay too
        (_, _, time_dim), tune = key[0], key[1]
        ckey = _claunch.key(knobs.runtime, _dispatch.c_prefix("retrace_from_actions"),
                            raw[:len(RAW_FUSED)], time_dim, tune)
        _dispatch._store(ckey, _claunch.of_recorded(ckey, rec, args, len(RAW_FUSED), tune))
