"""``time_dim`` is a required keyword of every core estimator (and of the float64
reference, which mirrors their signatures): ``gae(r, v, d)`` on time-major ``[T, B]``
data would otherwise scan the environment axis without a word. Omitting it is Python's
own TypeError naming ``time_dim``, raised while binding the arguments: before any torch
op runs, so nothing is allocated and no input is touched."""

import inspect

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rl_triton_core as rc
from rl_triton_core import reference
from rl_triton_core._table import TABLE

ESTIMATORS = tuple(TABLE) + ("retrace_from_actions",)  # every row, and the one on retrace's
B, T, A = 3, 5, 2


def _args(name):
    """Valid positional arguments for ``name`` on CPU, batch-major [B, T] (random, never
    zeros), plus the keyword arguments other than time_dim."""
    g = torch.Generator().manual_seed(0)
    x = lambda *s: torch.randn(*s, generator=g) + 0.5  # noqa: E731
    done = torch.rand(B, T, generator=g) < 0.3
    if name in ("gae", "gae_advantages", "lambda_returns"):
        return (x(B, T), x(B, T), done), {"gamma": 0.9}
    if name == "discounted_returns":
        return (x(B, T), done), {"gamma": 0.9}
    if name == "vtrace":
        return (x(B, T) * 0.1, x(B, T), x(B, T), done), {}
    if name == "retrace":
        return (x(B, T) * 0.1, x(B, T), x(B, T), x(B, T), done), {}
    if name == "retrace_from_actions":
        probs = torch.softmax(x(B, T, A), -1)
        actions = torch.randint(0, A, (B, T), generator=g)
        return (x(B, T, A), probs, actions, torch.full((B, T), 0.5).log(), x(B, T), done), {}
    if name in ("eligibility_traces", "episodic_cumsum"):
        return (x(B, T), done), {}
    if name == "linear_recurrence":
        return (x(B, T), torch.rand(B, T, generator=g)), {}
    raise AssertionError(name)


class _Ops(TorchDispatchMode):
    """Records every aten op dispatched (an allocation, a copy, a kernel)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _public_functions():
    """Every public function of ``rl_triton_core`` that takes a ``time_dim``, and the
    reference loops of the nine estimators (the token-level reference loops are the
    token tests' business). A function may be its C entry (``estimators._entry``): a
    callable that unwraps to the function."""
    found = {}
    for mod, names in ((rc, rc.__all__), (reference, [n for n in ESTIMATORS
                                                     if hasattr(reference, n)])):
        for n in names:
            f = getattr(mod, n)
            if (inspect.isfunction(inspect.unwrap(f))
                    and "time_dim" in inspect.signature(f).parameters):
                found[f"{mod.__name__}.{n}"] = f
    return found


def test_every_estimator_is_covered():
    found = _public_functions()
    assert {f"rl_triton_core.{n}" for n in ESTIMATORS} <= set(found)
    assert {f"rl_triton_core.reference.{n}" for n in ESTIMATORS if n != "retrace_from_actions"} \
        <= set(found)


@pytest.mark.parametrize("qualname", sorted(_public_functions()))
def test_time_dim_is_keyword_only_without_default(qualname):
    p = inspect.signature(_public_functions()[qualname]).parameters["time_dim"]
    assert p.kind is inspect.Parameter.KEYWORD_ONLY, f"{qualname}: time_dim is {p.kind}"
    assert p.default is inspect.Parameter.empty, \
        f"{qualname}: time_dim has a default ({p.default!r}); it must be required"


@pytest.mark.parametrize("module", ["rl_triton_core", "reference"])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_omitting_time_dim_is_a_type_error_before_any_work(name, module, monkeypatch):
    if module == "reference" and name == "retrace_from_actions":
        pytest.skip("the reference has no per-action convenience form")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    fn = getattr(rc if module == "rl_triton_core" else reference, name)
    args, kwargs = _args(name)
    before = [a.clone() for a in args]
    ptrs = [a.data_ptr() for a in args]
    rec = _Ops()
    with rec, pytest.raises(TypeError, match="time_dim"):
        fn(*args, **kwargs)
    assert rec.ops == [], f"{name}: torch ops ran before the TypeError: {rec.ops[:5]}"
    for a, b, p in zip(args, before, ptrs):
        assert a.data_ptr() == p and torch.equal(a, b)  # inputs untouched
    # the same call with the time axis named runs (time_dim was all that was missing), and
    # the recorder does see its ops
    ran = _Ops()
    with ran:
        fn(*args, **kwargs, time_dim=-1)
    assert ran.ops


@pytest.mark.parametrize("name", ESTIMATORS)
def test_time_dim_none_is_a_type_error(name, monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    args, kwargs = _args(name)
    with pytest.raises(TypeError, match="time_dim"):
        getattr(rc, name)(*args, **kwargs, time_dim=None)


def test_time_major_needs_time_dim_0(monkeypatch):
    """The case the requirement exists for: [T, B] data with time_dim=0 gives the
    transposed result of [B, T] data with time_dim=-1."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    (r, v, d), kw = _args("gae")
    adv_bt, tgt_bt = rc.gae(r, v, d, **kw, time_dim=-1)
    adv_tb, tgt_tb = rc.gae(r.T, v.T, d.T, **kw, time_dim=0)
    torch.testing.assert_close(adv_tb, adv_bt.T)
    torch.testing.assert_close(tgt_tb, tgt_bt.T)
    wrong, _ = rc.gae(r.T, v.T, d.T, **kw, time_dim=-1)  # the scan over the env axis
    assert not torch.allclose(wrong, adv_bt.T)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_custom_op_schema_requires_time_dim(name):
    """The torch.compile path's custom ops take time_dim without a default."""
    from rl_triton_core.scan import _ops  # noqa: F401  (registers the ops)

    schema = getattr(torch.ops.rl_triton_core, name).default._schema
    (arg,) = [a for a in schema.arguments if a.name == "time_dim"]
    assert not arg.has_default_value(), f"rl_triton_core::{name}: time_dim has a default"


def test_torch_compile_reports_the_missing_time_dim(monkeypatch):
    """Under torch.compile (graph breaks allowed) the call falls back to Python, which
    raises the same TypeError. (With fullgraph=True dynamo raises its own Unsupported
    "failed to bind arguments" error instead; it is an error either way.)"""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    torch._dynamo.reset()
    (r, v, d), kw = _args("gae")
    step = torch.compile(lambda r, v, d: rc.gae(r, v, d, gamma=0.9)[0].sum(), backend="eager")
    with pytest.raises(TypeError, match="time_dim"):
        step(r, v, d)
    with pytest.raises(Exception, match="bind arguments|time_dim"):
        torch.compile(lambda r, v, d: rc.gae(r, v, d), fullgraph=True, backend="eager")(r, v, d)
    torch._dynamo.reset()
