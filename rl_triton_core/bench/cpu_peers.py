"""CPU-path ratios against the peers a CPU user has, and a fresh process's first calls.

    python -m rl_triton_core.bench.cpu_peers [--reps 30] [--rounds 3] [--fresh] [--cold]

* RLlib 2.60's ``compute_value_targets`` (NumPy loop over time) on a 100,000-step
  flat stream of episode chunks, against ``rl_triton_core.gae`` on the same stream;
* TorchRL 0.14's ``generalized_advantage_estimate`` (default) and
  ``vec_generalized_advantage_estimate`` at [4096, 128, 1], against ``gae``.

Each peer, our call and the floor's variants run interleaved in one process (same
machine load), median of ``--reps`` calls after warm-up; the outputs are compared before
timing. The floor (:func:`floor_variants`): a vectorised elementwise pass that reads
every input of the call once (the same bytes: the same dtypes, bool flags 1 byte, float
flags 4) and writes two float32 outputs, preallocated and reused (each variant its own
pair); no recurrence. It runs
as numpy ufuncs with ``out=`` on one thread and split over two Python threads (numpy
releases the GIL in its loops), as torch elementwise ops with ``out=`` under
``torch.set_num_threads(1)`` and ``(2)``, and as C passes (``_cscan.floor``: each input
read once, vectorised, in L1-sized blocks; ``_cscan.floor_fused``: every input in one
loop, outputs streamed when large) on one and two threads; the row
reports the fastest variant's median and names it. ``peer / floor`` is about the
largest speed-up any implementation could show here, ``ours / floor`` how far ours is
from it.

``--fresh`` (:func:`fresh_rows`): in fresh ``python`` processes (one per case), the
time of each of the first 12 ``gae`` calls on CPU tensors, 20 ms of GIL-holding Python
work between calls, with numba's disk cache warm (one process run before) and, with
``--cold``, cold (a fresh ``NUMBA_CACHE_DIR``).

Nothing here imports numba: the measured process loads what the library loads.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading

import numpy as np
import torch

import rl_triton_core as rc
from rl_triton_core.bench._timing import median_ms as _median_ms

# --- timing -----------------------------------------------------------------------------


# --- the floor --------------------------------------------------------------------------

_BLOCK = 65536  # elements a numpy pass works on at a time: the chain's passes stay in cache


class _Helper:
    """One persistent Python thread that runs a function on request (the second half of
    the two-thread floor): an Event each way, no executor."""

    def __init__(self):
        self._go, self._done = threading.Event(), threading.Event()
        self._job = None
        threading.Thread(target=self._loop, daemon=True, name="cpu_peers-floor").start()

    def _loop(self):
        while True:
            self._go.wait()
            self._go.clear()
            self._job()
            self._done.set()

    def start(self, job):
        self._job = job
        self._done.clear()
        self._go.set()

    def wait(self):
        self._done.wait()


_HELPER = None


def _helper():
    global _HELPER
    if _HELPER is None:
        _HELPER = _Helper()
    return _HELPER


def _split(ins):
    """The inputs as flat arrays: the non-bool ones (added as they are; float flags
    included) and the bool ones (combined by xor in a 1-byte scratch, then added once)."""
    flat = [t.reshape(-1) for t in ins]
    n = flat[0].numel()
    if any(t.numel() != n for t in flat):
        raise ValueError("the floor's inputs must have the same number of elements")
    nums = [t for t in flat if t.dtype != torch.bool]
    flags = [t for t in flat if t.dtype == torch.bool]
    if not nums:
        raise ValueError("the floor needs at least one non-bool input")
    return n, nums, flags


def floor_variants(ins, like):
    """The same-bytes floor of a call: ``{name: fn}``, each ``fn()`` reading every tensor
    of ``ins`` once and writing ``o0 = sum of the non-bool inputs + xor of the bool ones``
    and ``o1 = o0 / 2`` into two float32 tensors shaped ``like``, allocated once per
    variant and returned (the same two) by every call of that variant. Each variant has
    outputs of its own, as our call has the blocks its outputs come back to: with one
    pair shared by every variant, a variant's outputs were in the caches because another
    variant had just written them, which no program calling it once a round would see
    (on RLlib's row the fastest variant's median took half the time it takes with outputs
    of its own; docs/notes.md). No recurrence. Variants: numpy ufuncs with ``out=`` in
    blocks of 64k elements on one thread (``numpy 1t``) and with the elements split in two
    halves over two threads (``numpy 2t``: this one and a helper thread; numpy drops the
    GIL in its loops); torch elementwise ops with ``out=`` on whole tensors under
    ``torch.set_num_threads(1)`` / ``(2)`` (``torch 1t`` / ``torch 2t``; the setting is
    restored after each call); the C passes (:func:`c_floor`)."""
    names = list(_floor_variants(ins, like))
    return {name: _floor_variants(ins, like)[name] for name in names}


def _floor_variants(ins, like):
    """Every variant of :func:`floor_variants`, all writing into one pair of outputs."""
    n, nums, flags = _split(ins)
    o0 = torch.empty(like.shape, dtype=torch.float32)
    o1 = torch.empty(like.shape, dtype=torch.float32)
    outs = (o0, o1)
    a0, a1 = o0.view(-1).numpy(), o1.view(-1).numpy()
    xs = [t.numpy() for t in nums]
    fs = [t.numpy() for t in flags]
    scratch = np.empty(n, dtype=bool)

    def np_range(lo, hi):
        for b in range(lo, hi, _BLOCK):
            s = slice(b, min(b + _BLOCK, hi))
            p = a0[s]
            if len(xs) > 1:
                np.add(xs[0][s], xs[1][s], out=p)
            else:
                np.copyto(p, xs[0][s], casting="unsafe")
            for x in xs[2:]:
                np.add(p, x[s], out=p)
            if len(fs) == 1:
                np.add(p, fs[0][s], out=p)
            elif fs:
                m = scratch[s]
                np.bitwise_xor(fs[0][s], fs[1][s], out=m)
                for f in fs[2:]:
                    np.bitwise_xor(m, f[s], out=m)
                np.add(p, m, out=p)
            np.multiply(p, 0.5, out=a1[s])

    def numpy_1t():
        np_range(0, n)
        return outs

    half = n // 2
    second = lambda: np_range(half, n)  # noqa: E731

    def numpy_2t():
        helper = _helper()
        helper.start(second)
        np_range(0, half)
        helper.wait()
        return outs

    t0, t1 = o0.view(-1), o1.view(-1)
    tscratch = torch.from_numpy(scratch)

    def torch_pass():
        if len(nums) > 1:
            torch.add(nums[0], nums[1], out=t0)
        else:
            t0.copy_(nums[0])
        for x in nums[2:]:
            t0.add_(x)
        if len(flags) == 1:
            t0.add_(flags[0])
        elif flags:
            torch.bitwise_xor(flags[0], flags[1], out=tscratch)
            for f in flags[2:]:
                tscratch.bitwise_xor_(f)
            t0.add_(tscratch)
        torch.mul(t0, 0.5, out=t1)
        return outs

    def torch_threads(k):
        def call():
            before = torch.get_num_threads()
            torch.set_num_threads(k)
            try:
                return torch_pass()
            finally:
                torch.set_num_threads(before)
        return call

    variants = {"numpy 1t": numpy_1t, "numpy 2t": numpy_2t,
                "torch 1t": torch_threads(1), "torch 2t": torch_threads(2)}
    return {**variants, **c_floor(ins, a0, a1, outs)}


def c_floor(ins, a0, a1, outs):
    """The floor as C passes (``_cscan.floor``: each input read once, in L1-sized blocks;
    ``_cscan.floor_fused``: all the inputs in one loop, outputs streamed when large), on
    one and on two threads: ``{"C 1t": fn, "C 2t": fn, "C fused 1t": fn, ...}``
    writing into the numpy arrays ``a0``, ``a1`` and returning ``outs``; {} where the C
    extension is not built or an input's dtype is not float32 or one byte."""
    try:
        from rl_triton_core.scan import _cscan
    except ImportError:
        return {}
    arrs = []
    for t in ins:
        t = t.reshape(-1)
        if t.dtype == torch.bool:
            t = t.view(torch.uint8)
        if t.dtype not in (torch.float32, torch.uint8) or not t.is_contiguous():
            return {}
        arrs.append(t.numpy())

    def threads(fn, k):
        def call():
            fn(a0, a1, k, *arrs)
            return outs
        return call

    return {"C 1t": threads(_cscan.floor, 1), "C 2t": threads(_cscan.floor, 2),
            "C fused 1t": threads(_cscan.floor_fused, 1),
            "C fused 2t": threads(_cscan.floor_fused, 2)}


