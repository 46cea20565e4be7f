"""The benchmark harness: a setup per estimator, one shared timing harness, one run loop.

Each estimator is a :class:`Spec`: how to call it on a case (the same function for the
library, the float64 reference and the library's CPU path), which full-size and
per-stream inputs it reads and how many outputs it writes. From that the harness
derives the bytes the estimator must move, the floor kernel's arguments and the
reference check, and hands closures to :func:`measure`.

Per case (estimator, shape, layout, truncation), for ``ours`` and each peer:

1. one call checked against the float64 reference (``rl_triton_core.reference`` where
   N*T <= ``REF_LOOP_MAX``, else the library's CPU path on float64 CPU inputs); a row
   whose max abs error exceeds ``RTOL * max|reference|`` is marked and not timed;
2. full call: ``torch.cuda.synchronize()``, CUDA events around one Python call (median);
3. back-to-back: k calls between two events, / k (median of rounds);
4. device time: K calls captured in one CUDA graph (after a warm-up on a side stream),
   replayed between events, / K (median of replays);
5. GB/s = bytes the estimator must move (each input read once in its dtype, each
   output written once) / device time;
6. peak extra memory of one call (``max_memory_allocated`` minus what was allocated
   before the call: so the outputs are included; ``out_mb`` says how much they are).

Repetition counts adapt to the cost of a call (``target_ms`` of work per measurement).
Inputs are reused across repetitions, so small problems sit in L2: the same holds for
the floor, which is what the ratios compare against.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

# (N streams, T steps)
SHAPES = ((4096, 128), (512, 128), (32768, 32), (16384, 16), (256, 1024), (16384, 512),
          (1024, 4096), (65536, 1024), (16, 131072), (1, 1_000_000))
QUICK_SHAPES = ((4096, 128), (16384, 512), (16, 131072))
SMOKE_SHAPES = ((3, 17), (2, 64))
LAYOUTS = ("batch", "time")  # [N, T] with time_dim=-1 / [T, N] with time_dim=0
TRUNCS = ("none", "flags")  # truncated=None / a random flag tensor; "-" for estimators without
GAMMA, LMBDA = 0.99, 0.95
P_TERMINATED = P_TRUNCATED = 0.01
RTOL = 1e-4  # float32: allowed max abs error relative to max |reference|
REF_LOOP_MAX = 200_000  # N*T up to which the Python-loop reference is used
GRAPH_CHUNK_US = 1000.0  # aim for this much work per graph replay (K calls per graph)


# --------------------------------------------------------------------------- the estimators


def _next(d) -> dict:
    """V' as the case gives it: explicit ``next_values`` or shifted + ``bootstrap_value``."""
    if d.nv_mode == "explicit":
        return {"next_values": d.next_values}
    return {"bootstrap_value": d.bootstrap}


def _next_actions(d) -> dict:
    """The next state's per-action tensors for ``retrace_from_actions``: explicit, or the
    rows shifted by one step + the bootstrap rows ``[N, A]``."""
    if d.nv_mode == "explicit":
        return {"next_q_values": d.next_q_actions, "next_target_probs": d.next_target_probs}
    return {"bootstrap_q_values": d.bootstrap_q_values,
            "bootstrap_target_probs": d.bootstrap_target_probs}


def _retrace_from_actions_reference(oracle, d):
    """retrace_from_actions from the float64 reference's pieces (batch-major inputs):
    Q_t and log rho_t gathered at a_t, E_t = sum_a pi(a|s_{t+1}) Q(s_{t+1}, a)."""
    a = d.actions.unsqueeze(-1)
    q, p = d.q_actions, d.target_probs
    Q = q.gather(-1, a).squeeze(-1)
    log_rho = p.gather(-1, a).squeeze(-1).log() - d.behaviour_log_probs
    if d.nv_mode == "explicit":
        E = oracle.expected_next_q_from_actions(d.next_target_probs, d.next_q_actions)
    else:
        E_all = oracle.expected_next_q_from_actions(p, q)
        boot = oracle.expected_next_q_from_actions(d.bootstrap_target_probs,
                                                   d.bootstrap_q_values)
        E = torch.cat([E_all[:, 1:], boot[:, None]], dim=1)
    return oracle.retrace(log_rho, d.rewards, Q, E, d.terminated, d.truncated,
                          gamma=d.gamma, time_dim=-1)


