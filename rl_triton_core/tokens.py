"""Token-level advantages for LLM post-training (verl, OpenRLHF, TRL).

Data is right-padded ``[batch, response_len]`` (``time_dim=-1``) or packed: one 1-D
stream of every response back to back, ``cu_seqlens`` (``[n + 1]`` offsets, as
flash-attention packs sequences) marking where each starts. ``mask`` is nonzero on
the tokens the policy generated and zero on prompt, padding and multi-turn
observation (tool output) tokens. Rewards and values may have any float dtype
(bfloat16 included, each its own); arithmetic is float32 (float64 for float64 data);
outputs have the promoted dtype of rewards and values. Nothing here synchronises the
host: an empty mask under whitening gives NaN where verl raises.

CUDA tensors run the Triton kernels of ``rl_triton_core.token._token_kernel``; CPU
tensors the C kernel ``rl_triton_core.token._ctoken`` where it was built, else (or with
``RL_TRITON_CORE_CPU_KERNEL=numba``) the numba loops of ``rl_triton_core.token._token_cpu``,
bit for bit the same results, except for float32 data on CPUs with AVX-512, which the C
kernel computes in float32 (within float32 rounding of them)
(``RL_TRITON_CORE_BACKEND`` chooses as for every estimator).
"""

from __future__ import annotations

import numbers
import os

import torch

from rl_triton_core import _config, _host, _record, _validate
from rl_triton_core.scan import _claunch, _cpu_c, _dispatch
from rl_triton_core.scan._dispatch import backend_for

__all__ = ["masked_gae", "masked_returns", "masked_whiten"]

_GAE_SKIP, _GAE_MUL, _RET_SKIP, _RET_MUL, _STATS = 0, 1, 2, 3, 4


def masked_gae(rewards, values, mask, *, gamma=1.0, lmbda=1.0, skip=True, whiten=False,
               count_eps=0.0, eps=1e-8, unbiased=True, fill=None, cu_seqlens=None, time_dim):
    """Token-level GAE with a response mask; optionally whitened over the valid tokens.

    ``skip=True`` is verl's ``compute_gae_advantage_return``: masked tokens change
    nothing, the advantage and the next value are carried across them:

        nv_t    = mask_t V_t + (1 - mask_t) nv_{t+1},                nv_T = 0
        delta_t = r_t + gamma nv_{t+1} - V_t
        A_t     = mask_t (delta_t + gamma lambda A_{t+1}) + (1 - mask_t) A_{t+1}

    ``skip=False`` is OpenRLHF's ``get_advantages_and_returns``: rewards and values
    are multiplied by the mask, then plain GAE (Schulman et al. 2015) without done
    flags, the last token's next value 0. ``returns = A + V`` (``A + mask V`` for
    ``skip=False``), before any whitening.

    ``whiten=True`` whitens the advantages over the valid tokens of the whole batch,
    as [`masked_whiten`][] does with the same ``count_eps``, ``eps`` and
    ``unbiased``, fused into the scan (verl: ``count_eps=1e-8``). ``fill`` (a number)
    is written at masked tokens of the advantages, after whitening (TRL: 0).

    Args:
        rewards, values: ``[B, T]`` (or ``[T]``) or packed ``[total]``, any float dtype.
        mask: same shape, bool/int/float; nonzero marks a valid token.
        gamma, lmbda: numbers in [0, 1].
        cu_seqlens: int ``[n + 1]`` offsets into packed 1-D data, on its device.
        time_dim: the token axis (-1 for the frameworks' ``[batch, response_len]``).

    Returns:
        tuple[Tensor, Tensor]: ``(advantages, returns)``, new tensors of the data's shape.

    Examples:
        >>> import torch, rl_triton_core as rc
        >>> r = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
        >>> v = torch.tensor([[0.5, 0.6, 0.7, 0.0]])
        >>> mask = torch.tensor([[1, 0, 1, 0]])
        >>> adv, ret = rc.masked_gae(r, v, mask, gamma=1.0, lmbda=1.0, time_dim=-1)
        >>> adv
        tensor([[0.5000, 0.3000, 0.3000, 0.0000]])
    """
    mode = _GAE_SKIP if _validate.flag("skip", skip) else _GAE_MUL
    return _scan("masked_gae", mode, rewards, values, mask, gamma, lmbda, cu_seqlens, time_dim,
                 _whitening(whiten, count_eps, eps, unbiased, True, fill))


