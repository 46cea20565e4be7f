"""Helpers shared by the core tests: random inputs in every layout, and one comparison of a
library call against the float64 reference (dtype, shape, device, fresh output, inputs
untouched, no stray NaN, values within tolerance)."""

from __future__ import annotations

import math

import pytest
import torch

from rl_triton_core._table import TABLE

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# Allowed error, relative to max(1, max |reference|) plus the same relative to |reference|.
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}

FLAG_KINDS = ("bool", "uint8", "float")
# How terminated / truncated relate; 'both' sets both flags on every step.
FLAG_PATTERNS = ("random", "disjoint", "trunc_superset", "no_truncated", "all_done",
                 "none", "both")
# Memory layouts of an input: a view with the same values.
VIEWS = ("contiguous", "transposed", "strided", "strided0")

# the estimators by the validation their table row names: rewards-shaped with
# step-aligned flags (scanned backward in time), and the forward scans
BACKWARD = tuple(n for n, e in TABLE.items() if e.checks == "returns")
FORWARD = tuple(n for n, e in TABLE.items() if e.checks == "forward")


def lib(name: str):
    import rl_triton_core

    return getattr(rl_triton_core, name)


def ref(name: str):
    from rl_triton_core import reference

    return getattr(reference, name)


# ----------------------------------------------------------------------- random data


def randn(gen, shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(tuple(shape), generator=gen, dtype=torch.float64) * scale).to(dtype)


def uniform(gen, shape, lo, hi, dtype=torch.float32):
    u = torch.rand(tuple(shape), generator=gen, dtype=torch.float64)
    return (lo + (hi - lo) * u).to(dtype)


def bernoulli(gen, shape, p):
    return torch.rand(tuple(shape), generator=gen) < p


def as_flag(bits: torch.Tensor, kind: str, dtype) -> torch.Tensor:
    if kind == "bool":
        return bits.clone()
    if kind == "uint8":
        return bits.to(torch.uint8)
    if kind == "float":
        return bits.to(dtype)
    raise AssertionError(kind)


def make_flags(gen, shape, pattern: str, kind: str, dtype, p=0.2):
    """(terminated, truncated-or-None) in ``kind``'s dtype following ``pattern``."""
    term = bernoulli(gen, shape, p)
    trunc = bernoulli(gen, shape, p)
    if pattern == "random":  # independent: some steps have both flags
        pass
    elif pattern == "disjoint":
        trunc &= ~term
    elif pattern == "trunc_superset":  # terminated is a subset of truncated
        trunc |= term
    elif pattern == "no_truncated":
        return as_flag(term, kind, dtype), None
    elif pattern == "all_done":  # every step done, by one flag or the other
        trunc = ~term
    elif pattern == "none":
        term = torch.zeros(tuple(shape), dtype=torch.bool)
        trunc = term.clone()
    elif pattern == "both":
        term = torch.ones(tuple(shape), dtype=torch.bool)
        trunc = term.clone()
    else:
        raise AssertionError(pattern)
    return as_flag(term, kind, dtype), as_flag(trunc, kind, dtype)


def make_done(gen, shape, pattern: str, kind: str, dtype, p=0.2):
    bits = {"random": lambda: bernoulli(gen, shape, p),
            "all_done": lambda: torch.ones(tuple(shape), dtype=torch.bool),
            "none": lambda: torch.zeros(tuple(shape), dtype=torch.bool)}[pattern]()
    return as_flag(bits, kind, dtype)