def _timed(reps, peer, ours, ins, like):
    """Interleaved medians of peer, ours and each floor variant: (peer_ms, ours_ms,
    floor_ms (the fastest variant's), the variant's name, {variant: ms})."""
    variants = floor_variants(ins, like)
    t_peer, t_ours, *t_floor = _median_ms([peer, ours, *variants.values()], reps)
    by = dict(zip(variants, t_floor))
    best = min(by, key=by.get)
    return t_peer, t_ours, by[best], best, by


# --- the peers --------------------------------------------------------------------------

RLLIB = "RLlib 2.60 compute_value_targets"
TORCHRL = "TorchRL 0.14 generalized_advantage_estimate"
TORCHRL_VEC = "TorchRL 0.14 vec_generalized_advantage_estimate"


def rllib_flat(reps, T=100_000, seed=0):
    from ray.rllib.utils.postprocessing.value_predictions import compute_value_targets

    rng = np.random.default_rng(seed)
    values = rng.standard_normal(T).astype(np.float32)
    rewards = rng.standard_normal(T).astype(np.float32)
    # chunks of 100-300 steps; each ends terminated or truncated (RLlib's convention)
    ends = np.cumsum(rng.integers(100, 300, size=T // 100))
    ends = ends[ends < T]
    terminateds = np.zeros(T, np.float32)
    truncateds = np.zeros(T, np.float32)
    kind = rng.random(ends.size) < 0.5
    terminateds[ends[kind]] = 1.0
    truncateds[ends[~kind]] = 1.0
    r, v = torch.from_numpy(rewards), torch.from_numpy(values)
    te, tr = torch.from_numpy(terminateds), torch.from_numpy(truncateds)
    want = compute_value_targets(values, rewards, terminateds, truncateds, 0.99, 0.95)
    got = rc.gae(r, v, te, tr, gamma=0.99, lmbda=0.95, time_dim=-1)[1].numpy()
    err = float(np.abs(got - want).max())
    t_peer, t_ours, t_floor, variant, by = _timed(
        reps, lambda: compute_value_targets(values, rewards, terminateds, truncateds, 0.99, 0.95),
        lambda: rc.gae(r, v, te, tr, gamma=0.99, lmbda=0.95, time_dim=-1), (r, v, te, tr), r)
    return dict(peer=RLLIB, shape=f"flat {T:,}", peer_ms=t_peer, ours_ms=t_ours,
                floor_ms=t_floor, floor_variant=variant, floor_by=by, max_err=err)


def torchrl_gae(reps, B=4096, T=128, seed=0):
    from torchrl.objectives.value.functional import (
        generalized_advantage_estimate,
        vec_generalized_advantage_estimate,
    )

    g = torch.Generator().manual_seed(seed)
    shape = (B, T, 1)
    r, v, nv = (torch.randn(shape, generator=g) for _ in range(3))
    done = torch.rand(shape, generator=g) < 0.02
    term = done & (torch.rand(shape, generator=g) < 0.5)
    rows = []
    ours = lambda: rc.gae(r, v, term, done, next_values=nv, gamma=0.99, lmbda=0.95,  # noqa
                          time_dim=-2)
    for name, fn in ((TORCHRL, generalized_advantage_estimate),
                     (TORCHRL_VEC, vec_generalized_advantage_estimate)):
        peer = lambda fn=fn: fn(0.99, 0.95, v, nv, r, done, term, time_dim=-2)  # noqa
        err = float((ours()[0] - peer()[0]).abs().max())
        t_peer, t_ours, t_floor, variant, by = _timed(reps, peer, ours, (r, v, nv, term, done),
                                                      r)
        rows.append(dict(peer=name, shape=f"[{B}, {T}, 1]", peer_ms=t_peer, ours_ms=t_ours,
                         floor_ms=t_floor, floor_variant=variant, floor_by=by, max_err=err))
    return rows


def peer_rounds(reps, rounds):
    """``rounds`` lists of rows (RLlib, TorchRL, TorchRL vec); a peer that does not import
    gives one row with ``skip`` (its reason) instead."""
    out = []
    for _ in range(rounds):
        rows = []
        for fn, names in ((rllib_flat, [RLLIB]), (torchrl_gae, [TORCHRL, TORCHRL_VEC])):
            try:
                got = fn(reps)
            except ImportError as e:
                rows += [dict(peer=n, skip=f"not importable ({e})") for n in names]
                continue
            rows += got if isinstance(got, list) else [got]
        out.append(rows)
    return out


def _span(xs, fmt="{:.1f}"):
    xs = sorted(xs)
    if len(xs) == 1:
        return fmt.format(xs[0])
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(xs[0])}-{fmt.format(xs[-1])})"