@dataclass(frozen=True)
class Spec:
    """How to benchmark one estimator: how to call it on a case ``d`` (a :class:`View`)
    with a module (the library or the float64 reference), and what it reads."""

    name: str
    call: Callable  # (module, View) -> output or tuple of outputs
    data: tuple  # per-step data inputs ([N, T] / [T, N])
    flags: tuple  # per-step flags ("truncated" only in the "flags" cases)
    n_out: int
    next_values: str | None = None  # None, "values" or "actions": what V' comes from
    wide: tuple = ()  # per-action inputs ([N, T, A] / [T, N, A])
    ref_call: Callable | None = None  # (reference module, View) when it lacks the function
    max_numel: int | None = None  # skip cases whose largest input has more elements

    @property
    def truncs(self) -> tuple:
        return TRUNCS if "truncated" in self.flags else ("-",)

    def inputs(self, trunc: str, nv_mode: str) -> tuple:
        """(per-step, per-action, per-stream) input names of a case."""
        narrow = list(self.data) + [f for f in self.flags
                                    if f != "truncated" or trunc == "flags"]
        wide = list(self.wide)
        stream = []
        if self.next_values == "values":
            if nv_mode == "explicit":
                narrow.append("next_values")
            else:
                stream.append("bootstrap")
        elif self.next_values == "actions":
            if nv_mode == "explicit":
                wide += ["next_q_actions", "next_target_probs"]
            else:
                stream += ["bootstrap_q_values", "bootstrap_target_probs"]
        return narrow, wide, stream

    def skip_reason(self, N, T, A) -> str | None:
        numel = N * T * (A if self.wide else 1)
        if self.max_numel and numel > self.max_numel:
            return f"skipped: {numel} elements per input > {self.max_numel} (memory)"
        return None


SPECS = {
    s.name: s
    for s in (
        Spec("gae", lambda m, d: m.gae(
            d.rewards, d.values, d.terminated, d.truncated, **_next(d), gamma=d.gamma,
            lmbda=d.lmbda, time_dim=d.time_dim),
            ("rewards", "values"), ("terminated", "truncated"), 2, "values"),
        Spec("gae_advantages", lambda m, d: m.gae_advantages(
            d.rewards, d.values, d.terminated, d.truncated, **_next(d), gamma=d.gamma,
            lmbda=d.lmbda, time_dim=d.time_dim),
            ("rewards", "values"), ("terminated", "truncated"), 1, "values"),
        Spec("lambda_returns", lambda m, d: m.lambda_returns(
            d.rewards, d.values, d.terminated, d.truncated, **_next(d), gamma=d.gamma,
            lmbda=d.lmbda, time_dim=d.time_dim),
            ("rewards", "values"), ("terminated", "truncated"), 1, "values"),
        Spec("discounted_returns", lambda m, d: m.discounted_returns(
            d.rewards, d.terminated, d.truncated, **_next(d), gamma=d.gamma,
            time_dim=d.time_dim),
            ("rewards",), ("terminated", "truncated"), 1, "values"),
        Spec("vtrace", lambda m, d: m.vtrace(
            d.log_rhos, d.rewards, d.values, d.terminated, d.truncated, **_next(d),
            gamma=d.gamma, time_dim=d.time_dim),
            ("log_rhos", "rewards", "values"), ("terminated", "truncated"), 2, "values"),
        Spec("retrace", lambda m, d: m.retrace(
            d.log_rhos, d.rewards, d.q_values, d.expected_next_q, d.terminated, d.truncated,
            gamma=d.gamma, time_dim=d.time_dim),
            ("log_rhos", "rewards", "q_values", "expected_next_q"),
            ("terminated", "truncated"), 1),
        Spec("retrace_from_actions", lambda m, d: m.retrace_from_actions(
            d.q_actions, d.target_probs, d.actions, d.behaviour_log_probs, d.rewards,
            d.terminated, d.truncated, **_next_actions(d), gamma=d.gamma,
            time_dim=d.time_dim),
            ("actions", "behaviour_log_probs", "rewards"), ("terminated", "truncated"), 1,
            "actions", wide=("q_actions", "target_probs"),
            ref_call=_retrace_from_actions_reference, max_numel=1 << 27),
        Spec("eligibility_traces", lambda m, d: m.eligibility_traces(
            d.x, d.done, gamma=d.gamma, lmbda=d.lmbda, time_dim=d.time_dim),
            ("x",), ("done",), 1),
        Spec("episodic_cumsum", lambda m, d: m.episodic_cumsum(d.x, d.done, time_dim=d.time_dim),
             ("x",), ("done",), 1),
        Spec("linear_recurrence", lambda m, d: m.linear_recurrence(
            d.alpha, d.beta, time_dim=d.time_dim),
            ("alpha", "beta"), (), 1),
    )
}