def masked_returns(rewards, mask, *, gamma=1.0, skip=True, cu_seqlens=None, time_dim):
    """Token-level discounted returns with a response mask.

    ``skip=True`` is verl's REINFORCE++ (``compute_reinforce_plus_plus_outcome_advantage``,
    before its whitening): the return runs over valid tokens only and is 0 on masked
    ones, ``R_t = r_t + gamma R_{next valid token}``. ``skip=False`` is OpenRLHF's
    ``get_cumulative_returns``: ``R_t = mask_t r_t + gamma R_{t+1}``, ``R_T = 0``.

    Shapes and arguments as [`masked_gae`][].

    Examples:
        >>> import torch, rl_triton_core as rc
        >>> r = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
        >>> mask = torch.tensor([[1, 0, 1, 0]])
        >>> rc.masked_returns(r, mask, gamma=0.5, time_dim=-1)
        tensor([[0.5000, 0.0000, 1.0000, 0.0000]])
    """
    mode = _RET_SKIP if _validate.flag("skip", skip) else _RET_MUL
    return _scan("masked_returns", mode, rewards, None, mask, gamma, 1.0, cu_seqlens, time_dim,
                 None)[0]


def masked_whiten(x, mask, *, shift_mean=True, unbiased=True, eps=1e-8, count_eps=0.0,
                  fill=None):
    """Whiten ``x`` with the mean and variance of its valid entries (all of them, every row):

        n = sum(mask),  mean = sum(mask x) / (n + count_eps)
        var = sum(mask (x - mean)^2) / (n + count_eps) * (n / (n - 1) if unbiased)
        y = (x - mean) / sqrt(var + eps)    (+ mean if not shift_mean)

    at every entry, masked ones too, unless ``fill`` (a number) is given: then masked
    entries are ``fill``. verl's ``masked_whiten`` is ``count_eps=1e-8``, TRL's
    ``count_eps=0``. One valid entry gives inf or NaN (verl and TRL raise; that would
    synchronise the host).

    Args:
        x: ``[B, T]``, ``[T]`` (or any shape that views as rows), any float dtype.
        mask: same shape, bool/int/float; nonzero marks a valid entry.

    Returns:
        Tensor: a new tensor like ``x``.

    Examples:
        >>> import torch, rl_triton_core as rc
        >>> x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
        >>> rc.masked_whiten(x, torch.tensor([[1, 1, 1, 0]]), fill=0.0)
        tensor([[-1.,  0.,  1.,  0.]])
    """
    how = _whitening(True, count_eps, eps, unbiased, _validate.flag("shift_mean", shift_mean),
                     fill)
    prefix = ("masked_whiten", how)
    res = _replay(prefix, (x, None, mask, None, 0.0, 0.0))
    if res is not None:
        return res
    _not_transformed("masked_whiten")
    raw = (x, None, mask, None, 0.0, 0.0) + _numbers(0.0, 0.0)
    x = _validate.floating("x", _validate.tensor("x", x))
    mask = _validate.tensor("mask", mask, flag=True)
    _validate.same_shape("mask", mask, "x", x.shape)
    device = _validate.same_device([("x", x), ("mask", mask)])
    x2, m2 = _rows(x), _rows(mask)
    out = _empty(x2.shape, x.dtype, device)
    if x.numel():
        ran = _run(_STATS, x2, None, m2, None, 0.0, 0.0, out, None, how, whiten_src=x2)
        _remember(prefix, raw, ran, {x2: (x, 0), m2: (mask, 2)}, ((out, x.shape),), 1)
    return out.reshape(x.shape)


def _whitening(whiten, count_eps, eps, unbiased, shift, fill):
    """The whitening options, checked: None, or (count_eps, eps, unbiased, shift, fill)."""
    if not _validate.flag("whiten", whiten):
        if fill is not None:
            _number("fill", fill)
        return None if fill is None else (None, None, None, True, float(fill))
    for name, value in (("count_eps", count_eps), ("eps", eps)):
        _number(name, value)
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if fill is not None:
        _number("fill", fill)
    return (float(count_eps), float(eps), _validate.flag("unbiased", unbiased), shift,
            None if fill is None else float(fill))


def _number(name, value):
    if type(value) is float or type(value) is int:  # (the common case, without the ABC check)
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")