PEER_HEADER = ("| peer | shape | peer ms | ours ms | peer / ours | floor ms (variant) "
               "| ours / floor | peer / floor | max abs diff |")


def peer_table(rounds, extra=()):
    """Markdown lines of the peer table: one row per peer, each cell the median (range)
    over the rounds; ``extra``: more rows (dicts as :func:`rllib_flat` returns, without
    ``floor_variant``/``floor_by`` where the floor is someone else's) measured once."""
    lines = [PEER_HEADER, "|---|---|---|---|---|---|---|---|---|"]
    for i, row in enumerate(rounds[0]):
        if "skip" in row:
            lines.append(f"| {row['peer']} | - | n/a: {row['skip']} | | | | | | |")
            continue
        lines.append(_peer_line([r[i] for r in rounds]))
    lines += [_peer_line([r]) for r in extra]
    return lines


def _peer_line(rs):
    peer = [r["peer_ms"] for r in rs]
    ours = [r["ours_ms"] for r in rs]
    floor = [r["floor_ms"] for r in rs]
    won = sorted({r.get("floor_variant") for r in rs} - {None})
    err = max(r["max_err"] for r in rs)
    return (f"| {rs[0]['peer']} | {rs[0]['shape']} | {_span(peer, '{:.2f}')} | "
            f"{_span(ours, '{:.3f}')} | {_span([p / o for p, o in zip(peer, ours)], '{:.0f}')}x"
            f" | {_span(floor, '{:.3f}')} ({', '.join(won) or '-'}) | "
            f"{_span([o / f for o, f in zip(ours, floor)], '{:.2f}')}x | "
            f"{_span([p / f for p, f in zip(peer, floor)], '{:.0f}')}x | {err:.1e} |")


