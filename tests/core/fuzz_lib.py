"""The fuzz generator and its fast float64 oracle, shared by test_fuzz.py (CPU, CUDA,
interpreter) and the GPU-only tests that reuse its inputs.

A *profile* fixes everything about a call that decides which compiled variant runs
(numba specialises on array dtypes and C/F/A layouts and on which inputs are present;
Triton on dtypes, present inputs, tile constexprs, and on whether each integer argument
-- sizes and strides -- is 1 or a multiple of 16): the number of axes and where time
is, each axis' size class (1, odd, a multiple of 16) and T's power-of-two bucket, the
memory view of every tensor role (contiguous, permuted, sliced with a step and an
offset, expanded), the data, flag, coefficient and out= dtypes, which optional inputs
are given and how each coefficient is passed. A *case* draws, inside its profile, the
sizes, T, time_dim's spelling, the values, the flag bits and their nonzero values, the
coefficient values and thresholds. A fuzz chunk draws a few profiles and many cases per
profile: every case is random, and the number of compiled variants a chunk needs stays
bounded (a fresh numba variant costs ~2 s on the CI machine, a fresh Triton one ~1 s).

The oracle (:func:`fast_reference`) builds each estimator's (alpha, beta) coefficients
in float64 from semantics.md and runs the recurrence as a numpy loop over time over all
streams at once; it is checked against ``rl_triton_core.reference`` (the test oracle of
record) on a fixed fraction of the cases of every chunk.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch

import rl_triton_core as rc
from rl_triton_core import reference as ref
from rl_triton_core._table import TABLE

F64 = torch.float64
# every row of the table, and retrace_from_actions (built on retrace's row)
ESTIMATORS = tuple(TABLE) + ("retrace_from_actions",)
RETURNS = tuple(n for n, e in TABLE.items() if e.checks == "returns")
FORWARD = tuple(n for n, e in TABLE.items() if e.checks == "forward")
# the rows that bootstrap from next_values or bootstrap_value
BOOTSTRAPPED = tuple(n for n, e in TABLE.items() if "bootstrap_value" in e.inputs)
HALF = (torch.float16, torch.bfloat16)
# allowed error relative to max(1, max |reference|), plus the same relative to |reference|
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}
VIEWS = ("contiguous", "permuted", "sliced", "expanded")


# ---------------------------------------------------------------------------- profile


def _pick(rng, weighted):
    """A random key of ``{value: weight}``."""
    keys = list(weighted)
    return rng.choices(keys, weights=[weighted[k] for k in keys])[0]


def draw_profile(name: str, rng: random.Random, device: str = "cpu", tiny: bool = False) -> dict:
    """The compile-relevant structure of a family of cases (see the module docstring)."""
    p = {"name": name}
    p["dtype"] = _pick(rng, {torch.float32: 5, torch.float64: 3, torch.float16: 1,
                             torch.bfloat16: 1})
    n_lead = _pick(rng, {0: 3, 1: 4, 2: 2, 3: 1})
    n_trail = _pick(rng, {0: 5, 1: 3, 2: 1})
    p["n_feat"] = _pick(rng, {0: 3, 1: 2, 2: 1}) if name in FORWARD else 0
    if name == "retrace_from_actions":
        p["A"] = _pick(rng, {"one": 1, "odd": 4, "m16": 1})
    size_w = {"one": 3, "odd": 6, "m16": 1} if not tiny else {"one": 3, "odd": 6}
    p["lead"] = [_pick(rng, size_w) for _ in range(n_lead)]
    p["trail"] = [_pick(rng, size_w) for _ in range(n_trail)]
    p["feat"] = [_pick(rng, size_w) for _ in range(p["n_feat"])]
    # T's bucket: T in (2^(k-1), 2^k]; k = 0 is T = 1; long buckets on the GPU only
    buckets = {0: 2, 1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 2, 7: 1}
    if tiny:
        buckets = {0: 2, 1: 1, 2: 2, 3: 2, 4: 3, 5: 2}
    elif device == "cuda":
        buckets.update({8: 1, 9: 1, 10: 1, 11: 1, 12: 1})
    # numba does not specialise on sizes: on the CPU each case draws its own T
    p["T_buckets"] = buckets if device != "cuda" else {_pick(rng, buckets): 1}
    p["T_m16"] = rng.random() < 0.3
    p["tiny"] = tiny
    ndim = n_lead + 1 + n_trail + p["n_feat"]
    p["ndim"] = ndim
    p["pos"] = n_lead
    roles = _roles(name)
    shared = rng.random() < 0.6
    view0 = _draw_view(rng, ndim)
    p["views"] = {r: (view0 if shared else _draw_view(rng, ndim)) for r in roles}
    # flags
    p["flag_kind"] = _pick(rng, {"bool": 4, "uint8": 2, "int64": 1, "float": 2, "float32": 1})
    p["flag_bcast"] = _bcast_pattern(rng, n_lead + 1 + n_trail, n_lead, 0.2)
    if name in RETURNS:
        p["trunc"] = rng.random() < 0.6
    if name in BOOTSTRAPPED:
        p["vmode"] = _pick(rng, {"next_values": 1, "bootstrap": 1, "shifted": 1})
        p["boot_bcast"] = _bcast_pattern(rng, n_lead + n_trail, n_lead, 0.2)
    if name == "lambda_returns":
        p["values_none"] = p["vmode"] == "next_values" and rng.random() < 0.3
    if name == "retrace_from_actions":
        p["trunc"] = rng.random() < 0.6
        p["next_mode"] = _pick(rng, {"next": 1, "bootstrap": 1, "none": 1})
        p["boot_bcast"] = _bcast_pattern(rng, n_lead + n_trail + 1, n_lead, 0.2)
        p["actions_dtype"] = _pick(rng, {torch.int64: 3, torch.int32: 1, torch.uint8: 1})
    if name in FORWARD + ("linear_recurrence",):
        p["init"] = _pick(rng, {"none": 2, "full": 2, "bcast": 1})
        p["init_bcast"] = _bcast_pattern(rng, ndim - 1, n_lead, 0.3)
    if name == "linear_recurrence":
        p["reverse"] = rng.random() < 0.5
        p["beta"] = _pick(rng, {"full": 3, "bcast": 1})
        p["beta_bcast"] = _bcast_pattern(rng, ndim, n_lead, 0.3)
    p["coefs"] = {c: _draw_coef(rng, p, c) for c in _coef_names(name)}
    two = _n_out(name) == 2
    p["out"] = None
    if rng.random() < 0.25:
        p["out"] = dict(dtype=_pick(rng, {"same": 3, torch.float32: 1, torch.float64: 1}),
                        view=_draw_view(rng, ndim, allow_expand=False), two=two)
    return p


def _roles(name):
    if name in FORWARD:
        return ("x", "done", "init", "coef")
    if name == "linear_recurrence":
        return ("alpha", "beta", "init")
    if name == "retrace_from_actions":
        return ("q", "probs", "actions", "mu", "rewards", "flags", "next", "boot", "coef")
    return ("rewards", "values", "next_values", "log_rhos", "q", "e", "flags", "boot", "coef")


def _coef_names(name):
    return TABLE.get(name, TABLE["retrace"]).coefs  # retrace_from_actions: retrace's


def _n_out(name):
    return TABLE.get(name, TABLE["retrace"]).n_out


def _draw_view(rng, ndim, allow_expand=True):
    w = {"contiguous": 4, "permuted": 3, "sliced": 3, "expanded": 1 if allow_expand else 0}
    kind = _pick(rng, w)
    v = {"kind": kind}
    if kind == "permuted":
        perm = list(range(ndim))
        rng.shuffle(perm)
        v["perm"] = perm
    elif kind == "sliced":
        v["axis"] = rng.randrange(ndim)
        v["step"] = rng.choice((2, 3))
        v["offset"] = rng.choice((0, 1))
        v["transpose"] = rng.random() < 0.3
    elif kind == "expanded":
        v["axis"] = rng.randrange(ndim)  # this axis has stride 0 (values repeat along it)
    return v


def _bcast_pattern(rng, ndim, pos, p_one):
    """Which axes of a broadcastable tensor are 1 (never the time axis ``pos``), and how
    many leading axes are dropped (only where they are all 1)."""
    ones = [i != pos and rng.random() < p_one for i in range(ndim)]
    drop = 0
    while drop < ndim and ones[drop] and rng.random() < 0.5:
        drop += 1
    return {"ones": ones, "drop": drop}


def _draw_coef(rng, p, name):
    threshold = name in ("rho_bar", "c_bar", "pg_rho_bar")
    modes = {"float": 4, "int": 0 if threshold else 1, "inf": 1 if threshold else 0, "t0": 1,
             "t1": 1, "full": 2, "per_step": 1, "per_stream": 1, "bcast": 1}
    if p["name"] in FORWARD and p["n_feat"]:
        modes["x_full"] = 1  # eligibility traces: a per-feature discount
    mode = _pick(rng, modes)
    c = {"mode": mode, "dtype": _pick(rng, {"same": 3, torch.float32: 1, torch.float64: 1})}
    if mode == "bcast":
        nd = p["ndim"] - p["n_feat"]
        c["bcast"] = _bcast_pattern(rng, nd, p["pos"], 0.4)
    return c


# ------------------------------------------------------------------------------- case


class Case:
    """One call: ``call()`` runs the library, ``oracle()`` the fast float64 reference,
    ``slow()`` rl_triton_core.reference (both return float64 CPU tensors)."""

    def __init__(self, desc, call, oracle, slow, out_dtypes, inputs, out, T):
        self.desc, self.call, self.oracle, self.slow = desc, call, oracle, slow
        self.out_dtypes, self.inputs, self.out, self.T = out_dtypes, inputs, out, T


def _size(rng, cls, tiny=False):
    if cls == "one":
        return 1
    if cls == "odd":
        return rng.choice((3, 5) if tiny else (3, 5, 7, 9, 11))
    return rng.choice((16, 32))


def _T(rng, p):
    k = _pick(rng, p["T_buckets"])
    if k == 0:
        return 1
    lo, hi = 2 ** (k - 1) + 1, 2 ** k
    if p["T_m16"] and k >= 4:
        return rng.randrange((lo + 15) // 16 * 16, hi + 1, 16)
    return rng.randint(lo, hi)


def _materialize(x: torch.Tensor, view: dict, device, poison=None) -> torch.Tensor:
    """``x``'s values on ``device`` in memory layout ``view``; sliced views leave
    ``poison`` (NaN, or a set flag) in the elements they skip, so reading them shows."""
    x = x.to(device)
    nd = x.dim()
    kind = view["kind"] if nd else "contiguous"
    if kind == "contiguous":
        return x.clone().contiguous()
    if kind == "permuted":
        perm = [d for d in view["perm"] if d < nd]
        perm += [d for d in range(nd) if d not in perm]
        inv = [perm.index(i) for i in range(nd)]
        return x.permute(perm).contiguous().permute(inv)
    axis = view["axis"] % nd
    if kind == "expanded":
        if x.shape[axis] <= 1:
            return x.clone()
        idx = [slice(None)] * nd
        idx[axis] = slice(0, 1)
        return x[tuple(idx)].clone().expand(x.shape)  # values are repeated: see _expand_values
    # sliced: every step-th element of a larger buffer along ``axis``
    step, off = view["step"], view["offset"]
    shape = list(x.shape)
    shape[axis] = shape[axis] * step + off
    if poison is None:
        poison = float("nan") if x.is_floating_point() else 1
    buf = torch.full(shape, poison, dtype=x.dtype, device=device)
    if view.get("transpose") and nd >= 2:
        buf = buf.transpose(0, -1).contiguous().transpose(0, -1)
    idx = [slice(None)] * nd
    idx[axis] = slice(off, None, step)
    out = buf[tuple(idx)]
    out.copy_(x)
    return out


def _expand_values(x: torch.Tensor, view: dict) -> torch.Tensor:
    """An expanded view repeats the first slice along its axis: the values it holds."""
    if view["kind"] != "expanded" or x.dim() == 0:
        return x
    axis = view["axis"] % x.dim()
    if x.shape[axis] <= 1:
        return x
    idx = [slice(None)] * x.dim()
    idx[axis] = slice(0, 1)
    return x[tuple(idx)].expand(x.shape).clone()


class _Draw:
    """Random values for one case (structure from ``rng``, values from ``gen``)."""

    def __init__(self, rng, gen, p, device):
        self.rng, self.gen, self.p, self.device = rng, gen, p, device

    def data(self, shape, role, lo=None, hi=None, scale=1.0, dtype=None):
        """(tensor on device in the role's view, its values as a CPU tensor)."""
        dtype = dtype or self.p["dtype"]
        if lo is None:
            x = torch.randn(shape, generator=self.gen, dtype=F64) * scale
        else:
            x = lo + (hi - lo) * torch.rand(shape, generator=self.gen, dtype=F64)
        view = self.p["views"].get(role, {"kind": "contiguous"})
        x = _expand_values(x.to(dtype), view)
        return _materialize(x, view, self.device), x

    def flag(self, shape, role="flags"):
        """A flag tensor broadcastable to ``shape`` (kind and pattern from the profile)."""
        p = self.p
        pat = p["flag_bcast"]
        fshape = [1 if one else s for s, one in zip(shape, pat["ones"])][pat["drop"]:]
        prob = self.rng.choice((0.0, 0.05, 0.2, 0.5, 1.0))
        bits = torch.rand(fshape, generator=self.gen) < prob
        kind = p["flag_kind"]
        if kind == "bool":
            f = bits
        else:
            menu = {"uint8": (torch.uint8, [1, 2, 7, 255]), "int64": (torch.int64, [1, -1, 3]),
                    "float": (p["dtype"], [1.0, 2.0, -1.0, 0.5, float("nan")]),
                    "float32": (torch.float32, [1.0, 2.0, -3.0])}[kind]
            dtype, values = menu
            pick = torch.tensor(values, dtype=dtype)[
                torch.randint(0, len(values), fshape, generator=self.gen)]
            f = torch.where(bits, pick, torch.zeros((), dtype=dtype))
        view = p["views"].get(role, {"kind": "contiguous"})
        f = _expand_values(f, view)
        poison = True if f.dtype == torch.bool else (1 if not f.is_floating_point() else 1.0)
        return _materialize(f, view, self.device, poison=poison), f

    def notime(self, shape, pattern, role):
        """A tensor broadcastable to ``shape`` (an axis of 1 where ``pattern`` says)."""
        bshape = [1 if one else s for s, one in zip(shape, pattern["ones"])][pattern["drop"]:]
        return self.data(bshape, role)

    def coef(self, name, shape, pos, done_shape=None):
        """(value for the library, value for the oracle) of coefficient ``name``."""
        c = self.p["coefs"][name]
        threshold = name in ("rho_bar", "c_bar", "pg_rho_bar")
        lo = self.rng.choice((0.0, 0.5, 0.9)) if not threshold else 0.3
        hi = 1.0 if not threshold else 2.5
        mode = c["mode"]
        if mode == "float":
            v = self.rng.uniform(lo, hi)
            if self.rng.random() < 0.1:
                v = float(self.rng.choice((lo, hi)))
            return v, v
        if mode == "int":
            v = self.rng.choice((0, 1))
            return v, v
        if mode == "inf":
            return math.inf, math.inf
        dtype = self.p["dtype"] if c["dtype"] == "same" else c["dtype"]
        base = shape if done_shape is None else done_shape
        if mode == "t0":
            cshape = ()
        elif mode == "t1":
            cshape = (1,)
        elif mode in ("full", "x_full"):
            cshape = tuple(shape if mode == "x_full" else base)
        elif mode == "per_step":  # varies along time only, leading axes dropped
            cshape = tuple(s if i == pos else 1 for i, s in enumerate(base))[pos:]
        elif mode == "per_stream":
            cshape = tuple(1 if i == pos else s for i, s in enumerate(base))
        else:
            pat = c["bcast"]
            cshape = tuple(1 if one else s for s, one in zip(base, pat["ones"]))[pat["drop"]:]
        t = lo + (hi - lo) * torch.rand(cshape, generator=self.gen, dtype=F64)
        flat = t.view(-1)
        if flat.numel() >= 4:  # exact ends too
            flat[0], flat[-1] = lo, hi
        t = t.to(dtype)
        if t.dim() == len(shape) and mode in ("full", "x_full"):
            view = self.p["views"]["coef"]
            t = _expand_values(t, view)
            return _materialize(t, view, self.device), t
        return t.to(self.device), t


def draw_case(p: dict, rng: random.Random, gen: torch.Generator, device, tiny=False,
              sizes_for=None) -> Case:
    """One random call in profile ``p`` on ``device`` (sized as for device ``sizes_for``
    when given: the GPU's cases drawn on the CPU, for scripts/fuzz_precompile.py)."""
    name = p["name"]
    lead = [_size(rng, c, tiny) for c in p["lead"]]
    trail = [_size(rng, c, tiny) for c in p["trail"]]
    feat = [_size(rng, c, tiny) for c in p["feat"]]
    T = _T(rng, p)
    if not tiny and rng.random() < 0.02:  # T = 0 or a batch axis of 0
        if lead and rng.random() < 0.5:
            lead[0] = 0
        else:
            T = 0
    # keep a long stream's batch small (the oracle loops over T)
    budget = 20_000 if (sizes_for or device) != "cuda" else 200_000
    while math.prod(lead + trail + feat) * max(T, 1) > budget:
        big = max(range(len(lead + trail + feat)), key=lambda i: (lead + trail + feat)[i])
        dims = lead + trail + feat
        dims[big] = max(1, dims[big] // 2) if dims[big] != 16 else 1
        lead, trail, feat = (dims[:len(lead)], dims[len(lead):len(lead) + len(trail)],
                             dims[len(lead) + len(trail):])
    pos = p["pos"]
    step_shape = tuple(lead) + (T,) + tuple(trail)
    shape = step_shape + tuple(feat)
    td = pos if rng.random() < 0.5 else pos - len(shape)
    d = _Draw(rng, gen, p, device)
    desc = (f"{name} shape={shape} time_dim={td} dtype={str(p['dtype'])[6:]} "
            f"views={ {k: v['kind'] for k, v in p['views'].items()} } "
            f"coefs={ {k: c['mode'] for k, c in p['coefs'].items()} } "
            f"out={None if p['out'] is None else p['out']['view']['kind']}")
    builder = {"linear_recurrence": _linrec, "retrace_from_actions": _rfa}.get(
        name, _forward if name in FORWARD else _returns)
    return builder(p, d, shape, step_shape, pos, td, T, desc)


def _out_tensors(p, d, shape, n_out):
    o = p["out"]
    if o is None:
        return None, [p["dtype"]] * n_out
    dtype = p["dtype"] if o["dtype"] == "same" else o["dtype"]
    outs = []
    for _ in range(n_out):
        base = torch.full(shape, float("nan"), dtype=dtype)
        outs.append(_materialize(base, o["view"], d.device))
    return (tuple(outs) if n_out == 2 else outs[0]), [dtype] * n_out


def _returns(p, d, shape, step_shape, pos, td, T, desc):
    name = p["name"]
    kw, rk = {}, {}  # library / oracle keyword arguments
    inputs = []

    def data(role, **k):
        t, v = d.data(shape, role, **k)
        inputs.append(t)
        return t, v

    args, rargs = [], []
    if name in ("vtrace", "retrace"):
        t, v = data("log_rhos", scale=0.7)
        args.append(t), rargs.append(v)
    t, v = data("rewards")
    args.append(t), rargs.append(v)
    if name == "retrace":
        for role in ("q", "e"):
            t, v = data(role)
            args.append(t), rargs.append(v)
    elif name != "discounted_returns":
        t, v = data("values")
        if p.get("values_none"):
            t, v = None, torch.zeros(shape, dtype=F64)
            inputs.pop()
        args.append(t), rargs.append(v)
    term, term_v = d.flag(shape)
    args.append(term), rargs.append(term_v.expand(shape))
    inputs.append(term)
    if p["trunc"]:
        tr, tr_v = d.flag(shape)
        inputs.append(tr)
        args.append(tr), rargs.append(tr_v.expand(shape))
    else:
        args.append(None), rargs.append(None)
    vmode = p.get("vmode")
    if vmode == "next_values":
        t, v = data("next_values")
        kw["next_values"], rk["next_values"] = t, v
    elif vmode == "bootstrap":
        nshape = step_shape[:pos] + step_shape[pos + 1:]
        t, v = d.notime(nshape, p["boot_bcast"], "boot")
        inputs.append(t)
        kw["bootstrap_value"], rk["bootstrap_value"] = t, v.expand(nshape)
    for c in p["coefs"]:
        kw[c], rk[c] = d.coef(c, shape, pos)
    n_out = _n_out(name)
    out, out_dtypes = _out_tensors(p, d, shape, n_out)
    if out is not None:
        kw["out"] = out
    fn = getattr(rc, name)

    def call():
        return fn(*args, **kw, time_dim=td)

    oracle = lambda: fast_reference(name, rargs, rk, td)  # noqa: E731
    slow = lambda: getattr(ref, name)(*rargs, **rk, time_dim=td)  # noqa: E731
    return Case(desc, call, oracle, slow, out_dtypes, inputs, out, T)


def _forward(p, d, shape, step_shape, pos, td, T, desc):
    name = p["name"]
    x, xv = d.data(shape, "x")
    done, done_v = d.flag(step_shape, "done")
    # done is x's shape without the features: a broadcast done keeps its axes (size 1)
    if done.dim() < len(step_shape):
        k = len(step_shape) - done.dim()
        done, done_v = done.reshape((1,) * k + tuple(done.shape)), done_v.reshape(
            (1,) * k + tuple(done_v.shape))
    inputs = [x, done]
    kw, rk = {}, {}
    if p["init"] != "none":
        nshape = shape[:pos] + shape[pos + 1:]
        pat = p["init_bcast"] if p["init"] == "bcast" else {"ones": [False] * len(nshape),
                                                             "drop": 0}
        t, v = d.notime(nshape, pat, "init")
        inputs.append(t)
        kw["init"], rk["init"] = t, v.expand(nshape)
    for c in p["coefs"]:  # broadcastable to done's full shape (x's without the features)
        kw[c], rk[c] = d.coef(c, shape, pos, done_shape=tuple(step_shape))
    out, out_dtypes = _out_tensors(p, d, shape, 1)
    if out is not None:
        kw["out"] = out
    fn = getattr(rc, name)
    rargs = [xv, done_v]  # the reference broadcasts done as the library does
    return Case(desc, lambda: fn(x, done, **kw, time_dim=td),
                lambda: fast_reference(name, rargs, rk, td),
                lambda: getattr(ref, name)(*rargs, **rk, time_dim=td), out_dtypes, inputs,
                out, T)


def _linrec(p, d, shape, step_shape, pos, td, T, desc):
    a, av = d.data(shape, "alpha")
    if p["beta"] == "full":
        b, bv = d.data(shape, "beta", lo=-1.0, hi=1.0)
    else:
        pat = p["beta_bcast"]
        bshape = [1 if one else s for s, one in zip(shape, pat["ones"])][pat["drop"]:]
        b, bv = d.data(bshape, "beta", lo=-1.0, hi=1.0)
    inputs = [a, b]
    kw, rk = {"reverse": p["reverse"]}, {"reverse": p["reverse"]}
    if p["init"] != "none":
        nshape = shape[:pos] + shape[pos + 1:]
        pat = p["init_bcast"] if p["init"] == "bcast" else {"ones": [False] * len(nshape),
                                                             "drop": 0}
        t, v = d.notime(nshape, pat, "init")
        inputs.append(t)
        kw["init"], rk["init"] = t, v.expand(nshape)
    out, out_dtypes = _out_tensors(p, d, shape, 1)
    if out is not None:
        kw["out"] = out
    rargs = [av, bv.expand(shape)]
    return Case(desc, lambda: rc.linear_recurrence(a, b, **kw, time_dim=td),
                lambda: fast_reference("linear_recurrence", rargs, rk, td),
                lambda: ref.linear_recurrence(*rargs, **rk, time_dim=td), out_dtypes, inputs,
                out, T)


def _rfa(p, d, shape, step_shape, pos, td, T, desc):
    A = _size(d.rng, p["A"])
    ashape = step_shape + (A,)
    dtype = p["dtype"]
    inputs = []

    def probs(role):
        logits = torch.randn(ashape, generator=d.gen, dtype=F64)
        v = _expand_values(torch.softmax(logits, -1).to(dtype), p["views"][role])
        t = _materialize(v, p["views"][role], d.device)
        inputs.append(t)
        return t, v

    q, qv = d.data(ashape, "q")
    inputs.append(q)
    pr, prv = probs("probs")
    av = torch.randint(0, A, step_shape, generator=d.gen).to(p["actions_dtype"])
    av = _expand_values(av, p["views"]["actions"])
    a = _materialize(av, p["views"]["actions"], d.device, poison=0)
    mu, muv = d.data(step_shape, "mu", lo=0.05, hi=0.95)
    mu, muv = mu.log(), muv.log()
    r, rv = d.data(step_shape, "rewards")
    term, term_v = d.flag(step_shape)
    inputs += [a, mu, r, term]
    args = [q, pr, a, mu, r, term]
    rargs = [qv, prv, av, muv, rv, term_v.expand(step_shape)]
    if p["trunc"]:
        tr, tr_v = d.flag(step_shape)
        inputs.append(tr)
        args.append(tr), rargs.append(tr_v.expand(step_shape))
    else:
        args.append(None), rargs.append(None)
    kw, rk = {}, {}
    if p["next_mode"] == "next":
        nq, nqv = d.data(ashape, "next")
        npr, nprv = probs("next")
        inputs.append(nq)
        kw.update(next_q_values=nq, next_target_probs=npr)
        rk.update(next_q_values=nqv, next_target_probs=nprv)
    elif p["next_mode"] == "bootstrap":
        nshape = step_shape[:pos] + step_shape[pos + 1:] + (A,)
        bq, bqv = d.notime(nshape, p["boot_bcast"], "boot")
        bp, bpv = d.notime(nshape, p["boot_bcast"], "boot")
        inputs += [bq, bp]
        kw.update(bootstrap_q_values=bq, bootstrap_target_probs=bp)
        rk.update(bootstrap_q_values=bqv.expand(nshape), bootstrap_target_probs=bpv.expand(nshape))
    for c in p["coefs"]:
        kw[c], rk[c] = d.coef(c, step_shape, pos)
    out, out_dtypes = _out_tensors(p, d, step_shape, 1)
    if out is not None:
        kw["out"] = out

    def pieces():
        """retrace's inputs from the per-action tensors, in float64."""
        q64, p64 = rargs[0].to(F64), rargs[1].to(F64)
        idx = rargs[2].long().unsqueeze(-1)
        q_taken = q64.gather(-1, idx).squeeze(-1)
        log_rhos = p64.gather(-1, idx).squeeze(-1).log() - rargs[3].to(F64)
        if "next_q_values" in rk:
            e = ref.expected_next_q_from_actions(rk["next_target_probs"], rk["next_q_values"])
        else:
            own = ref.expected_next_q_from_actions(p64, q64)
            nshape = step_shape[:pos] + step_shape[pos + 1:]
            if "bootstrap_q_values" in rk:
                eb = ref.expected_next_q_from_actions(rk["bootstrap_target_probs"],
                                                      rk["bootstrap_q_values"])
            else:
                eb = torch.zeros(nshape, dtype=F64)
            e = torch.cat([own.narrow(pos, 1, max(T - 1, 0)), eb.unsqueeze(pos)], pos) \
                if T > 0 else own
        coefs = {c: rk[c] for c in p["coefs"]}
        return [log_rhos, rargs[4], q_taken, e, rargs[5], rargs[6]], coefs

    def oracle():
        a_, k_ = pieces()
        return fast_reference("retrace", a_, k_, td)

    def slow():
        a_, k_ = pieces()
        return ref.retrace(*a_, **k_, time_dim=td)

    return Case(desc, lambda: rc.retrace_from_actions(*args, **kw, time_dim=td), oracle, slow,
                out_dtypes, inputs, out, T)


# ------------------------------------------------------------------- the fast oracle


def _tf(x, shape, pos):
    """float64 numpy [T, N] of ``x`` broadcast to ``shape`` with the time axis ``pos`` first."""
    t = torch.broadcast_to(torch.as_tensor(x, dtype=F64).cpu(), shape).movedim(pos, 0)
    return t.reshape(shape[pos], math.prod(shape[:pos] + shape[pos + 1:])).numpy()


def _scan(a, b, reverse, h0):
    out = np.empty_like(a)
    h = h0.copy()
    steps = range(a.shape[0] - 1, -1, -1) if reverse else range(a.shape[0])
    for t in steps:
        h = a[t] + b[t] * h
        out[t] = h
    return out


def _back(h, shape, pos):
    rest = tuple(shape[:pos]) + tuple(shape[pos + 1:])
    return torch.from_numpy(h).reshape((shape[pos],) + rest).movedim(0, pos).contiguous()


def fast_reference(name, args, kw, time_dim):
    """The estimators of semantics.md in float64: coefficients built with whole-tensor
    ops, then one numpy loop over time for all streams. Arguments as the public
    functions, every tensor of the full shape (flags, bootstrap and init expanded)."""
    if name in FORWARD:
        return _fast_forward(name, args, kw, time_dim)
    if name == "linear_recurrence":
        alpha, beta = args
        shape = tuple(alpha.shape)
        pos = time_dim % len(shape)
        T = shape[pos]
        a, b = _tf(alpha, shape, pos), _tf(beta, shape, pos)
        init = kw.get("init")
        h0 = np.zeros(a.shape[1]) if init is None else \
            init.to(F64).reshape(-1).numpy().copy()
        return _back(_scan(a, b, kw["reverse"], h0) if T else a, shape, pos)
    if name in ("vtrace", "retrace"):
        log_rhos, args = args[0], args[1:]
    if name == "retrace":
        rewards, values, nv_arg, term, trunc = args
        kw = dict(kw, next_values=nv_arg)
    elif name == "discounted_returns":
        rewards, term, trunc = args
        values = torch.zeros(rewards.shape, dtype=F64)
    else:
        rewards, values, term, trunc = args
    shape = tuple(rewards.shape)
    pos = time_dim % len(shape)
    T = shape[pos]
    r, v = _tf(rewards, shape, pos), _tf(values, shape, pos)
    nterm = 1.0 - _tf(term != 0, shape, pos)
    done = 1.0 - nterm
    if trunc is not None:
        done = np.maximum(done, _tf(trunc != 0, shape, pos))
    ndone = 1.0 - done
    nv = kw.get("next_values")
    if nv is not None:
        nv = _tf(nv, shape, pos)
    else:
        nv = np.zeros_like(r)
        if name != "discounted_returns" and T > 1:
            nv[:-1] = v[1:]
        boot = kw.get("bootstrap_value")
        if boot is not None and T > 0:
            nv[-1] = boot.to(F64).reshape(-1).numpy()
    g = _tf(kw.get("gamma", 0.99), shape, pos)
    zero = np.zeros(r.shape[1])
    if T == 0:
        empty = _back(r, shape, pos)
        return (empty, empty.clone()) if _n_out(name) == 2 else empty
    if name in ("gae", "gae_advantages"):
        lam = _tf(kw.get("lmbda", 0.95), shape, pos)
        adv = _scan(r + g * nterm * nv - v, g * lam * ndone, True, zero)
        if name == "gae_advantages":
            return _back(adv, shape, pos)
        return _back(adv, shape, pos), _back(adv + v, shape, pos)
    if name in ("lambda_returns", "discounted_returns"):
        lam = _tf(kw.get("lmbda", 0.95) if name == "lambda_returns" else 1.0, shape, pos)
        c = ndone.copy()
        c[-1] = 0.0
        lc = lam * c
        return _back(_scan(r + g * nterm * (1.0 - lc) * nv, g * nterm * lc, True, zero),
                     shape, pos)
    ratio = np.exp(_tf(log_rhos, shape, pos))
    lam = _tf(kw.get("lmbda", 1.0), shape, pos)
    cb = _tf(kw.get("c_bar", 1.0), shape, pos)
    c = lam * np.minimum(cb, ratio)
    if name == "vtrace":
        rho = np.minimum(_tf(kw.get("rho_bar", 1.0), shape, pos), ratio)
        pg_rho = np.minimum(_tf(kw.get("pg_rho_bar", 1.0), shape, pos), ratio)
        D = _scan(rho * (r + g * nterm * nv - v), g * ndone * c, True, zero)
        vs = v + D
        vs_next = nv.copy()
        if T > 1:
            vs_next[:-1] = np.where(ndone[:-1] > 0, vs[1:], nv[:-1])
        pg = pg_rho * (r + g * nterm * vs_next - v)
        return _back(vs, shape, pos), _back(pg, shape, pos)
    c_next = np.zeros_like(c)
    c_next[:-1] = c[1:]
    D = _scan(r + g * nterm * nv - v, g * ndone * c_next, True, zero)
    return _back(v + D, shape, pos)


def _fast_forward(name, args, kw, time_dim):
    x, done = args
    shape = tuple(x.shape)
    pos = time_dim % len(shape)
    T = shape[pos]
    n_feat = x.dim() - done.dim()
    dshape = shape[:done.dim()]  # done's full shape (a broadcast done is expanded to it)
    done = torch.broadcast_to(torch.as_tensor(done), dshape)
    xs = _tf(x, shape, pos)
    d = _tf((done != 0).to(F64).reshape(dshape + (1,) * n_feat), shape, pos)
    init = kw.get("init")
    h0 = np.zeros(xs.shape[1]) if init is None else init.to(F64).reshape(-1).numpy().copy()
    if T == 0:
        return _back(xs, shape, pos)
    if name == "episodic_cumsum":
        keep = np.ones_like(xs)
        keep[1:] = 1.0 - d[:-1]
        return _back(_scan(xs, keep, False, h0), shape, pos)

    def param(value):
        t = torch.as_tensor(value, dtype=F64)
        try:
            t = torch.broadcast_to(t, dshape).reshape(dshape + (1,) * n_feat)
        except RuntimeError:
            pass
        return _tf(t, shape, pos)

    gl = param(kw.get("gamma", 0.99)) * param(kw.get("lmbda", 0.95))
    decay = np.empty_like(xs)
    decay[0] = gl[0]
    decay[1:] = gl[:-1] * (1.0 - d[:-1])
    return _back(_scan(xs, decay, False, h0), shape, pos)


# ------------------------------------------------------------------------- checking


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def compare(got, want, dtype, ctx, tol=None):
    """``got`` (any device) within tolerance of the float64 ``want`` (NaN fails)."""
    assert isinstance(got, torch.Tensor), f"{ctx}: expected a tensor, got {type(got)}"
    assert tuple(got.shape) == tuple(want.shape), \
        f"{ctx}: shape {tuple(got.shape)}, reference {tuple(want.shape)}"
    if want.numel() == 0:
        return
    tol = TOL[dtype] if tol is None else tol
    g = got.detach().to("cpu", F64)
    scale = max(1.0, float(want.abs().max()))
    err = (g - want).abs()
    bad = ~(err <= tol * scale + tol * want.abs()) & (g != want)  # (inf == inf passes)
    top = torch.finfo(got.dtype).max
    if scale > top:  # the output passes the dtype's range (float32 too: a per-stream gamma
        # above 1 over 2,000 steps passes 3.4e38). There a result rounds to inf; one just
        # inside the range may too, as an intermediate (gamma c G_{t+1} before the terms
        # that bring it back) overflows first (on CUDA: -inf for -2.9e38), and the steps
        # after an inf meet inf - inf: NaN (on CUDA where the reference is -1.3e308)
        bad &= ~((want.abs() > top * 2.0**-10) & ~torch.isfinite(g))
    if bad.any():
        i = int(torch.nonzero(bad.reshape(-1))[0])
        raise AssertionError(
            f"{ctx}: {int(bad.sum())}/{want.numel()} elements off (tol {tol:g} x scale "
            f"{scale:.3g}); first at flat index {i}: got {g.reshape(-1)[i].item()!r}, "
            f"reference {want.reshape(-1)[i].item()!r}; "
            f"max err {float(err.nan_to_num(math.inf).max()):.3g}")


def _snapshot(ts):
    return [None if t is None else t.clone() for t in ts]


def _same(t, b):
    """A 0-dim bool tensor on t's device: t equals its snapshot b (NaN where b has NaN)."""
    if t.is_floating_point():
        return (t.isnan() == b.isnan()).all() & (t.nan_to_num(0.0) == b.nan_to_num(0.0)).all()
    return (t == b).all()


def _all_unchanged(ts, bs):
    """Every input equals its snapshot, with one read back per device: on the GPU each
    read back waits for the GPU, which other processes on it may hold for a while."""
    oks = [_same(t, b) for t, b in zip(ts, bs, strict=True)]
    on_gpu = [o for o in oks if o.device.type != "cpu"]
    return all(bool(o) for o in oks if o.device.type == "cpu") and (
        not on_gpu or bool(torch.stack(on_gpu).all()))


def tolerance(case, dtype, device, long_t_scale=True):
    """TOL of the coarser of the data and output dtypes; float32 on the GPU accumulates
    in float32, so its tolerance grows with T beyond 128 steps."""
    tol = TOL[dtype]
    if device == "cuda" and dtype == torch.float32 and long_t_scale:
        tol *= max(1.0, case.T / 128)
    return tol


def check_case(case: Case, p: dict, ctx: str, device: str, slow_check: bool):
    """Run the library on ``case`` and compare with the oracle (and, if ``slow_check``,
    the oracle with rl_triton_core.reference)."""
    ctx = f"{ctx} {case.desc}"
    before = _snapshot(case.inputs)
    got = case.call()
    assert _all_unchanged(case.inputs, before), f"{ctx}: an input was modified"
    want = _as_tuple(case.oracle())
    if slow_check:
        slow = _as_tuple(case.slow())
        for w, s in zip(want, slow, strict=True):
            compare(w, s.to(F64), torch.float64, f"{ctx}: the fast oracle against reference.py",
                    tol=1e-9)
    got_t = _as_tuple(got)
    assert len(got_t) == len(want), f"{ctx}: {len(got_t)} outputs, expected {len(want)}"
    if case.out is not None:
        outs = _as_tuple(case.out)
        assert all(g is o for g, o in zip(got_t, outs, strict=True)), \
            f"{ctx}: out= given, but other tensors were returned"
    for k, (g, w, dt) in enumerate(zip(got_t, want, case.out_dtypes, strict=True)):
        c = f"{ctx} output {k}"
        assert g.dtype == dt, f"{c}: dtype {g.dtype}, expected {dt}"
        assert g.device.type == device, f"{c}: on {g.device}, expected {device}"
        coarse = p["dtype"] if TOL[p["dtype"]] >= TOL[dt] else dt
        compare(g, w, coarse, c, tolerance(case, coarse, device))


def chunk_cases(name: str, seed: int, n_cases: int, n_profiles: int, device: str,
                tiny: bool = False, chunk: int = 0, on=None, only=None):
    """The cases of a chunk: ``(i, profile, context, case)``, all derived from ``seed``
    and ``chunk``; ``on``: the device the tensors are made on (default ``device``);
    ``only``: just case ``only`` (each case draws from its own seed, so skipping the
    others changes nothing in it; replaying case 583 built 583 GPU-sized cases first)."""
    rng = random.Random(f"{name}/{seed}/{chunk}/{device}/{tiny}")
    profiles = [draw_profile(name, rng, device, tiny) for _ in range(n_profiles)]
    for i in range(n_cases):
        case_seed = rng.randrange(2**62)
        if only is not None and i != only:
            continue
        p = profiles[i % n_profiles]
        crng = random.Random(case_seed)
        gen = torch.Generator().manual_seed(case_seed)
        case = draw_case(p, crng, gen, on or device, tiny, sizes_for=device)
        ctx = (f"[RL_TEST_SEED={seed} chunk={chunk} case={i} profile={i % n_profiles} "
               f"case_seed={case_seed}]")
        yield i, p, ctx, case


def run_chunk(name: str, seed: int, n_cases: int, n_profiles: int, device: str,
              tiny: bool = False, slow_every: int = 16, chunk: int = 0):
    """``n_cases`` random cases of ``name`` over ``n_profiles`` random profiles, all
    derived from ``seed`` and ``chunk`` (printed in every failure message)."""
    for i, p, ctx, case in chunk_cases(name, seed, n_cases, n_profiles, device, tiny, chunk):
        check_case(case, p, ctx, device, slow_check=i % slow_every == 0)