def make_gamma(gen, shape, mode: str, dtype, lo=0.5, pos=None):
    """gamma / lmbda: a Python float or a tensor (in the data dtype) broadcastable to
    ``shape``. Full tensors contain exact 0s and 1s too."""
    if mode == "float":
        return float(uniform(gen, (), lo, 1.0, torch.float64))
    if mode == "scalar_tensor":
        return uniform(gen, (), lo, 1.0, dtype)
    if mode == "full":
        g = uniform(gen, shape, lo, 1.0, torch.float64)
        flat = g.view(-1)
        if flat.numel() >= 4:
            flat[0], flat[-1] = 1.0, 0.0
            flat[flat.numel() // 2] = 1.0
        return g.to(dtype)
    if mode == "per_step":  # varies along time only: other axes 1, leading 1s dropped
        gshape = [s if i == pos else 1 for i, s in enumerate(shape)]
        return uniform(gen, gshape[pos:], lo, 1.0, dtype)
    if mode == "per_stream":  # constant over time
        gshape = [1 if i == pos else s for i, s in enumerate(shape)]
        return uniform(gen, gshape, lo, 1.0, dtype)
    raise AssertionError(mode)


GAMMA_MODES = ("float", "full", "per_step", "per_stream", "scalar_tensor")


def make_threshold(gen, shape, mode, dtype, pos=None):
    """A clip threshold (rho_bar, c_bar, pg_rho_bar) in [1, 2] (x2 is exact in any dtype),
    or [0.5, 1] for about half the elements of a full tensor."""
    t = make_gamma(gen, shape, mode, dtype, lo=0.5, pos=pos)
    if isinstance(t, float):
        return 2.0 * t
    if mode == "full":
        return torch.where(bernoulli(gen, t.shape, 0.5), t, 2 * t)
    return 2 * t


def place(x: torch.Tensor, view: str, device) -> torch.Tensor:
    """``x``'s values on ``device`` in the memory layout ``view``. Strided views leave
    poison (NaN, or a set flag) in the skipped elements, so reading them shows."""
    x = x.to(device)
    if view == "contiguous" or x.dim() == 0:
        return x.clone()
    if view == "transposed" and x.dim() >= 2:
        return x.transpose(0, -1).contiguous().transpose(0, -1)
    poison = float("nan") if x.is_floating_point() else 1
    axis = 0 if view == "strided0" else -1
    shape = list(x.shape)
    shape[axis] *= 2
    buf = torch.full(shape, poison, dtype=x.dtype, device=device)
    idx = [slice(None)] * x.dim()
    idx[axis] = slice(None, None, 2)
    buf[tuple(idx)] = x
    return buf[tuple(idx)]


def drop_axis(shape, pos):
    return tuple(shape[:pos]) + tuple(shape[pos + 1:])


# ------------------------------------------------------------------------ comparison


def _tensors(args, kwargs):
    return [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]


def cpu(x):
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


def assert_close_to_ref(got, expected, dtype, ctx="", allow_empty=False, mask=None):
    """``got`` (any device, ``dtype``) against a float64 ``expected`` (CPU).
    ``mask`` selects the elements compared (default all)."""
    assert isinstance(got, torch.Tensor), f"{ctx}: expected a tensor, got {type(got)}"
    assert got.dtype == dtype, f"{ctx}: output dtype {got.dtype}, expected {dtype}"
    assert tuple(got.shape) == tuple(expected.shape), \
        f"{ctx}: output shape {tuple(got.shape)}, reference {tuple(expected.shape)}"
    if not allow_empty:
        assert expected.numel() > 0, f"{ctx}: nothing compared"
    g = got.detach().cpu().to(torch.float64)
    e = expected
    if mask is not None:
        g, e = g[mask], e[mask]
        assert allow_empty or e.numel() > 0, f"{ctx}: mask selects nothing"
    if e.numel() == 0:
        return
    tol = TOL[dtype]
    scale = max(1.0, float(e.abs().max()))
    err = (g - e).abs()
    bound = tol * scale + tol * e.abs()
    bad = ~(err <= bound)  # NaN counts as bad
    if bad.any():
        i = int(torch.nonzero(bad.reshape(-1))[0])
        raise AssertionError(
            f"{ctx}: {int(bad.sum())}/{e.numel()} elements off (tol {tol:g} x scale "
            f"{scale:.3g}); first at flat index {i}: got {g.reshape(-1)[i].item()!r}, "
            f"reference {e.reshape(-1)[i].item()!r}; "
            f"max err {float(err.nan_to_num(math.inf).max()):.3g}")


def run_case(name, args, kwargs, *, impl, dtype, seed, ctx="", check_nonzero=True):
    """Call ``rl_triton_core.<name>`` on the impl's tensors and compare every output with
    ``reference.<name>`` on CPU copies. Returns the library's outputs (as a tuple)."""
    ctx = f"{name} [{impl.name}, seed={seed}] {ctx}"
    inputs = _tensors(args, kwargs)
    before = [t.clone() for t in inputs]
    got = lib(name)(*args, **kwargs)
    for t, b in zip(inputs, before, strict=True):
        assert torch.equal(t.isnan(), b.isnan()) and torch.equal(
            t.nan_to_num(0.0) if t.is_floating_point() else t,
            b.nan_to_num(0.0) if b.is_floating_point() else b), f"{ctx}: an input was modified"
    expected = ref(name)(*[cpu(a) for a in args], **{k: cpu(v) for k, v in kwargs.items()})
    got_t = got if isinstance(got, tuple) else (got,)
    exp_t = expected if isinstance(expected, tuple) else (expected,)
    assert len(got_t) == len(exp_t), f"{ctx}: {len(got_t)} outputs, expected {len(exp_t)}"
    finite_inputs = all(torch.isfinite(t).all() for t in inputs if t.is_floating_point())
    for k, (g, e) in enumerate(zip(got_t, exp_t, strict=True)):
        c = f"{ctx} output {k}"
        assert isinstance(g, torch.Tensor), f"{c}: not a tensor"
        assert g.device.type == impl.device.type, f"{c}: on {g.device}, inputs on {impl.device}"
        if g.numel():
            for t in inputs:
                if t.numel():
                    assert g.untyped_storage().data_ptr() != t.untyped_storage().data_ptr(), \
                        f"{c}: output shares memory with an input"
            if finite_inputs:
                assert torch.isfinite(g).all(), f"{c}: non-finite output from finite inputs"
        if check_nonzero and e.numel():
            assert e.abs().max() > 0, f"{c}: degenerate case (reference all zero)"
        assert_close_to_ref(g, e, dtype, c, allow_empty=e.numel() == 0)
    return got_t


def full_path(monkeypatch, fn):
    """``fn()`` on the checked full path: no plan recorded or replayed (the CPU's C
    replay finds an empty plan cache too)."""
    from rl_triton_core.scan import _dispatch

    with monkeypatch.context() as m:
        m.setattr(_dispatch, "_PLANS", {})
        m.setattr(_dispatch, "_store", lambda key, plan: None)
        return fn()


def python_plans():
    """The Python path's recorded plans (``_dispatch._PLANS`` also holds the C replay's
    records, under bytes keys)."""
    from rl_triton_core.scan import _dispatch

    return [p for k, p in _dispatch._PLANS.items() if type(k) is not bytes]


def spy_launch_consts(monkeypatch):
    """A list that collects the constexprs of every kernel each ``_launch.launch`` call
    starts (one dict per phase), from now on."""
    from rl_triton_core.scan import _launch

    seen = []
    real = _launch.launch

    def spy(*a, **k):
        res = real(*a, **k)
        seen.extend(c for _, _, c in res[3])
        return res

    monkeypatch.setattr(_launch, "launch", spy)
    return seen


def spy_c_replay(monkeypatch, sink):
    """Append each result of the C replay that is not None (a replayed call, CPU or
    CUDA) to ``sink`` (anything with ``append``); a no-op where the C replay is not
    available. Both ways in are spied: the estimators' (``estimators._replay``, bound
    at import) and the token estimators' (``_cpu_c.replay``, read at each call)."""
    from rl_triton_core import estimators
    from rl_triton_core.scan import _cpu_c

    real = estimators._replay
    if real is None:
        return

    def spy(*a):
        res = real(*a)
        if res is not None:
            sink.append(res)
        return res

    monkeypatch.setattr(estimators, "_replay", spy)
    monkeypatch.setattr(_cpu_c, "replay", spy)


@pytest.fixture(autouse=True, params=["C++", "DLPack"])
def torch_ext(request):
    """Every test of a module that imports this fixture twice: the C replay reading
    tensors and making its CPU outputs through torch's C++ API (``_torchalloc``'s
    extension, built here where it is not cached; skipped where it cannot be), and
    through DLPack and attribute reads."""
    from rl_triton_core.scan import _torchalloc

    if request.param == "C++":
        if not _torchalloc.ensure(wait=True):
            pytest.skip(f"torch's C++ API extension: {_torchalloc.state}")
        _torchalloc.use(True)
    else:
        _torchalloc.use(False)
    yield request.param
    _torchalloc.use(_torchalloc.state == "loaded")


HELD_MAX = 16 + 4  # blocks the cache holds (_ctoken's POOL_MAX) and the replay (KEPT)


def held_blocks(blocks) -> int:
    """Freed output blocks held for later calls: the block cache's (``blocks``: the
    ``_ctoken`` module) and those the C replay keeps itself."""
    from rl_triton_core.scan import _cpu_c

    kept = getattr(_cpu_c._cscan, "kept_blocks", None)
    return blocks.cache_info()["blocks"] + (kept() if kept else 0)