# --- the fresh process ------------------------------------------------------------------

FRESH_CASES = ("tm128x4", "tm128x4096", "flat100k")
FRESH_LABEL = {"tm128x4": "[128, 4] time-major, bool flags",
               "tm128x4096": "[128, 4096] time-major, bool flags",
               "flat100k": "flat 100,000, float flags"}
FRESH_CALLS = 12
FRESH_WORK_MS = 20.0
FRESH_TAG = "FRESH-ROW "
FRESH_MAX_MS, FRESH_SUM_MS = 50.0, 100.0  # the targets: no call over, the calls together

# Run as ``python -c _CHILD case calls work_ms`` in a fresh process; ``exec``-able with
# another __name__ (the tests call ``run`` in-process)
_CHILD = r'''
import json, sys, time
t_imp = time.perf_counter()
import torch
import rl_triton_core as rc
t_imp = 1e3 * (time.perf_counter() - t_imp)


def busy(ms):
    # Python work that holds the GIL (a thread competing for it would slow it down)
    t_end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < t_end:
        sum(range(100))


def inputs(case):
    g = torch.Generator().manual_seed(0)
    if case == "flat100k":  # one stream of episode chunks, ~0.5 % of the steps done
        T = 100_000
        r, v = torch.randn(T, generator=g), torch.randn(T, generator=g)
        te = (torch.rand(T, generator=g) < 0.0025).float()
        tr = (torch.rand(T, generator=g) < 0.0025).float()
        return (r, v, te, tr), -1
    T, N = {"tm128x4": (128, 4), "tm128x4096": (128, 4096)}[case]
    r, v = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    te = torch.rand(T, N, generator=g) < 0.01
    tr = torch.rand(T, N, generator=g) < 0.01
    return (r, v, te, tr), 0


def same(a, b):  # bit for bit, both outputs
    return all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b))


def run(case, calls, work_ms):
    args, td = inputs(case)
    ms, keep = [], {}
    for i in range(calls):
        if i:
            busy(work_ms)
        t0 = time.perf_counter()
        out = rc.gae(*args, gamma=0.99, lmbda=0.95, time_dim=td)
        ms.append(1e3 * (time.perf_counter() - t0))
        if i in (0, 1, calls - 1):
            keep[i] = tuple(o.clone() for o in out)
    equal = same(keep[0], keep[1]) and same(keep[0], keep[calls - 1])
    return "FRESH-ROW " + json.dumps(dict(case=case, import_ms=t_imp, ms=ms, equal=equal,
                                          numba="numba" in sys.modules))


if __name__ == "__main__":
    print(run(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
'''