def available_estimators() -> list:
    """The estimators this install of rl_triton_core has (V-trace/Retrace when present)."""
    import rl_triton_core

    return [name for name in SPECS if hasattr(rl_triton_core, name)]


# ----------------------------------------------------------------------------- input data

# Inputs that hold the same kind of data share one tensor (no estimator reads two of them).
ALIASES = {"x": "rewards", "alpha": "rewards", "q_values": "values",
           "expected_next_q": "next_values", "done": "terminated"}
PER_STREAM = ("bootstrap", "bootstrap_q_values", "bootstrap_target_probs")
PER_ACTION = ("q_actions", "target_probs", "next_q_actions", "next_target_probs",
              "bootstrap_q_values", "bootstrap_target_probs")


class Data:
    """Random inputs of one shape, made on first use: float32 data, bool flags, int64
    actions.

    Batch-major tensors are ``[N, T]`` (``[N, T, A]`` per action); the time-major copy
    of each is ``[T, N]`` (``[T, N, A]``) contiguous, with the same values, so one
    reference serves both layouts; per-stream tensors (``bootstrap``: ``[N]``,
    ``bootstrap_q_values``: ``[N, A]``) are the same in both.
    """

    def __init__(self, N: int, T: int, device, seed: int, actions: int = 8):
        self.N, self.T, self.A = N, T, actions
        self.device = torch.device(device)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self._batch: dict = {}
        self._time: dict = {}
        self._cpu64: dict = {}

    def _make(self, name):
        shape = (self.N,) if name in PER_STREAM else (self.N, self.T)
        if name in PER_ACTION:
            shape += (self.A,)
        kw = dict(generator=self.gen, device=self.device)
        if name == "terminated":
            return torch.rand(shape, **kw) < P_TERMINATED
        if name == "truncated":
            return torch.rand(shape, **kw) < P_TRUNCATED
        if name == "beta":
            return 0.5 + 0.5 * torch.rand(shape, **kw)
        if name == "log_rhos":
            return 0.5 * torch.randn(shape, **kw)
        if name == "actions":
            return torch.randint(0, self.A, shape, **kw)
        if name == "behaviour_log_probs":
            return (0.05 + 0.95 * torch.rand(shape, **kw)).log()
        if name.endswith("target_probs"):
            return torch.randn(shape, **kw).softmax(-1)
        return torch.randn(shape, **kw)

    def batch(self, name):
        name = ALIASES.get(name, name)
        if name not in self._batch:
            self._batch[name] = self._make(name)
        return self._batch[name]

    def get(self, name, layout: str):
        name = ALIASES.get(name, name)
        if layout == "batch" or name in PER_STREAM:
            return self.batch(name)
        if name not in self._time:
            self._time[name] = self.batch(name).transpose(0, 1).contiguous()
        return self._time[name]

    def cpu64(self, name):
        """The batch-major tensor on the CPU, float64 (flags and actions keep their
        dtype): a reference input."""
        name = ALIASES.get(name, name)
        if name not in self._cpu64:
            t = self.batch(name).cpu()
            self._cpu64[name] = t.double() if t.is_floating_point() else t
        return self._cpu64[name]