def _rows(t):
    """A view ``[R, P]`` of ``t`` with its last axis as tokens (no copy where strides allow)."""
    if t.dim() == 0:
        return t.reshape(1, 1)
    if t.dim() == 1:
        return t.unsqueeze(0)
    return t.reshape(-1, t.shape[-1])


def _not_transformed(name):
    """NotImplementedError inside a torch.func transform (functionalize, vmap, grad):
    the token kernels read the tensors' memory, which the transforms' tensors do not
    have (the scan estimators run as their custom op there)."""
    if torch._C._functorch.peek_interpreter_stack() is not None:
        raise NotImplementedError(
            f"rl_triton_core.{name} does not run inside torch.func transforms "
            "(functionalize, vmap, grad): call it outside the transform")


def _scan(name, mode, rewards, values, mask, gamma, lmbda, cu_seqlens, time_dim, how):
    prefix = (name, mode, type(time_dim), time_dim, how)
    res = _replay(prefix, (rewards, values, mask, cu_seqlens, gamma, lmbda), time_dim)
    if res is not None:
        return res
    _not_transformed(name)
    raw = (rewards, values, mask, cu_seqlens, gamma, lmbda) + _numbers(gamma, lmbda)
    rewards = _validate.tensor("rewards", rewards)
    named = [("rewards", rewards)]
    if values is not None:
        values = _validate.tensor("values", values)
        named.append(("values", values))
    for n, t in named:
        _validate.floating(n, t)
    mask = _validate.tensor("mask", mask, flag=True)
    for n, t in named[1:] + [("mask", mask)]:
        _validate.same_shape(n, t, "rewards", rewards.shape)
    device = _validate.same_device(named + [("mask", mask), ("cu_seqlens", cu_seqlens)])
    g, _ = _validate.coefficient("gamma", gamma, ())
    lm, _ = _validate.coefficient("lmbda", lmbda, ())
    if g is None or lm is None:
        raise TypeError("gamma and lmbda must be numbers (a CUDA tensor would need a host sync)")
    if isinstance(time_dim, bool) or not isinstance(time_dim, int):
        raise TypeError(f"time_dim must be an int, got {type(time_dim).__name__}")
    nd = rewards.dim()
    if nd not in (1, 2):
        raise ValueError(f"{name} takes [batch, response_len] or 1-D data, got rewards of "
                         f"shape {tuple(rewards.shape)}")
    if not -nd <= time_dim < nd:
        raise ValueError(f"time_dim={time_dim} is out of range for {nd}-D rewards")
    if cu_seqlens is not None:
        cu_seqlens = _validate.tensor("cu_seqlens", cu_seqlens)
        if nd != 1:
            raise ValueError("cu_seqlens takes packed 1-D data [total_tokens], got rewards of "
                             f"shape {tuple(rewards.shape)}")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1 or cu_seqlens.is_floating_point() \
                or cu_seqlens.dtype == torch.bool:
            raise ValueError("cu_seqlens must be 1-D integer offsets [n + 1], got "
                             f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}")
    tm = time_dim % nd
    if nd == 2 and tm == 0:  # [T, B]: the token axis last, as a view
        rewards, mask = rewards.t(), mask.t()
        values = None if values is None else values.t()
    r2, m2 = _rows(rewards), _rows(mask)
    v2 = None if values is None else _rows(values)
    dtype = rewards.dtype if values is None else torch.promote_types(rewards.dtype, values.dtype)
    a = _empty(r2.shape, dtype, device)
    b = _empty(r2.shape, dtype, device) if mode in (_GAE_SKIP, _GAE_MUL) else None
    if r2.numel() and (cu_seqlens is None or cu_seqlens.numel() > 1):
        ran = _run(mode, r2, v2, m2, cu_seqlens, float(g), float(g) * float(lm), a, b, how)
        if not (nd == 2 and tm == 0):  # (time-major: the outputs are transposed views)
            shape = raw[0].shape
            sources = {r2: (raw[0], 0), m2: (raw[2], 2)}
            if v2 is not None:
                sources[v2] = (raw[1], 1)
            if cu_seqlens is not None:
                sources[cu_seqlens] = (raw[3], 3)
            _remember(prefix, raw, ran, sources, ((a, shape),) + ((b, shape),) * (b is not None),
                      2)

    def shaped(o):
        if o is None:
            return None
        o = o.reshape(rewards.shape)
        return o.t() if nd == 2 and tm == 0 else o
    return shaped(a), shaped(b)


