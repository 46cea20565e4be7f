"""What the estimators are compared with: the floor kernel and the peer implementations.

* ``floor``         -- a Triton elementwise kernel that reads every input the estimator
  reads (same tensors, dtypes and layouts) once and writes as many outputs of the same
  dtype: the memory + launch limit. One launch, ``out = sum of the loaded inputs``.
* ``loop``          -- a CleanRL-style Python loop over time on the device (GAE, TD(lambda)).
* ``torchrl``       -- TorchRL 0.14's functional ``generalized_advantage_estimate`` /
  ``td_lambda_return_estimate`` (their default Python loop over time).
* ``torchrl_vec``   -- TorchRL's ``vec_generalized_advantage_estimate`` /
  ``vec_td_lambda_return_estimate`` (the ``vectorized=True`` path).
* ``compiled_scan`` -- GAE as a log-depth (Hillis-Steele) scan of (alpha, beta) pairs in
  torch ops, ``torch.compile``d, one compiled object per shape.
* ``rl_triton``     -- rl-triton 0.1.3 (github.com/simonsays1980/rl-triton), the Triton
  project this one grew from: its compute_gae, compute_lambda_returns,
  compute_discounted_returns, compute_vtrace, compute_retrace (per-action tensors:
  our retrace_from_actions), compute_eligibility_traces, compute_episodic_prefix_sum.
* ``pufferlib``     -- PufferLib 3.0's advantage kernel (GAE; one CUDA thread per row,
  sequential over time), vendored in rl-triton's ``benchmarks/pufferlib_ext`` and
  JIT-built once (not timed).

The last two are imported from a checkout of rl-triton named by ``--rl-triton-src
PATH`` or ``$RL_TRITON_SRC`` (never copied into this project) and are "n/a" without
one; ``ext_peers.py`` says how each case is mapped onto their conventions.

A peer is made by ``make_peer(name, estimator, d, opts)`` which returns
``(fn, graphable, info)`` (``info``: extra fields for the record, e.g. ``compile_s``) or
raises :class:`Skip` with the reason (recorded as "n/a: reason").
"""

from __future__ import annotations

import time

import torch

from rl_triton_core.bench import ext_peers
from rl_triton_core.bench._inputs import _explicit_next_values
from rl_triton_core.bench.ext_peers import Skip

__all__ = ["Skip", "PEERS", "APPLIES", "make_floor", "make_peer", "floor_config"]

PEERS = ("loop", "torchrl", "torchrl_vec", "compiled_scan", "rl_triton", "pufferlib")
# which estimators each peer implements (rl_triton's "retrace" row says why it is n/a)
APPLIES = {"loop": ("gae", "lambda_returns"), "torchrl": ("gae", "lambda_returns"),
           "torchrl_vec": ("gae", "lambda_returns"), "compiled_scan": ("gae",),
           **ext_peers.APPLIES}

LOOP_MAX_T = 4096  # Python loops over time: skipped beyond this (unless --all-peers)
VEC_MAX_NUMEL = 1 << 24  # TorchRL's vectorised GAE pads every trajectory to the longest


# --------------------------------------------------------------------------- the floor

_floor_kernel = None


def _kernel():
    """The floor kernel, defined on first use (importing this module needs no triton)."""
    global _floor_kernel
    if _floor_kernel is not None:
        return _floor_kernel
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["NS0", "NS1"])
    def floor_kernel(X0, X1, X2, X3, X4, X5, W0, W1, S0, S1, O0, O1, numel, NS0, NS1,
                     NX: tl.constexpr, NW: tl.constexpr, A: tl.constexpr, A_P2: tl.constexpr,
                     NSI: tl.constexpr, TWO_OUT: tl.constexpr, I64: tl.constexpr,
                     BLOCK: tl.constexpr):
        # out[i] = sum of the NX per-step inputs at i, + the sum over the A entries of
        # row i of the NW per-action inputs ([numel, A]), + the per-stream inputs (read
        # once: their NS elements are added to the first NS outputs, no division)
        pid = tl.program_id(0)
        if I64:
            o_x = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        else:
            o_x = pid * BLOCK + tl.arange(0, BLOCK)
        m = o_x < numel
        b_acc = tl.load(X0 + o_x, mask=m, other=0).to(tl.float32)
        if NX > 1:
            b_acc += tl.load(X1 + o_x, mask=m, other=0).to(tl.float32)
        if NX > 2:
            b_acc += tl.load(X2 + o_x, mask=m, other=0).to(tl.float32)
        if NX > 3:
            b_acc += tl.load(X3 + o_x, mask=m, other=0).to(tl.float32)
        if NX > 4:
            b_acc += tl.load(X4 + o_x, mask=m, other=0).to(tl.float32)
        if NX > 5:
            b_acc += tl.load(X5 + o_x, mask=m, other=0).to(tl.float32)
        if NW > 0:
            o_a = tl.arange(0, A_P2)
            o_w = o_x[:, None] * A + o_a[None, :]
            m_w = m[:, None] & (o_a[None, :] < A)
            b_acc += tl.sum(tl.load(W0 + o_w, mask=m_w, other=0).to(tl.float32), axis=1)
            if NW > 1:
                b_acc += tl.sum(tl.load(W1 + o_w, mask=m_w, other=0).to(tl.float32), axis=1)
        if NSI > 0:
            b_acc += tl.load(S0 + o_x, mask=o_x < NS0, other=0).to(tl.float32)
        if NSI > 1:
            b_acc += tl.load(S1 + o_x, mask=o_x < NS1, other=0).to(tl.float32)
        tl.store(O0 + o_x, b_acc.to(O0.dtype.element_ty), mask=m)
        if TWO_OUT:
            tl.store(O1 + o_x, b_acc.to(O1.dtype.element_ty), mask=m)

    _floor_kernel = floor_kernel
    return floor_kernel