def parse_fresh(stdout):
    """The child's row (a dict: case, import_ms, ms (each call's), equal, numba (whether
    numba was loaded in the child after its calls)) from its stdout
    (other lines, warnings say, are skipped), with max_ms, sum_ms and ok (the targets)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(FRESH_TAG):
            row = json.loads(line[len(FRESH_TAG):])
            row["max_ms"], row["sum_ms"] = max(row["ms"]), sum(row["ms"])
            row["ok"] = row["max_ms"] <= FRESH_MAX_MS and row["sum_ms"] <= FRESH_SUM_MS
            return row
    raise ValueError(f"no {FRESH_TAG.strip()} line in the child's output:\n{stdout[-2000:]}")


def _child_env(cache_dir=None):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the parent's smoke mode sets it; a user has not
    if cache_dir:
        env["NUMBA_CACHE_DIR"] = cache_dir
    return env


def fresh_run(case, cache_dir=None, calls=FRESH_CALLS, work_ms=FRESH_WORK_MS, timeout=300):
    out = subprocess.run([sys.executable, "-c", _CHILD, case, str(calls), str(work_ms)],
                         env=_child_env(cache_dir), capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"fresh process for {case} failed ({out.returncode}):\n"
                           f"{out.stderr[-2000:]}")
    return parse_fresh(out.stdout)


def fresh_rows(cases=FRESH_CASES, cold=False):
    """One fresh process per case and cache state: ``warm`` (after one process of the same
    case has filled numba's disk cache) and, with ``cold``, ``cold`` (a fresh
    ``NUMBA_CACHE_DIR``)."""
    rows = []
    for case in cases:
        fresh_run(case)  # fills numba's disk cache for this case's variants
        rows.append(dict(fresh_run(case), cache="warm"))
        if cold:
            with tempfile.TemporaryDirectory(prefix="rl_triton_core_numba_") as tmp:
                rows.append(dict(fresh_run(case, cache_dir=tmp), cache="cold"))
    return rows


def fresh_table(rows):
    lines = [f"Fresh process: each of the first {FRESH_CALLS} `rl_triton_core.gae` calls "
             f"(ms) after `import rl_triton_core`, {FRESH_WORK_MS:.0f} ms of GIL-holding "
             f"Python work between calls; targets: no call over {FRESH_MAX_MS:.0f} ms, "
             f"the {FRESH_CALLS} at most {FRESH_SUM_MS:.0f} ms.", "",
             "| case | numba cache | numba loaded | import ms | calls 1-12 ms | max ms "
             "| sum ms | calls 1, 2, 12 bit-equal | targets met |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        calls = ", ".join(f"{x:.2f}" for x in r["ms"])
        loaded = {True: "yes", False: "no"}.get(r.get("numba"), "?")
        lines.append(f"| {FRESH_LABEL.get(r['case'], r['case'])} | {r['cache']} | {loaded} | "
                     f"{r['import_ms']:.0f} | {calls} | {r['max_ms']:.2f} | {r['sum_ms']:.2f} "
                     f"| {'yes' if r['equal'] else 'NO'} | {'yes' if r['ok'] else 'NO'} |")
    return lines


# --- the machine ------------------------------------------------------------------------


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_lines():
    """CPU model, cores, versions (read from the installs' metadata: nothing imported),
    which CPU kernel the library has, the date."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        has_c = importlib.util.find_spec("rl_triton_core.scan._cscan") is not None
    except (ImportError, ValueError):
        has_c = False
    vers = ", ".join(f"{n} {_version(n) or 'not installed'}" for n in
                     ("torch", "numpy", "numba", "torchrl", "tensordict", "ray", "verl"))
    return [f"Machine: {_cpu_model()}, {os.cpu_count()} cores ({usable} usable), "
            f"{platform.system()} {platform.release()}; Python {platform.python_version()}",
            f"Versions: rl_triton_core {rc.__version__} (CPU kernel: "
            f"{'C extension _cscan' if has_c else 'numba'}), {vers}",
            f"Date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}"]


def token_rows(reps):
    """verl's rows from ``cpu_tokens.verl_rows`` (someone else's module), or ([], note)."""
    try:
        from rl_triton_core.bench import cpu_tokens

        return list(cpu_tokens.verl_rows(reps)), None
    except ImportError as e:
        return [], f"verl rows skipped: {e}"


def cpu_report(reps=30, rounds=1, fresh=True, cold=False, tokens=True, peers=True):
    """The whole CPU table as markdown lines: the machine, the peer table (with verl's
    rows when verl imports), the fresh-process section."""
    lines = machine_lines()
    if peers:
        rs = peer_rounds(reps, rounds)
        extra, note = token_rows(reps) if tokens else ([], None)
        lines += ["", f"Peers: {rounds} round(s) of {reps} interleaved calls, each cell the "
                      "median (range over rounds) of the per-round medians; floor: the "
                      "fastest of numpy, torch and two C passes, on 1 and 2 threads "
                      "(variant named).", ""]
        lines += peer_table(rs, extra)
        if note:
            lines += ["", note]
    if fresh:
        lines += [""] + fresh_table(fresh_rows(cold=cold))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the interleaved measurement; report median (range) of the "
                         "rounds' medians")
    ap.add_argument("--fresh", action="store_true",
                    help="also time the first 12 calls in fresh processes (numba cache warm)")
    ap.add_argument("--cold", action="store_true", help="with --fresh: also cache cold")
    ap.add_argument("--fresh-only", action="store_true", help="only the fresh-process rows")
    ap.add_argument("--no-tokens", action="store_true", help="leave out verl's rows")
    args = ap.parse_args(argv)
    for line in cpu_report(args.reps, args.rounds, fresh=args.fresh or args.fresh_only,
                           cold=args.cold, tokens=not args.no_tokens,
                           peers=not args.fresh_only):
        print(line, flush=True)


if __name__ == "__main__":
    main()
