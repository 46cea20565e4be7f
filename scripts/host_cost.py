"""Host cost of one estimator call on CUDA, through the public API of ``rl_triton_core`` only.

The same script runs against two versions of the package (one process each), e.g.

    RL_TRITON_COMMIT=<sha-old> PYTHONPATH=/src/old python scripts/host_cost.py --out old.json
    RL_TRITON_COMMIT=<sha-new> PYTHONPATH=/src/new python scripts/host_cost.py --out new.json

(``--quick`` for a short run; ``--cpu-smoke`` checks the logic on CPU tensors, with the
Triton baselines only where ``TRITON_INTERPRET=1`` is set.) It prints a markdown table and
writes the same numbers as JSON to ``--out``. All times are microseconds per call, the
median over ``--repeats`` repeats.

* ``back_to_back`` (at ``--b2b-shape``, default 64x32): after a warm-up (the first calls
  compile and record the cached launch), ``--k`` calls in a row with ``time.perf_counter``
  around the loop and no synchronisation inside; ``torch.cuda.synchronize()`` only after the
  clock stops. At this tiny shape the GPU finishes each kernel before the host issues the
  next, so this is the host's cost of a repeated call. ``drain_us`` (the synchronize after
  the loop) should be a few us; a large one means the GPU, not the host, set the pace.
* ``full_call`` (at each of ``--shapes``, default 64x32 and 4096x128): one call plus
  ``torch.cuda.synchronize()``, timed per call; the median over ``--calls`` calls.

Inputs are batch-major [N, T] fp32 with 2% random (bool) done flags; every call passes
``time_dim=-1`` by keyword. Estimators: gae (shifted values + bootstrap_value, also with
truncated flags and with ``out=`` when gae takes it), gae_advantages, lambda_returns,
discounted_returns, vtrace, retrace, retrace_from_actions (A=6), eligibility_traces,
episodic_cumsum, linear_recurrence, group_advantages (GRPO and RLOO, groups of 8), and
the token estimators masked_gae (also whitened), masked_whiten and masked_returns.
Baselines in the same process: ``torch.add(a, b)`` and ``torch.add(a, b, out=c)`` on the
same-size tensors, and a trivial Triton copy kernel
(64 elements) with 8, 32 and 94 runtime arguments (unused int and pointer arguments added;
BLOCK is a constexpr on top) launched through the normal ``kernel[grid](...)``. A missing
or failing estimator is recorded with its error and the run goes on.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import inspect
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

import rl_triton_core as rc

# a cap on --k: the launch queue fills (and the host blocks) only where the GPU is slower than
# the host, which a large drain_us shows; the cap bounds how long such a loop can run
K_CAP = 20000


def shape_of(s):
    n, t = (int(float(x)) for x in s.lower().split("x"))
    return n, t


def estimator_calls(n, t, device, gen):
    """{row name: (estimator name, zero-argument call)}; the tensors are built once, so a
    repeated call sees the same shapes, strides and pointers (the cached launch)."""
    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    def flags():
        return (torch.rand(n, t, generator=gen) < 0.02).to(device)

    r, v, x, q, e = (randn(n, t) for _ in range(5))
    term, trunc, done = flags(), flags(), flags()
    boot, lr = randn(n), 0.3 * randn(n, t)
    qa, pa = randn(n, t, 6), torch.softmax(randn(n, t, 6), -1)
    acts = torch.randint(0, 6, (n, t), generator=gen).to(device)
    logmu = torch.full((n, t), 1 / 6, device=device).log()
    beta = 0.99 * (~done).float()
    mask = ~done  # the token estimators' response mask
    outs = (torch.empty_like(r), torch.empty_like(r))
    scores, group = randn(n), (torch.arange(n) // 8).to(device)

    def g(name):  # looked up at call time: a missing estimator raises, and is recorded
        fn = getattr(rc, name, None)
        if fn is None:
            raise AttributeError(f"rl_triton_core has no {name}")
        return fn

    def takes_out(name):
        try:
            return "out" in inspect.signature(g(name)).parameters
        except (AttributeError, TypeError, ValueError):
            return False

    calls = {
        "gae": ("gae", lambda: g("gae")(r, v, term, bootstrap_value=boot, time_dim=-1)),
        "gae(truncated)": ("gae", lambda: g("gae")(r, v, term, trunc, bootstrap_value=boot,
                                                   time_dim=-1)),
    }

    has_out = takes_out("gae")  # once: inspect.signature costs more than the call

    def gae_out():
        if not has_out:
            raise TypeError("this gae() has no out= parameter")
        return g("gae")(r, v, term, bootstrap_value=boot, time_dim=-1, out=outs)

    calls["gae(out=)"] = ("gae", gae_out)
    calls.update({
        "gae_advantages": ("gae_advantages", lambda: g("gae_advantages")(
            r, v, term, bootstrap_value=boot, time_dim=-1)),
        "lambda_returns": ("lambda_returns", lambda: g("lambda_returns")(
            r, v, term, bootstrap_value=boot, time_dim=-1)),
        "discounted_returns": ("discounted_returns", lambda: g("discounted_returns")(
            r, term, bootstrap_value=boot, time_dim=-1)),
        "vtrace": ("vtrace", lambda: g("vtrace")(lr, r, v, term, bootstrap_value=boot,
                                                 time_dim=-1)),
        "retrace": ("retrace", lambda: g("retrace")(lr, r, q, e, term, time_dim=-1)),
        "retrace_from_actions": ("retrace_from_actions", lambda: g("retrace_from_actions")(
            qa, pa, acts, logmu, r, term, time_dim=-1)),
        "eligibility_traces": ("eligibility_traces", lambda: g("eligibility_traces")(
            x, done, time_dim=-1)),
        "episodic_cumsum": ("episodic_cumsum", lambda: g("episodic_cumsum")(
            x, done, time_dim=-1)),
        "linear_recurrence": ("linear_recurrence", lambda: g("linear_recurrence")(
            x, beta, time_dim=-1)),
        "masked_gae": ("masked_gae", lambda: g("masked_gae")(r, v, mask, gamma=1.0, lmbda=0.95,
                                                             time_dim=-1)),
        "masked_gae(whiten)": ("masked_gae", lambda: g("masked_gae")(
            r, v, mask, gamma=1.0, lmbda=0.95, whiten=True, time_dim=-1)),
        "masked_whiten": ("masked_whiten", lambda: g("masked_whiten")(x, mask)),
        "masked_returns": ("masked_returns", lambda: g("masked_returns")(r, mask, gamma=1.0,
                                                                         time_dim=-1)),
        # GRPO / RLOO over n responses in groups of 8 (torch ops, no scan kernel)
        "group_advantages": ("group_advantages", lambda: g("group_advantages")(
            scores, group, num_groups=n)),
        "group_advantages(rloo)": ("group_advantages", lambda: g("group_advantages")(
            scores, group, method="rloo", num_groups=n)),
        "torch.add": ("baseline", lambda: torch.add(r, v)),
        "torch.add(out=)": ("baseline", lambda: torch.add(r, v, out=outs[0])),
    })
    return calls


def triton_calls(device, nargs_list=(8, 32, 94)):
    """{row name: call}: ``o[i] = x[i]`` (64 elements) with ``nargs`` runtime arguments: x, o,
    n and unused extras (pointers and ints in turn). Triton's JIT needs the kernel's real
    source (inspect.getsource), so the kernels are written to a temporary module and imported."""
    import triton  # noqa: F401  (fails here, not inside the generated module)

    src = ["import triton", "import triton.language as tl", ""]
    for nargs in nargs_list:
        extra = [f"p{i}" if i % 2 == 0 else f"i{i}" for i in range(nargs - 3)]
        src += ["@triton.jit",
                f"def copy_{nargs}(x_ptr, o_ptr, n, {''.join(a + ', ' for a in extra)}"
                "BLOCK: tl.constexpr):",
                "    offs = tl.arange(0, BLOCK)",
                "    m = offs < n",
                "    tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=m), mask=m)", ""]
    path = os.path.join(tempfile.mkdtemp(prefix="host_cost_"), "host_cost_kernels.py")
    with open(path, "w") as fh:
        fh.write("\n".join(src))
    spec = importlib.util.spec_from_file_location("host_cost_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = torch.randn(64, device=device)
    o, dummy = torch.empty_like(x), torch.empty_like(x)
    calls = {}
    for nargs in nargs_list:
        kern = getattr(mod, f"copy_{nargs}")
        extra = [dummy if i % 2 == 0 else 3 + i for i in range(nargs - 3)]
        calls[f"triton copy ({nargs} args)"] = fn = (
            lambda kern=kern, extra=extra: kern[(1,)](x, o, 64, *extra, BLOCK=64))
        o.zero_()
        fn()
        if not torch.equal(o.cpu(), x.cpu()):
            raise RuntimeError(f"copy_{nargs} did not copy its input")
    return calls


def measure(fn, sync, k, repeats, n_full):
    """(back_to_back dict, full_call dict), each None where k / n_full is 0."""
    for _ in range(3):  # the first calls compile and record the cached launch
        fn()
    sync()
    b2b = None
    gc_was = gc.isenabled()
    gc.disable()
    try:
        if k:
            for _ in range(min(k, 200)):  # untimed burst: warm the host's caches
                fn()
            sync()
            per_call, drains = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                for _ in range(k):
                    fn()
                t1 = time.perf_counter()
                sync()
                drains.append((time.perf_counter() - t1) * 1e6)
                per_call.append((t1 - t0) * 1e6 / k)
            b2b = {"us": statistics.median(per_call), "min_us": min(per_call), "k": k,
                   "repeats": per_call, "drain_us": statistics.median(drains)}
        full = []
        for _ in range(n_full):
            t0 = time.perf_counter()
            fn()
            sync()
            full.append((time.perf_counter() - t0) * 1e6)
    finally:
        if gc_was:
            gc.enable()
    if not full:
        return b2b, None
    return b2b, {"us": statistics.median(full), "min_us": min(full), "calls": n_full}


def header(device):
    h = {"rl_triton_core": rc.__file__, "version": getattr(rc, "__version__", None),
         "commit": os.environ.get("RL_TRITON_COMMIT", "unknown"), "python": sys.version.split()[0],
         "torch": torch.__version__, "platform": platform.platform(), "device": str(device)}
    try:
        import triton
        h["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001
        h["triton"] = f"unavailable: {exc}"
    if device.type == "cuda":
        h["gpu"] = torch.cuda.get_device_name(device)
    for var in ("CUDA_LAUNCH_BLOCKING", "TRITON_INTERPRET", "RL_TRITON_CORE_FASTPATH"):
        if os.environ.get(var) is not None:
            h[var] = os.environ[var]
    return h


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="64x32,4096x128", help="full_call shapes, NxT")
    p.add_argument("--b2b-shape", default="64x32", help="the back_to_back shape, NxT")
    p.add_argument("--estimators", default="all", help="comma list of estimator names")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--k", type=int, default=2000, help=f"back_to_back calls (cap {K_CAP})")
    p.add_argument("--calls", type=int, default=200, help="full_call calls per shape")
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--quick", action="store_true", help="--repeats 3 --k 300 --calls 30")
    p.add_argument("--cpu-smoke", action="store_true", help="CPU tensors: checks the logic")
    p.add_argument("--out", default="host_cost.json")
    a = p.parse_args()
    if a.quick:
        a.repeats, a.k, a.calls = min(a.repeats, 3), min(a.k, 300), min(a.calls, 30)
    k = min(a.k, K_CAP)
    if a.cpu_smoke:
        device, sync = torch.device("cpu"), (lambda: None)
    elif not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --cpu-smoke to check the logic on CPU")
    else:
        device, sync = torch.device("cuda"), torch.cuda.synchronize
    want = None if a.estimators == "all" else set(a.estimators.split(","))
    b2b_shape = shape_of(a.b2b_shape)
    shapes = [shape_of(s) for s in a.shapes.split(",")]
    head = header(device)
    for key, val in head.items():
        print(f"# {key}: {val}")
    rows = {}  # name -> {"back_to_back": ..., "full_call": {shape: ...}, "error": ...}

    def record(name, shape, fn, b2b, full):
        row = rows.setdefault(name, {"back_to_back": None, "full_call": {}, "error": None})
        if row["error"]:
            return
        tag = "x".join(map(str, shape))
        try:
            got_b2b, got_full = measure(fn, sync, k if b2b else 0, a.repeats,
                                        a.calls if full else 0)
        except Exception as exc:  # noqa: BLE001  (an older/newer version: record and go on)
            row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            return
        if got_b2b:
            row["back_to_back"] = dict(got_b2b, shape=tag)
        if got_full:
            row["full_call"][tag] = got_full

    # the back_to_back shape first (its full_call too where it is one of --shapes)
    runs = [(b2b_shape, True, b2b_shape in shapes)]
    runs += [(s, False, True) for s in shapes if s != b2b_shape]
    for shape, b2b, full in runs:
        gen = torch.Generator().manual_seed(0)
        calls = {name: fn for name, (est, fn) in estimator_calls(*shape, device, gen).items()
                 if not (a.no_baselines if est == "baseline"
                         else want is not None and est not in want)}
        for fn in calls.values():  # every call compiled and recorded before any is timed,
            try:                   # so the first rows get no different process than the last
                for _ in range(3):
                    fn()
            except Exception:  # noqa: BLE001  (measure() records the error)
                pass
        sync()
        for name, fn in calls.items():
            record(name, shape, fn, b2b, full)
        sync()
    triton_ok = device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    if not a.no_baselines and not triton_ok:
        print("# triton baselines skipped on CPU (set TRITON_INTERPRET=1 to run them)")
    elif not a.no_baselines:
        try:
            tcalls = triton_calls(device)
        except Exception as exc:  # noqa: BLE001
            tcalls = {}
            rows["triton copy"] = {"back_to_back": None, "full_call": {},
                                   "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:200]}
        for name, fn in tcalls.items():
            record(name, (64,), fn, True, False)  # back to back only: it has no NxT shape

    cols = [f"full_call us {n}x{t}" for n, t in shapes]
    print(f"\n| call | back_to_back us {a.b2b_shape} | drain us | {' | '.join(cols)} | error |")
    print("|---" * (len(cols) + 4) + "|")
    for name, row in rows.items():
        b = row["back_to_back"]
        cells = [f"{b['us']:.2f}" if b else "-", f"{b['drain_us']:.1f}" if b else "-"]
        cells += [f"{row['full_call'][f'{n}x{t}']['us']:.2f}" if f"{n}x{t}" in row["full_call"]
                  else "-" for n, t in shapes]
        print(f"| {name} | {' | '.join(cells)} | {(row['error'] or '').replace('|', '/')} |")
    with open(a.out, "w") as fh:
        json.dump({"header": head, "args": vars(a), "results": rows}, fh, indent=1)
    print(f"\n# wrote {a.out}")


if __name__ == "__main__":
    main()