def _run(mode, r, v, m, cu, g, gl, out0, out1, how, whiten_src=None):
    """Run the kernels; on the Triton path return their launches (``_token_kernel.run``)."""
    if backend_for(r.device) == "triton":
        from rl_triton_core.token import _token_kernel
        return _token_kernel.run(mode, r, v, m, cu, g, gl, out0, out1, how, whiten_src)
    _run_cpu(mode, r, v, m, cu, g, gl, out0, out1, how, whiten_src)
    return None


# ------------------------------------------------------------------ recorded launches
# A Triton call that ran through the full path is recorded (``_record.Recorded``) in the
# scan's table of recorded calls (``_dispatch.cached``, ``_dispatch._store``) under the key
# of its arguments (shapes, strides, dtypes, devices, the tuning, the checked options); a
# repeat skips the checks, the views and Triton's argument binding, and launches the
# compiled kernels again (a ``_tl.Chain`` of ``_tl.Replay``), on fresh outputs. ``raw``:
# (data, values, mask, cu_seqlens, gamma, lmbda, then the float32 halves of gamma and of
# gamma lambda, which the token scan takes: :func:`_numbers`).
_NUMBERS = ("g_hi", "g_lo", "gl_hi", "gl_lo")  # the token scan's, from raw[6:10]
_RANGES = ((4, 0.0, 1.0), (5, 0.0, 1.0))  # gamma and lambda in [0, 1], else the full path


def _numbers(gamma, lmbda) -> tuple:
    """The token scan's numbers (``_host.split`` of gamma and of gamma lambda), or four
    Nones where gamma or lambda is not a plain float or int (never recorded: the full
    path checks them)."""
    if type(gamma) in (float, int) and type(lmbda) in (float, int):
        g = float(gamma)
        return _host.split(g) + _host.split(g * float(lmbda))
    return (None,) * 4


def _replay(prefix, args, time_dim=0):
    """The result of a recorded call with these arguments (``args``: data, values, mask,
    cu_seqlens, gamma, lmbda), or None (the full path runs). Looked up only for the
    calls :func:`_remember` records (CUDA tensors; CPU tensors only under the tests'
    ``cpu_plans``), where some call was recorded: a CPU call builds no key, though the
    scan's CPU calls keep records in the same table. A CUDA call tries the C replay
    first (``scan/_claunch.py``: no Python between here and the launch; :func:`_c_args`),
    then the recorded launch in Python."""
    x = args[0]
    if (not _dispatch._PLANS or type(x) is not torch.Tensor
            or not (x.is_cuda or _config._current.cpu_plans)
            or torch.compiler.is_compiling()):
        return None
    if _claunch.recorded and type(time_dim) is int:
        res = _cpu_c.replay(_dispatch._PLANS, _cprefix(prefix), _c_args(args), time_dim,
                            _config._current)
        if res is not None:
            return res
    return _dispatch.cached(prefix, args + _numbers(args[4], args[5]))[1]


def _c_args(args) -> tuple:
    """The C replay's arguments of a call: ``args`` and gamma lambda (None where gamma or
    lambda is not a plain number: never recorded). The C replay splits gamma and gamma
    lambda into the token scan's float32 halves as :func:`_numbers` does."""
    g, lm = args[4], args[5]
    gl = float(g) * float(lm) if type(g) in (float, int) and type(lm) in (float, int) else None
    return args + (gl,)


# the Python record's numbers (raw[6:10], :func:`_numbers`) as the C call's (``_c_args``):
# the halves of gamma (argument 4) and of gamma lambda (argument 6)
_C_NUMBERS = {6: ("hi", 4), 7: ("lo", 4), 8: ("hi", 6), 9: ("lo", 6)}


_CPREFIX: dict = {}  # a call's prefix -> its prefix in the C replay's keys


def _cprefix(prefix) -> bytes:
    b = _CPREFIX.get(prefix)
    if b is None:
        b = _CPREFIX[prefix] = b"tokens/" + repr(prefix).encode()
    return b


