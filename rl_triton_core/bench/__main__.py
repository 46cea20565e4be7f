"""python -m rl_triton_core.bench [--quick] [--estimators gae,vtrace] [--shapes 4096x128,...]
[--layouts batch,time] [--trunc none,flags] [--no-peers] [--peers a,b] [--rl-triton-src PATH]
[--out bench_out] [--commit SHA]

Runs the benchmark on the CUDA GPU and writes ``<out>/benchmarks.json`` (header + one
record per row), ``<out>/benchmarks.md`` and the PNG plots. Without a GPU (or with
``--cpu-smoke``) it runs only a tiny CPU smoke mode into ``<out>/cpu_smoke/``: the
harness logic, the CPU path as the implementation, perf_counter timings, the floor
kernel in the Triton interpreter. Without a GPU it then prints the CPU table
(``rl_triton_core.bench.cpu_peers``: the machine and versions, our CPU path against
RLlib's and TorchRL's GAE and the same-bytes floor, verl's token rows where verl
imports, a fresh process's first 12 calls) and writes it to
``<out>/cpu_smoke/cpu_table.md``; ``--no-cpu-table`` leaves it out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def _shape(text: str) -> tuple:
    try:
        n, t = text.lower().split("x")
        return int(float(n)), int(float(t))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is NxT (e.g. 4096x128), got {text!r}") from None


def _list(text: str) -> list:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m rl_triton_core.bench",
        description="Benchmark the estimators against the floor kernel and the peers.")
    ap.add_argument("--estimators", type=_list, default=None,
                    help="comma list (default: every estimator this install has)")
    ap.add_argument("--shapes", type=lambda s: [_shape(x) for x in _list(s)], default=None,
                    help="comma list of NxT (N streams x T steps); default: the full set")
    ap.add_argument("--quick", action="store_true",
                    help="three shapes (4096x128, 16384x512, 16x131072), shorter measurements")
    ap.add_argument("--layouts", type=_list, default=["batch", "time"],
                    help="batch ([N, T], time_dim=-1) and/or time ([T, N], time_dim=0)")
    ap.add_argument("--trunc", type=_list, default=["none", "flags"],
                    help="none (truncated=None) and/or flags (a random truncated tensor)")
    ap.add_argument("--out", default="bench_out", help="output folder (default bench_out/)")
    ap.add_argument("--no-peers", action="store_true",
                    help="only ours and the floor (no other peer)")
    ap.add_argument("--peers", type=_list, default=None,
                    help="comma list of peers (loop, torchrl, torchrl_vec, compiled_scan, "
                         "rl_triton, pufferlib; default: all). rl_triton (rl-triton 0.1.3's "
                         "estimators) and pufferlib (PufferLib 3.0's GAE kernel, JIT-built "
                         "from rl-triton's benchmarks/pufferlib_ext) come from the checkout "
                         "named by --rl-triton-src, else n/a")
    ap.add_argument("--rl-triton-src", default=None, metavar="PATH",
                    help="root of a checkout of github.com/simonsays1980/rl-triton (tag "
                         "v0.1.3; holds src/rl_triton and benchmarks/pufferlib_ext) for the "
                         "rl_triton and pufferlib peers (default: $RL_TRITON_SRC)")
    ap.add_argument("--all-peers", action="store_true",
                    help="run the peers on the truncated=None rows too, and lift their caps "
                         "(Python loops beyond T=4096, TorchRL's vectorised GAE beyond "
                         "N*T=2^24)")
    ap.add_argument("--next-values", choices=("shifted", "explicit"), default="shifted",
                    help="V' as values shifted + bootstrap_value [N] (default) or explicit "
                         "next_values [N, T]")
    ap.add_argument("--actions", type=int, default=8,
                    help="action count A of retrace_from_actions' per-action inputs (default 8)")
    ap.add_argument("--target-ms", type=float, default=None,
                    help="work per measurement, ms (default 20; --quick 10)")
    ap.add_argument("--compile-budget-s", type=float, default=None,
                    help="stop compiling the scan peer after this many seconds "
                         "(default 120; --quick 30)")
    ap.add_argument("--deadline-s", type=float, default=480.0,
                    help="start no new case after this many seconds and write what was "
                         "measured (default 480; 0: none)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure each case's implementations in turn this many times and "
                         "report the medians (interleaved: ours, floor, peers, ours, ...); "
                         "default 1")
    ap.add_argument("--commit", default=None,
                    help="commit to record (default: $RL_TRITON_COMMIT, else git)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny CPU run of the harness logic (the default without a GPU)")
    ap.add_argument("--no-progress", action="store_true")
    cpu = ap.add_argument_group("the CPU table (no GPU only)")
    cpu.add_argument("--no-cpu-table", action="store_true",
                     help="without a GPU, skip the CPU table after the smoke mode")
    cpu.add_argument("--cpu-reps", type=int, default=30,
                     help="interleaved calls per peer row of the CPU table (default 30)")
    cpu.add_argument("--cpu-rounds", type=int, default=1,
                     help="rounds of the CPU table's peer rows (default 1)")
    cpu.add_argument("--cpu-cold", action="store_true",
                     help="the fresh-process rows with numba's disk cache cold too")
    return ap.parse_args(argv)


def options(args, smoke: bool):
    from rl_triton_core.bench import harness as H
    from rl_triton_core.bench import peers as P

    available = H.available_estimators()
    estimators = args.estimators or available
    missing = [e for e in estimators if e not in available]
    if missing:
        raise SystemExit(f"unknown or unavailable estimator(s) {missing}; this install has "
                         f"{available}")
    layouts = [{"bm": "batch", "tm": "time"}.get(x, x) for x in args.layouts]
    bad = [x for x in layouts if x not in H.LAYOUTS] + \
          [x for x in args.trunc if x not in H.TRUNCS]
    if bad:
        raise SystemExit(f"unknown layout / trunc value(s) {bad}: layouts are {H.LAYOUTS}, "
                         f"trunc {H.TRUNCS}")
    peers = [] if args.no_peers else (args.peers or list(P.PEERS))
    bad = [p for p in peers if p not in P.PEERS]
    if bad:
        raise SystemExit(f"unknown peer(s) {bad}; the peers are {P.PEERS}")
    if smoke:
        shapes = args.shapes or list(H.SMOKE_SHAPES)
    elif args.shapes:
        shapes = args.shapes
    else:
        shapes = list(H.QUICK_SHAPES if args.quick else H.SHAPES)
    target = args.target_ms or (2.0 if smoke else 10.0 if args.quick else 20.0)
    budget = args.compile_budget_s
    if budget is None:
        budget = 30.0 if args.quick else 120.0
    return H.Options(
        estimators=estimators, shapes=shapes, layouts=layouts, truncs=args.trunc,
        peers=peers, all_peers=args.all_peers, next_values=args.next_values,
        actions=args.actions,
        target_ms=target, compile_budget_s=budget,
        compile_backend="eager" if smoke else "inductor",
        device="cpu" if smoke else "cuda", seed=args.seed, commit=args.commit,
        progress=not args.no_progress, deadline_s=args.deadline_s, rounds=args.rounds,
        rl_triton_src=args.rl_triton_src)  # None: ext_peers.source reads $RL_TRITON_SRC


def main(argv=None) -> int:
    args = parse(argv)
    import torch

    cuda = torch.cuda.is_available()
    smoke = args.cpu_smoke or not cuda
    if smoke and not cuda:
        print("[bench] no CUDA GPU: running only the CPU smoke mode (--cpu-smoke): tiny "
              "shapes, the CPU path, perf_counter timings, no device times.")
    from rl_triton_core.bench import harness as H
    from rl_triton_core.bench import plots

    opts = options(args, smoke)
    out = Path(args.out) / ("cpu_smoke" if smoke else "")
    out.mkdir(parents=True, exist_ok=True)
    opts.partial_path = str(out / "benchmarks.partial.json")
    n_cases = sum(len([t for t in H.SPECS[e].truncs if t == "-" or t in opts.truncs])
                  for e in opts.estimators) * len(opts.shapes) * len(opts.layouts)
    print(f"[bench] {len(opts.estimators)} estimators x {len(opts.shapes)} shapes x "
          f"{len(opts.layouts)} layouts: {n_cases} cases; peers: "
          f"{', '.join(['floor'] + opts.peers)}; out: {out}", file=sys.stderr)
    t0 = time.perf_counter()
    result = H.run(opts)
    path = out / "benchmarks.json"
    path.write_text(json.dumps(result, indent=1, allow_nan=True))
    Path(opts.partial_path).unlink(missing_ok=True)
    files = [path] + plots.write_report(result, out)
    print(f"[bench] done in {time.perf_counter() - t0:.0f} s (compile {opts.compile_spent_s:.0f} s)"
          f"; wrote:", file=sys.stderr)
    for f in files:
        print(f"  {f}")
    wrong = [r for r in result["records"] if r["impl"] == "ours" and r["ok"] is False]
    if wrong:
        print(f"[bench] {len(wrong)} row(s) of ours FAILED the reference check:", file=sys.stderr)
        for r in wrong[:20]:
            print(f"  {r['estimator']} {r['shape']} {r['layout']} {r['trunc']}: {r['note']}",
                  file=sys.stderr)
    if not cuda and not args.no_cpu_table:
        cpu_table(args, out)
    return 1 if wrong else 0


def cpu_table(args, out: Path) -> list:
    """Print (and write to ``<out>/cpu_table.md``) the CPU table of ``cpu_peers``."""
    from rl_triton_core.bench import cpu_peers

    print("[bench] the CPU table (rl_triton_core.bench.cpu_peers):", file=sys.stderr)
    lines = cpu_peers.cpu_report(reps=args.cpu_reps, rounds=args.cpu_rounds, fresh=True,
                                 cold=args.cpu_cold)
    text = "\n".join(lines) + "\n"
    print(text)
    (out / "cpu_table.md").write_text(text)
    return lines


def _reexec_interpreted():
    """The smoke mode runs the floor kernel in the Triton interpreter, which must be on
    before triton is first imported (``import rl_triton_core`` imports it, and
    ``python -m`` imports the package before this file): start again with it on."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    import torch

    if "--cpu-smoke" in sys.argv or not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
        os.execv(sys.executable, [sys.executable, "-m", "rl_triton_core.bench", *sys.argv[1:]])


if __name__ == "__main__":
    if "-h" not in sys.argv and "--help" not in sys.argv:
        _reexec_interpreted()
    sys.exit(main())