class View:
    """One case's arguments: ``d.rewards`` etc. in the case's layout (``truncated`` is
    None without truncations, ``next_values`` None unless passed explicitly)."""

    def __init__(self, data: Data, layout: str, trunc: str, nv_mode: str, cpu64=False):
        self.data, self.layout, self.trunc, self.nv_mode = data, layout, trunc, nv_mode
        self.cpu64 = cpu64
        self.N, self.T = data.N, data.T
        self.time_dim = 0 if layout == "time" else -1
        self.shape = (data.T, data.N) if layout == "time" else (data.N, data.T)
        self.gamma, self.lmbda = GAMMA, LMBDA

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name == "truncated" and self.trunc != "flags":
            return None
        if name == "next_values" and self.nv_mode != "explicit":
            return None
        if self.cpu64:
            return self.data.cpu64(name)
        return self.data.get(name, self.layout)


class _Recorder:
    """Reads a View and remembers what was read."""

    def __init__(self, view):
        self._view = view
        self._seen = {}

    def __getattr__(self, name):
        value = getattr(self._view, name)
        self._seen[name] = value
        return value


class _NoCall:
    """A module whose every function does nothing: lets a Spec's call run dry."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def bind(spec: Spec, d: View) -> types.SimpleNamespace:
    """The attributes ``spec.call`` reads from ``d``, looked up once: the timed closure
    then reads plain attributes (no per-call lookups that the floor would not pay)."""
    rec = _Recorder(d)
    spec.call(_NoCall(), rec)
    return types.SimpleNamespace(**rec._seen)


# ------------------------------------------------------------------------ the reference


@contextlib.contextmanager
def backend(name: str):
    """RL_TRITON_CORE_BACKEND=name for the calls inside (the library reads it per call)."""
    key = "RL_TRITON_CORE_BACKEND"
    old = os.environ.get(key)
    os.environ[key] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def _outs(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def reference(spec: Spec, data: Data, trunc: str, nv_mode: str):
    """float64 outputs (batch-major, on the data's device) and which oracle made them."""
    d = View(data, "batch", trunc, nv_mode, cpu64=True)
    if data.N * data.T <= REF_LOOP_MAX:
        from rl_triton_core import reference as oracle

        outs, how = _outs((spec.ref_call or spec.call)(oracle, d)), "reference"
    else:
        import rl_triton_core

        with backend("cpu"):
            outs, how = _outs(spec.call(rl_triton_core, d)), "cpu path (float64)"
    return [o.to(data.device) for o in outs], how


def compare(out, refs, layout: str, shape) -> tuple:
    """(max abs error, tolerance, ok) of ``out`` (in the case's layout) against ``refs``."""
    outs = _outs(out)
    if len(outs) != len(refs):
        return math.inf, 0.0, False
    err = 0.0
    scale = 0.0
    for o, r in zip(outs, refs, strict=True):
        o = o.reshape(shape)
        if layout == "time":
            o = o.t()
        e = (o.double() - r).abs().max().item()
        err = max(err, math.inf if math.isnan(e) else e)
        scale = max(scale, r.abs().max().item())
    tol = RTOL * max(scale, 1e-6)
    return err, tol, err <= tol


# ----------------------------------------------------------------------------- timing


def _clamp(x, lo, hi):
    return int(max(lo, min(hi, x)))


def _median(xs):
    return float(statistics.median(xs))


class Timer:
    """Times closures on CUDA (events, CUDA graphs, memory stats) or, in the CPU smoke
    mode, with ``time.perf_counter`` (no device time, no memory)."""

    def __init__(self, device, target_ms: float):
        self.cuda = torch.device(device).type == "cuda"
        self.target_s = target_ms / 1e3

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def measure(self, fn, graph: bool) -> dict:
        res = {}
        fn()  # warm-up (the checked call before this one compiled whatever compiles)
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        est = time.perf_counter() - t0  # max(host, device) per call, seconds
        if est < 1e-3:
            t0 = time.perf_counter()
            for _ in range(5):
                fn()
            self.sync()
            est = (time.perf_counter() - t0) / 5
        slow = est > 0.02
        full_reps = _clamp(self.target_s / (est + 40e-6), 3, 300)
        rounds = 1 if slow else 3
        k = _clamp(self.target_s / rounds / est, 1, 1000)
        if not self.cuda:
            res["full_us"] = self._cpu_full(fn, full_reps)
            res["b2b_us"] = _median([self._cpu_b2b(fn, k) for _ in range(rounds)])
            return res
        res["full_us"] = self._full(fn, full_reps)
        res["b2b_us"] = _median([self._b2b(fn, k) for _ in range(rounds)])
        if graph:
            try:
                res["device_us"] = self._graph(fn, res["b2b_us"])
            except Exception as e:  # noqa: BLE001 - reported in the row
                res["device_note"] = f"graph capture failed: {type(e).__name__}: {e}"[:200]
                with contextlib.suppress(Exception):
                    torch.cuda.synchronize()
        res.update(self._memory(fn))
        return res

    # -- CPU (smoke mode)
    @staticmethod
    def _cpu_full(fn, reps):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return _median(times)

    @staticmethod
    def _cpu_b2b(fn, k):
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        return (time.perf_counter() - t0) * 1e6 / k

    # -- CUDA
    def _full(self, fn, reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            del out
            times.append(start.elapsed_time(end) * 1e3)
        return _median(times)

    def _b2b(self, fn, k):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(k):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / k

    def _graph(self, fn, est_us):
        n_calls = _clamp(GRAPH_CHUNK_US / max(est_us, 1.0), 1, 100)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the default stream, as capture wants
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n_calls):
                fn()
        g.replay()
        torch.cuda.synchronize()
        replays = _clamp(self.target_s * 1e6 / (n_calls * est_us), 3, 50)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(replays)]
        for s, e in events:
            s.record()
            g.replay()
            e.record()
        torch.cuda.synchronize()
        per = [s.elapsed_time(e) * 1e3 / n_calls for s, e in events]
        del g
        return _median(per)

    @staticmethod
    def _memory(fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        out_bytes = sum(o.numel() * o.element_size() for o in _outs(out))
        del out
        return {"extra_mem_mb": round(peak / 2**20, 3), "out_mb": round(out_bytes / 2**20, 3)}


# ------------------------------------------------------------------------- one implementation

FIELDS = ("estimator", "impl", "shape", "N", "T", "layout", "trunc", "full_us", "b2b_us",
          "device_us", "gbps", "extra_mem_mb", "out_mb", "max_err", "tol", "ok", "note",
          "bytes", "ref")


def bench_impl(timer: Timer, base: dict, impl: str, make, refs, *, check=True) -> dict:
    """One row: ``make()`` returns (fn, graphable, info) or raises peers.Skip; the
    output is checked against ``refs`` (unless ``check`` is False: the floor), then timed."""
    from rl_triton_core.bench.peers import Skip

    rec = dict.fromkeys(FIELDS)
    rec.update(base, impl=impl, ok=False)
    try:
        fn, graphable, info = make()
        rec.update(info)
        out = fn()
        timer.sync()
        if check:
            if refs is None:
                rec["note"] = f"n/a: no reference ({base.get('ref')})"
                return rec
            err, tol, ok = compare(out, refs, base["layout"], base["_shape"])
            rec.update(max_err=err, tol=tol, ok=ok)
            if not ok:
                rec["note"] = f"WRONG: max abs error {err:.3g} > tolerance {tol:.3g}"
                return rec
        else:
            rec["ok"] = True
        del out
        res = timer.measure(fn, graphable)
    except Skip as e:
        rec.update(ok=None, note=f"n/a: {e}")
        return rec
    except Exception as e:  # noqa: BLE001 - one failing peer must not stop the run
        rec.update(ok=False, note=f"n/a: {type(e).__name__}: {e}"[:300])
        with contextlib.suppress(Exception):
            timer.sync()
        return rec
    note = res.pop("device_note", None)
    if note:
        rec["note"] = note
    rec.update(res)
    _set_gbps(rec)
    return rec


def _set_gbps(rec):
    """GB/s of a row: the bytes the estimator must move over its device time."""
    if rec.get("device_us") and rec.get("bytes"):
        rec["gbps"] = round(rec["bytes"] / (rec["device_us"] * 1e-6) / 1e9, 1)


# ------------------------------------------------------------------------------ the run


@dataclass
class Options:
    estimators: list = field(default_factory=list)
    shapes: list = field(default_factory=lambda: list(SHAPES))
    layouts: list = field(default_factory=lambda: list(LAYOUTS))
    truncs: list = field(default_factory=lambda: list(TRUNCS))
    peers: list = field(default_factory=list)  # names from peers.PEERS (the floor always runs)
    floor: bool = True
    all_peers: bool = False
    next_values: str = "shifted"  # or "explicit"
    actions: int = 8  # A of retrace_from_actions' per-action inputs
    target_ms: float = 20.0
    compile_budget_s: float = 120.0
    compile_backend: str = "inductor"  # "eager": dynamo only; "none": no torch.compile
    compile_spent_s: float = 0.0
    device: str = "cuda"
    seed: int = 0
    commit: str | None = None
    progress: bool = True
    deadline_s: float = 0.0  # > 0: stop starting cases after this many seconds
    rounds: int = 1  # > 1: each case's impls measured in turn this many times, medians
    partial_path: str | None = None  # JSON of the rows so far, rewritten after each shape
    rl_triton_src: str | None = None  # rl-triton checkout (else $RL_TRITON_SRC): 2 peers


class _Progress:
    """tqdm when installed, else a line every 10 %."""

    def __init__(self, total, enabled):
        self.bar = None
        self.total, self.n, self.enabled, self.last = total, 0, enabled, -1
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="case", dynamic_ncols=True, file=sys.stderr)
            except ImportError:
                pass

    def update(self, desc):
        self.n += 1
        if self.bar is not None:
            self.bar.set_postfix_str(desc, refresh=False)
            self.bar.update(1)
        elif self.enabled and self.total:
            pct = 10 * self.n // self.total
            if pct != self.last:
                self.last = pct
                print(f"[bench] {self.n}/{self.total} {desc}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


TIMES = ("full_us", "b2b_us", "device_us")


def merge_rounds(recs: list) -> dict:
    """One row from an impl's rounds (``--rounds``): each time the median over the rounds
    that measured it, the rounds' own values kept beside it (``<time>_rounds``); the
    first round's check, unless a later round failed."""
    rec = dict(recs[0])
    if len(recs) == 1:
        return rec
    for key in TIMES:
        vals = [r[key] for r in recs if r.get(key) is not None]
        rec[key] = _median(vals) if vals else None
        rec[f"{key}_rounds"] = [r.get(key) for r in recs]
    _set_gbps(rec)
    if rec["ok"] is not None and any(r["ok"] is False for r in recs):
        rec["ok"] = False  # one failed round fails the row, with its note
        rec["note"] = next(r["note"] for r in recs if r["ok"] is False)
    return rec


def run(opts: Options) -> dict:
    """Runs every case; returns ``{"header": ..., "records": [...]}``."""
    import rl_triton_core
    from rl_triton_core.bench import peers as P

    timer = Timer(opts.device, opts.target_ms)
    specs = [SPECS[name] for name in opts.estimators]
    cases = [(shape, spec, trunc, layout) for shape in opts.shapes for spec in specs
             for trunc in spec.truncs if trunc == "-" or trunc in opts.truncs
             for layout in opts.layouts]
    wall = {}
    t_start = time.perf_counter()

    def clock(key, t0):
        wall[key] = round(wall.get(key, 0.0) + time.perf_counter() - t0, 2)

    header = make_header(opts)
    records = []
    bar = _Progress(len(cases), opts.progress)
    data = None
    refs_key = refs = ref_how = None
    for (N, T), spec, trunc, layout in cases:
        desc = f"{spec.name} {N}x{T} {layout} {trunc}"
        if opts.deadline_s and time.perf_counter() - t_start > opts.deadline_s:
            header["incomplete"] = (f"stopped at its {opts.deadline_s:.0f} s time limit before "
                                    f"{desc} (--deadline-s)")
            print(f"[bench] {header['incomplete']}", file=sys.stderr)
            break
        if data is None or (data.N, data.T) != (N, T):
            if data is not None and opts.partial_path:
                _write_partial(opts.partial_path, header, records)
            data = None
            if timer.cuda:
                torch.cuda.empty_cache()
            data = Data(N, T, opts.device, opts.seed + 1_000_003 * N + T, opts.actions)
        if refs_key != (N, T, spec.name, trunc) and not spec.skip_reason(N, T, opts.actions):
            t0 = time.perf_counter()
            refs_key, refs = (N, T, spec.name, trunc), None
            try:
                refs, ref_how = reference(spec, data, trunc, opts.next_values)
            except Exception as e:  # noqa: BLE001
                ref_how = f"reference failed: {type(e).__name__}: {e}"[:200]
            clock("reference", t0)
        base = dict(estimator=spec.name, shape=f"{N}x{T}", N=N, T=T, layout=layout,
                    trunc=trunc)
        skip = spec.skip_reason(N, T, opts.actions)
        if skip:
            records.append(dict(dict.fromkeys(FIELDS), **base, impl="ours", ok=None,
                                note=f"n/a: {skip}"))
            bar.update(desc)
            continue
        d = View(data, layout, trunc, opts.next_values)
        narrow, wide, stream = (
            [getattr(d, n) for n in names] for names in spec.inputs(trunc, opts.next_values))
        nbytes = sum(t.numel() * t.element_size() for t in narrow + wide + stream)
        nbytes += spec.n_out * N * T * 4  # float32 outputs
        base.update(bytes=nbytes, ref=ref_how, _shape=d.shape)
        if spec.wide:
            base["actions"] = opts.actions

        def ours(call=spec.call, spec=spec, d=d):
            b = bind(spec, d)
            return (lambda: call(rl_triton_core, b)), True, {}

        impls = [("ours", ours, True)]
        if opts.floor:
            impls.append(("floor", lambda nw=narrow, w=wide, st=stream, spec=spec, d=d: (
                P.make_floor(nw, w, st, spec.n_out, d.shape, torch.float32), True, {}), False))
        for peer in opts.peers:
            if spec.name not in P.APPLIES.get(peer, ()):
                continue
            if trunc == "none" and not opts.all_peers:
                continue  # the peers cost the same either way: their time goes to "flags"
            impls.append((peer, lambda peer=peer, spec=spec, d=d: P.make_peer(
                peer, spec.name, d, opts), True))
        rounds = {}
        for _ in range(max(1, opts.rounds)):  # interleaved: every impl once per round
            for impl, make, check in impls:
                t0 = time.perf_counter()
                rec = bench_impl(timer, base, impl, make, refs, check=check)
                rec.pop("_shape", None)
                rounds.setdefault(impl, []).append(rec)
                clock(impl, t0)
        records += [merge_rounds(recs) for recs in rounds.values()]
        bar.update(desc)
    bar.close()
    data = None
    header["wall_s"] = dict(wall, total=round(time.perf_counter() - t_start, 1))
    header["compile_s"] = round(opts.compile_spent_s, 1)
    return {"header": header, "records": records}


def _write_partial(path, header, records):
    import json

    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps({"header": header, "records": records}))