def _remember(prefix, raw, ran, sources, outs, n_returns):
    """Record a Triton call that just ran (``ran``: its launches and scratch tensors).

    ``sources``: {the view a kernel received: (the user's tensor, its index in raw)};
    ``outs``: (output tensor, the shape it is returned in). Nothing is recorded where a
    kernel received a copy of a user's tensor, a number is not a plain float or int, or
    caching is off (``Tuning.cached_launch``; CPU tensors only under ``cpu_plans``)."""
    tune = _config._current
    if (ran is None or not _dispatch._replay_ok or not tune.cached_launch
            or torch.compiler.is_compiling()):
        return
    device = outs[0][0].device
    if device.type != "cuda" and not tune.cpu_plans:
        return
    if raw[6] is None:  # gamma or lambda not a plain number (_numbers)
        return
    key = _dispatch.key_of(prefix, raw, tune)
    if key is None:
        return
    from rl_triton_core import _tl

    launched, scratch = ran
    allocs, index = [], {}
    for t, shape in outs:
        index[id(t)] = len(allocs)
        allocs.append(_record.Alloc(None, tuple(shape), t.dtype, device))
    for t, zero in scratch:
        index[id(t)] = len(allocs)
        allocs.append(_record.Alloc(None, tuple(t.shape), t.dtype, device, zero=zero))
    user = {id(view): idx for view, (t, idx) in sources.items()
            if view.data_ptr() == t.data_ptr()}  # a view of the user's memory, no copy
    flat, parts, tensors, numbers, placed = [], [], [], [], []
    for jit_fn, compiled, grid, consts, args in launched:
        lo = len(flat)
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if id(a) in index:
                    placed.append((lo + i, index[id(a)]))
                elif id(a) in user:
                    tensors.append((lo + i, user[id(a)]))
                else:
                    return  # a copy the full path made: not repeatable
            elif jit_fn.arg_names[i] in _NUMBERS:
                numbers.append((lo + i, 6 + _NUMBERS.index(jit_fn.arg_names[i])))
        flat += args
        parts.append((_tl.Replay(jit_fn, [(compiled, grid, consts)], len(args), device), lo,
                      len(flat)))
    returns = [(True, k) for k in range(len(outs))]
    if n_returns == 2 and len(outs) == 1:
        returns.append((False, 1))  # masked_returns: (returns, None), raw[1] is None
    rec = _record.Recorded(_tl.Chain(parts), flat, tensors=tensors, numbers=numbers,
                           checks=_RANGES, allocs=allocs, placed=placed, returns=returns)
    _dispatch._store(key, rec)
    time_dim = prefix[3] if len(prefix) == 5 else 0  # (masked_whiten has none: 0)
    if device.type == "cuda" and type(time_dim) is int and _claunch.enabled():
        # the same launches for the C replay, under its key
        cargs = _c_args(raw[:6])
        ckey = _claunch.key(_tl.knobs.runtime, _cprefix(prefix), cargs, time_dim, tune)
        sources = rec.sources()
        for path, (kind, idx) in sources.items():
            if kind == "f32":
                sources[path] = _C_NUMBERS[idx]
        _dispatch._store(ckey, _claunch.of_recorded(ckey, rec, flat, len(cargs), tune, sources))


def _np(t):
    """A numpy view of data: bfloat16 as an int16 view of its bits, which the CPU path
    decodes (no copy); float16 as a float32 copy."""
    if t.dtype == torch.bfloat16:
        return t.detach().view(torch.int16).numpy()
    if t.dtype == torch.float16:
        t = t.float()
    return t.detach().numpy()


def _np_mask(m):
    """A numpy view of a mask, read as ``!= 0`` (half types as a float32 copy: the bits of
    -0.0 are nonzero)."""
    import numpy as np

    m = m.detach()
    if m.dtype == torch.bool:
        return m.numpy().view(np.uint8)
    if m.dtype in (torch.float16, torch.bfloat16):
        return m.float().numpy()
    return m.numpy()


_CK = None  # the C kernel module once imported; False where it is not built


def _ckernel():
    """``rl_triton_core.token._ctoken`` (the C kernel), or None: not built, or
    ``RL_TRITON_CORE_CPU_KERNEL=numba`` (read at every call) asks for the numba loops."""
    global _CK
    if os.environ.get("RL_TRITON_CORE_CPU_KERNEL", "c") == "numba":
        return None
    if _CK is None:
        try:
            from rl_triton_core.token import _ctoken
            _CK = _ctoken
        except ImportError:
            _CK = False
    return _CK or None