def floor_config(numel: int, width: int = 0) -> tuple[int, int]:
    """(BLOCK, num_warps): small blocks keep small problems spread over the SMs, big
    blocks give each thread 16 elements in flight for the large ones; with per-action
    inputs of (power-of-2 padded) width W a block holds about 4096 of their elements."""
    if width:
        return max(16, 4096 // width), 8
    return (1024, 4) if numel < (1 << 21) else (4096, 8)


def make_floor(narrow, wide, per_stream, n_out: int, out_shape, out_dtype, *, block=None,
               num_warps=None):
    """A closure launching the floor kernel once, allocating ``n_out`` outputs of
    ``out_shape`` like the estimator.

    ``narrow``: 1..6 tensors with the data's numel (one value per step); ``wide``: 0..2
    tensors of numel x A (one row of A per step, e.g. per-action Q values);
    ``per_stream``: 0..2 tensors read once each (bootstrap values). All contiguous in
    their own layout: the floor reads each byte once, in order.
    """
    narrow, wide, per_stream = list(narrow), list(wide), list(per_stream)
    if not 1 <= len(narrow) <= 6 or len(wide) > 2 or len(per_stream) > 2:
        raise Skip(f"the floor takes 1..6 per-step, 0..2 per-action and 0..2 per-stream "
                   f"inputs, got {len(narrow)}, {len(wide)}, {len(per_stream)}")
    numel = narrow[0].numel()
    for t in narrow + wide + per_stream:
        if not t.is_contiguous():
            raise Skip("the floor needs inputs contiguous in their own layout")
    if any(t.numel() != numel for t in narrow):
        raise Skip("the floor's per-step inputs must have one numel")
    A = 0
    if wide:
        A = wide[0].numel() // max(numel, 1)
        if any(t.numel() != numel * A for t in wide):
            raise Skip("the floor's per-action inputs must have one width")
    width = 1 << max(A - 1, 0).bit_length() if A else 0
    kernel = _kernel()
    cfg_block, cfg_warps = floor_config(numel, width)
    block = block or cfg_block
    num_warps = num_warps or cfg_warps
    grid = ((numel + block - 1) // block,)
    if any(t.numel() > grid[0] * block for t in per_stream):
        raise Skip("a per-stream input is larger than the data")
    xs = narrow + [narrow[0]] * (6 - len(narrow))
    ws = wide + [narrow[0]] * (2 - len(wide))
    ss = per_stream + [narrow[0]] * (2 - len(per_stream))
    ns = [t.numel() for t in per_stream] + [0] * (2 - len(per_stream))
    device = narrow[0].device
    out_shape = tuple(out_shape)
    consts = dict(NX=len(narrow), NW=len(wide), A=max(A, 1), A_P2=max(width, 1),
                  NSI=len(per_stream), TWO_OUT=n_out == 2,
                  I64=max(numel, 1) * max(A, 1) >= 2**31 - 4 * block * max(width, 1),
                  BLOCK=block, num_warps=num_warps)
    args = (*xs, *ws, *ss)

    if n_out == 2:
        def fn():
            o0 = torch.empty(out_shape, dtype=out_dtype, device=device)
            o1 = torch.empty(out_shape, dtype=out_dtype, device=device)
            kernel[grid](*args, o0, o1, numel, ns[0], ns[1], **consts)
            return o0, o1
    else:
        def fn():
            o0 = torch.empty(out_shape, dtype=out_dtype, device=device)
            kernel[grid](*args, o0, o0, numel, ns[0], ns[1], **consts)
            return o0
    return fn


# ------------------------------------------------------------ CleanRL-style Python loops


def loop_gae(r, v, term, trunc, boot, nv, gamma, lmbda, td):
    """GAE as in CleanRL's ppo.py: one step at a time, backwards, on the device
    (with this project's step-aligned flags: ``terminated`` cuts the bootstrap,
    ``done`` the trace)."""
    T = r.shape[td]
    nonterm = 1.0 - term.to(r.dtype)
    nondone = nonterm if trunc is None else 1.0 - (term | trunc).to(r.dtype)
    adv = torch.empty_like(r)
    lastgaelam = 0.0
    for t in reversed(range(T)):
        if nv is not None:
            nextvalues = nv.select(td, t)
        elif t == T - 1:
            nextvalues = boot
        else:
            nextvalues = v.select(td, t + 1)
        delta = r.select(td, t) + gamma * nextvalues * nonterm.select(td, t) - v.select(td, t)
        lastgaelam = delta + gamma * lmbda * nondone.select(td, t) * lastgaelam
        adv.select(td, t).copy_(lastgaelam)
    return adv, adv + v


def loop_lambda_returns(r, v, term, trunc, boot, nv, gamma, lmbda, td):
    """TD(lambda) returns, one step at a time backwards:
    G_t = r_t + gamma (1 - term_t) [V'_t + lmbda (1 - done_t) (G_{t+1} - V'_t)]."""
    T = r.shape[td]
    nonterm = 1.0 - term.to(r.dtype)
    nondone = nonterm if trunc is None else 1.0 - (term | trunc).to(r.dtype)
    ret = torch.empty_like(r)
    g = None
    for t in reversed(range(T)):
        if nv is not None:
            nextvalues = nv.select(td, t)
        elif t == T - 1:
            nextvalues = boot
        else:
            nextvalues = v.select(td, t + 1)
        if g is None:
            g = r.select(td, t) + gamma * nonterm.select(td, t) * nextvalues
        else:
            g = r.select(td, t) + gamma * nonterm.select(td, t) * (
                nextvalues + lmbda * nondone.select(td, t) * (g - nextvalues))
        ret.select(td, t).copy_(g)
    return ret


_LOOPS = {"gae": loop_gae, "lambda_returns": loop_lambda_returns}


# -------------------------------------------------------------- the compiled log-depth scan


def hillis_steele_reverse(a, b):
    """h_t = a_t + b_t h_{t+1}, h_T = 0, along the last axis in ceil(log2 T) doubling
    steps: after the step with distance d, (a_t, b_t) maps h_{t+2d} to h_t."""
    T = a.shape[-1]
    d = 1
    while d < T:
        a_far = torch.nn.functional.pad(a[..., d:], (0, d))  # h beyond the end is 0
        a = a + b * a_far
        if 2 * d < T:
            b = b * torch.nn.functional.pad(b[..., d:], (0, d), value=1.0)
        d *= 2
    return a


def scan_gae(r, v, term, trunc, boot, nv, gamma: float, lmbda: float, time_major: bool):
    """GAE from the raw inputs: alpha/beta built in torch ops, then the log-depth scan."""
    if time_major:  # views with time last; the compiler sees the strides
        r, v, term = r.t(), v.t(), term.t()
        trunc = None if trunc is None else trunc.t()
        nv = None if nv is None else nv.t()
    if nv is None:
        nv = torch.cat([v[:, 1:], boot[:, None]], dim=1)
    done = term if trunc is None else term | trunc
    alpha = r + gamma * (~term).to(r.dtype) * nv - v
    beta = (gamma * lmbda) * (~done).to(r.dtype)
    adv = hillis_steele_reverse(alpha, beta)
    target = adv + v
    if time_major:
        return adv.t(), target.t()
    return adv, target


_compiled: dict = {}


def _compiled_for(shape_key, backend):
    """One compiled object per shape (layouts and truncation variants recompile inside it)."""
    if backend == "none":  # the scan's math without torch.compile (the smoke test)
        return scan_gae
    key = (shape_key, backend)
    if key not in _compiled:
        import torch._dynamo as dynamo

        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(dynamo.config, name):
                setattr(dynamo.config, name, max(getattr(dynamo.config, name), 256))
        _compiled.clear()
        dynamo.reset()  # the previous shape's compiled code is not needed any more
        _compiled[key] = torch.compile(scan_gae, dynamic=False, backend=backend)
    return _compiled[key]


# --------------------------------------------------------------------------- TorchRL

_torchrl = None


def _torchrl_functional():
    global _torchrl
    if _torchrl is None:
        try:
            import torchrl
            from torchrl.objectives.value import functional as F
        except Exception as e:  # noqa: BLE001 - any import failure means "not available"
            _torchrl = (None, f"torchrl does not import ({type(e).__name__}: {e})"[:200])
        else:
            _torchrl = (F, torchrl.__version__)
    if _torchrl[0] is None:
        raise Skip(_torchrl[1])
    return _torchrl[0]


def torchrl_version():
    try:
        _torchrl_functional()
    except Skip:
        return None
    return _torchrl[1]


# --------------------------------------------------------------------------- dispatch


def make_peer(name: str, estimator: str, d, opts):
    """(fn, graphable, info) for peer ``name`` on case ``d`` (a harness ``View``), or Skip.

    Only the compiled scan and rl-triton are captured in a CUDA graph: the Python loops
    are host-bound (their device time is not what a user waits for) and TorchRL's
    vectorised GAE syncs with the host (``torch.max`` of the trajectory lengths sizes a
    tensor); PufferLib's kernel launches on the legacy default stream, outside any
    capture."""
    T = d.T
    td = d.time_dim % 2
    gamma, lmbda = d.gamma, d.lmbda
    if name == "loop":
        if estimator not in _LOOPS:
            raise Skip("no loop peer for this estimator")
        if T > LOOP_MAX_T and not opts.all_peers:
            raise Skip(f"T={T} > {LOOP_MAX_T} (a Python loop over time; --all-peers runs it)")
        loop = _LOOPS[estimator]
        r, v, term, trunc, boot, nv = d.rewards, d.values, d.terminated, d.truncated, \
            d.bootstrap, d.next_values
        return (lambda: loop(r, v, term, trunc, boot, nv, gamma, lmbda, td)), False, {}

    if name in ("torchrl", "torchrl_vec"):
        if estimator not in ("gae", "lambda_returns"):
            raise Skip("no TorchRL peer for this estimator")
        vec = name == "torchrl_vec"
        if not vec and T > LOOP_MAX_T and not opts.all_peers:
            raise Skip(f"T={T} > {LOOP_MAX_T} (a Python loop over time; --all-peers runs it)")
        if vec and d.N * T > VEC_MAX_NUMEL and not opts.all_peers:
            raise Skip(f"N*T > {VEC_MAX_NUMEL} (pads every trajectory to the longest: "
                       "memory; --all-peers runs it)")
        F = _torchrl_functional()
        # TorchRL layout: [*B, T, F] with a feature axis; time_dim picks the time axis
        nv = _explicit_next_values(d).unsqueeze(-1)
        r = d.rewards.unsqueeze(-1)
        v = d.values.unsqueeze(-1)
        term = d.terminated.unsqueeze(-1)
        done = term if d.truncated is None else (d.terminated | d.truncated).unsqueeze(-1)
        if estimator == "gae":
            f = F.vec_generalized_advantage_estimate if vec else F.generalized_advantage_estimate
            return (lambda: f(gamma, lmbda, v, nv, r, done, term, time_dim=td)), False, {}
        f = F.vec_td_lambda_return_estimate if vec else F.td_lambda_return_estimate
        return (lambda: f(gamma, lmbda, nv, r, done, term, time_dim=td)), False, {}

    if name == "compiled_scan":
        if estimator != "gae":
            raise Skip("the compiled scan peer is GAE only")
        backend = opts.compile_backend
        if backend == "inductor" and opts.compile_spent_s >= opts.compile_budget_s:
            raise Skip(f"compile budget of {opts.compile_budget_s:.0f} s spent "
                       "(--compile-budget-s)")
        f = _compiled_for((d.N, T), backend)
        r, v, term, trunc, boot, nv = d.rewards, d.values, d.terminated, d.truncated, \
            d.bootstrap, d.next_values
        tm = td == 0
        fn = lambda: f(r, v, term, trunc, boot, nv, gamma, lmbda, tm)  # noqa: E731
        t0 = time.perf_counter()
        fn()  # compile here (timed separately, counted against the compile budget)
        if r.is_cuda:
            torch.cuda.synchronize()
        spent = time.perf_counter() - t0
        opts.compile_spent_s += spent
        return fn, r.is_cuda, {"compile_s": round(spent, 2)}

    if name in ext_peers.APPLIES:
        return ext_peers.make(name, estimator, d, opts)

    raise Skip(f"unknown peer {name!r}")