# ------------------------------------------------------------------------------ the header


def git_commit(explicit: str | None = None) -> str:
    """--commit, else $RL_TRITON_COMMIT, else ``git rev-parse`` of this checkout (with
    ``-dirty`` for uncommitted changes to tracked files), else "unknown"."""
    if explicit:
        return explicit
    if os.environ.get("RL_TRITON_COMMIT"):
        return os.environ["RL_TRITON_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10).stdout
        return sha + ("-dirty" if dirty.strip() else "")
    except Exception:  # noqa: BLE001 - no git on the GPU machine
        return "unknown"


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=15, check=True).stdout
        return out.strip().splitlines()[0]
    except Exception:  # noqa: BLE001
        return "unknown"


def make_header(opts: Options) -> dict:
    import triton

    import rl_triton_core
    from rl_triton_core.bench import ext_peers
    from rl_triton_core.bench import peers as P

    cuda = torch.device(opts.device).type == "cuda"
    h = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(opts.commit),
        "device": opts.device,
        "gpu": torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or 'cpu'},"
                                                        f" {os.cpu_count()} cores)",
        "driver": _driver() if cuda else None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "rl_triton_core": rl_triton_core.__version__,
        "torchrl": P.torchrl_version() if any(p.startswith("torchrl") for p in opts.peers)
        else None,
        "rl_triton": ext_peers.rl_triton_version(opts) if "rl_triton" in opts.peers else None,
        "pufferlib": ext_peers.pufferlib_desc(opts) if "pufferlib" in opts.peers else None,
        "estimators": list(opts.estimators),
        "shapes": [f"{n}x{t}" for n, t in opts.shapes],
        "layouts": list(opts.layouts),
        "next_values": opts.next_values,
        "actions": opts.actions,
        "gamma": GAMMA, "lmbda": LMBDA,
        "rtol": RTOL,
        "target_ms": opts.target_ms,
        "peers": ["floor"] * opts.floor + list(opts.peers),
        "rounds": max(1, opts.rounds),
        "method": [
            "inputs: fresh random float32 data (randn; beta in [0.5, 1); log_rhos 0.5 randn; "
            "softmax target probs), bool flags with P(terminated) = P(truncated) = 0.01, "
            f"int64 actions in [0, {opts.actions})",
            f"V': {opts.next_values}"
            + (" (values shifted by one step + bootstrap_value [N])"
               if opts.next_values == "shifted" else " (explicit next_values [N, T])"),
            "full_us: sync, CUDA events around one Python call, median",
            "b2b_us: k back-to-back calls between two events / k",
            "device_us: K calls captured in one CUDA graph, replayed between events / K",
            "gbps: bytes the estimator must move (inputs once, outputs once) / device_us",
            "extra_mem_mb: peak memory of one call above what was allocated before it "
            "(outputs included)",
            f"max_err: vs float64 reference (python loop where N*T <= {REF_LOOP_MAX}, "
            f"else the CPU path in float64); ok if <= {RTOL} * max|ref|",
            "floor: Triton elementwise kernel reading the same inputs and writing the same "
            "outputs, one launch, output allocation included in its full call",
            "inputs are reused across repetitions (L2-warm for small shapes), for every impl",
        ] + ([
            f"rounds: each case's implementations measured in turn {opts.rounds} times "
            "(ours, floor, peers, ours, ...); every time is the median of the rounds"]
            if opts.rounds > 1 else []) + [
            "peers other than the floor run the truncation-flags rows only"
            + (" (and the others: --all-peers)" if opts.all_peers else
               " (--all-peers: every row; also lifts the loops' T <= 4096 and TorchRL "
               "vec's N*T <= 2^24 caps)"),
            f"compiled scan: torch.compile (backend {opts.compile_backend}, dynamic=False), "
            f"compile time not in the timings, at most {opts.compile_budget_s:.0f} s of "
            "compiling in all",
        ] + ([
            "rl-triton / PufferLib (from the rl-triton checkout): inputs converted to their "
            "conventions once per case outside the timed call (batch-major float32 copies, "
            "float32 flags, bootstrap_values [N, T]; PufferLib's [N, T+1] rows): each row's "
            "prep says what; value targets they do not return are an add in the call; "
            "PufferLib is not graph-captured (legacy default stream)"]
            if {"rl_triton", "pufferlib"} & set(opts.peers) else []),
    }
    if cuda:
        props = torch.cuda.get_device_properties(0)
        h["sm_count"] = props.multi_processor_count
        h["gpu_mem_gb"] = round(props.total_memory / 2**30, 1)
    return h