def _empty(shape, dtype, device):
    """An output tensor; on the CPU, large ones from the block cache (``_host.empty``)."""
    if device.type == "cpu":
        return _host.empty(shape, dtype)
    return torch.empty(shape, dtype=dtype, device=device)




def _run_c(ck, mode, r, v, m, cu, g, gl, out0, out1, how, whiten_src):
    """One call of the C kernel: the scan (or masked_whiten's statistics), the combination
    of the statistics and the whitening pass, with the GIL released; the same results, bit
    for bit, as the numba path below."""
    import numpy as np

    layout = None
    if cu is not None:
        c = cu.numpy().astype(np.int64)
        layout = (np.zeros(c.shape[0] - 1, dtype=np.int64), np.ascontiguousarray(c[:-1]),
                  np.maximum(np.diff(c), 0))
    n = r.shape[0] if layout is None else layout[0].shape[0]
    threads = min(_host.THREADS if r.numel() >= _host.MIN_WORK else 1, max(n, 1))
    half = out0.dtype in (torch.float16, torch.bfloat16)
    o0 = _empty(out0.shape, torch.float64, out0.device) if half else out0
    o1 = None
    if out1 is not None:
        o1 = _empty(out1.shape, torch.float64, out1.device) if half else out1
    wmode, ce, eps, unb, shift, fill = 0, 0.0, 0.0, True, True, None
    if how is not None:
        ce, eps, unb, shift, fill = how
        wmode = 2 if ce is None else 1
        ce, eps, unb = (0.0, 0.0, True) if ce is None else (ce, eps, unb)
    mm = _np_mask(m)
    if mode == _STATS:
        ck.run(4, None, None, mm, _np(whiten_src), layout, 0.0, 0.0, o0.numpy(), None, wmode,
               ce, eps, unb, shift, fill, threads)
    else:
        ck.run(mode, _np(r), None if v is None else _np(v), mm, None, layout, g, gl,
               o0.numpy(), None if o1 is None else o1.numpy(), wmode, ce, eps, unb, shift,
               fill, threads)
    if o1 is not None and o1 is not out1:
        out1.copy_(o1)
    if o0 is not out0:
        out0.copy_(o0)


def _run_cpu(mode, r, v, m, cu, g, gl, out0, out1, how, whiten_src):
    ck = _ckernel()
    if ck is not None:
        _run_c(ck, mode, r, v, m, cu, g, gl, out0, out1, how, whiten_src)
        return
    import numpy as np

    from rl_triton_core.token import _token_cpu as k

    k.settle()  # no numba call while the GAE first-call path's warm-up thread runs
    rows, starts, lens = k.layout(r.shape[0], r.shape[1],
                                  None if cu is None else cu.numpy())
    if cu is not None:
        lens = np.maximum(lens, 0)
    n, work = rows.shape[0], r.numel()
    stats = np.zeros((n, 3))
    mm = _np_mask(m)
    half = out0.dtype in (torch.float16, torch.bfloat16)
    o0 = torch.empty(out0.shape, dtype=torch.float64) if half else out0
    k.huge_pages(o0)  # fresh buffers: fewer page faults on the first writes
    if mode == _STATS:
        k.split(k.row_stats, n, work, _np(whiten_src), mm, rows, starts, lens, stats)
    else:
        o1 = None
        if out1 is not None:
            o1 = torch.empty(out1.shape, dtype=torch.float64) if half else out1
            k.huge_pages(o1)
        rr = _np(r)
        vv = _np(v) if v is not None else rr
        k.split(k.SCANS[mode], n, work, rr, vv, mm, rows, starts, lens, g, gl, o0.numpy(),
                (o1 if o1 is not None else o0).numpy(), stats,
                how is not None and how[0] is not None)
        if o1 is not None and o1 is not out1:
            out1.copy_(o1)
    if how is not None:
        count_eps, eps, unbiased, shift, fill = how
        if count_eps is None:  # fill only
            mu, rstd, do_shift = 0.0, 1.0, True
        else:
            mu, rstd = k.finish(stats, count_eps, eps, unbiased)
            do_shift = shift
        src = _np(whiten_src) if mode == _STATS else o0.numpy()
        k.split(k.WHITENS[(bool(do_shift), fill is not None)], n, work, src, mm, rows, starts,
                lens, float(mu), float(rstd), 0.0 if fill is None else fill, o0.numpy())
    if o0 is not out0:
        out0.copy_(o0)
