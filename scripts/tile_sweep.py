"""Device time of the scan kernel per tile shape (BLOCK_N x BLOCK_T x num_warps), on
the GPU, against the floor kernel: the data behind ``_launch.plan``.

    python scripts/tile_sweep.py [--deadline-s 240] [--out sweep.md]

Each configuration's output is compared with the default plan's (and the default
plan's with the float64 reference) before it is timed (CUDA-graph replay). The floor,
the plan, the plan without whole-row tiles (``row_tiles=False``) and every tile are
timed in ``--rounds`` interleaved rounds (median), after a moment of GPU work: an idle
H200 clocks down, which made single small-shape timings vary 2x. ``--bm-tiles``
takes ``bn:bt:warps[:scalar:stages:programs per SM]``, bt 0 for the whole row and
negative warps for steps per thread, e.g. ``1:0:-8:0:1:1``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import triton

import rl_triton_core as rc
import rl_triton_core.reference as ref
from rl_triton_core import _config
from rl_triton_core.bench.harness import Timer
from rl_triton_core.bench.peers import make_floor

_TIMER = Timer("cuda", target_ms=5.0)

BM_TILES = [(8, 128, 8), (16, 128, 8), (32, 128, 8), (4, 256, 8), (8, 256, 8), (8, 512, 8),
            (4, 128, 4), (16, 128, 16), (2, 512, 4)]
# time-major: (BLOCK_N, BLOCK_T, num_warps, SCALAR_N[, STAGES]); SCALAR_N = one thread per
# stream; STAGES > 1 pipelines the chunk loop's loads (cp.async, STAGES - 1 chunks ahead)
TM_TILES = [(32, 128, 8, False), (32, 32, 8, False), (32, 16, 1, True), (32, 32, 1, True),
            (64, 16, 2, True), (128, 16, 4, True), (32, 16, 1, True, 2), (32, 16, 1, True, 3),
            (32, 32, 1, True, 3), (64, 16, 2, True, 2), (64, 16, 2, True, 3), (128, 16, 4, True, 2),
            (32, 8, 1, True, 4)]


def graph_us(fn):
    """Device time of one call: the harness's CUDA-graph replay."""
    est = _TIMER._b2b(fn, 10)
    return _TIMER._graph(fn, est)


def inputs(N, T, layout, gen):
    shp = (N, T) if layout == "bm" else (T, N)
    td = -1 if layout == "bm" else 0
    d = dict(
        r=torch.randn(shp, generator=gen), v=torch.randn(shp, generator=gen),
        lr=torch.randn(shp, generator=gen) * 0.3, e=torch.randn(shp, generator=gen),
        te=torch.rand(shp, generator=gen) < 0.02, tr=torch.rand(shp, generator=gen) < 0.01,
        b=torch.randn(N, generator=gen))
    return {k: x.cuda() for k, x in d.items()}, td


def calls(d, td):
    return {
        "gae": (lambda: rc.gae(d["r"], d["v"], d["te"], d["tr"], bootstrap_value=d["b"],
                               time_dim=td),
                lambda c: ref.gae(c["r"], c["v"], c["te"], c["tr"], bootstrap_value=c["b"],
                                  time_dim=td),
                ([d["r"], d["v"], d["te"], d["tr"]], [d["b"]], 2)),
        "vtrace": (lambda: rc.vtrace(d["lr"], d["r"], d["v"], d["te"], d["tr"],
                                     bootstrap_value=d["b"], time_dim=td),
                   lambda c: ref.vtrace(c["lr"], c["r"], c["v"], c["te"], c["tr"],
                                        bootstrap_value=c["b"], time_dim=td),
                   ([d["lr"], d["r"], d["v"], d["te"], d["tr"]], [d["b"]], 2)),
        "lambda_returns": (lambda: rc.lambda_returns(d["r"], d["v"], d["te"], d["tr"],
                                                     bootstrap_value=d["b"], time_dim=td),
                           lambda c: ref.lambda_returns(c["r"], c["v"], c["te"], c["tr"],
                                                        bootstrap_value=c["b"], time_dim=td),
                           ([d["r"], d["v"], d["te"], d["tr"]], [d["b"]], 1)),
        "discounted_returns": (lambda: rc.discounted_returns(d["r"], d["te"], d["tr"],
                                                             bootstrap_value=d["b"],
                                                             time_dim=td),
                               lambda c: ref.discounted_returns(c["r"], c["te"], c["tr"],
                                                                bootstrap_value=c["b"],
                                                                time_dim=td),
                               ([d["r"], d["te"], d["tr"]], [d["b"]], 1)),
        "retrace": (lambda: rc.retrace(d["lr"], d["r"], d["v"], d["e"], d["te"], d["tr"],
                                       time_dim=td),
                    lambda c: ref.retrace(c["lr"], c["r"], c["v"], c["e"], c["te"], c["tr"],
                                          time_dim=td),
                    ([d["lr"], d["r"], d["v"], d["e"], d["te"], d["tr"]], [], 1)),
        "eligibility_traces": (lambda: rc.eligibility_traces(d["r"], d["te"], time_dim=td),
                               lambda c: ref.eligibility_traces(c["r"], c["te"], time_dim=td),
                               ([d["r"], d["te"]], [], 1)),
        "episodic_cumsum": (lambda: rc.episodic_cumsum(d["r"], d["te"], time_dim=td),
                            lambda c: ref.episodic_cumsum(c["r"], c["te"], time_dim=td),
                            ([d["r"], d["te"]], [], 1)),
    }


def _name(tile):
    """8x128w8, 32x16w1s for a thread-per-stream (SCALAR_N) tile, 32x16w1s3 with 3 stages,
    32x16w1s1p32 with time segments until 32 programs per SM."""
    name = f"{tile[0]}x{tile[1]}w{tile[2]}" + ("s" if tile[3:4] == (True,) else "")
    name += str(tile[4]) if len(tile) > 4 and (tile[4] != 1 or len(tile) > 5) else ""
    return name + (f"p{tile[5]}" if len(tile) > 5 else "")


def _parse_tile(text):
    v = [int(x) for x in text.split(":")]
    if len(v) > 3:
        v[3] = bool(v[3])
    return tuple(v)


def _spin(seconds=0.5):
    """Busy the GPU for a moment first: an idle H200 clocks down (345 MHz seen idle)."""
    x = torch.randn(4096, 4096, device="cuda")
    t0 = time.time()
    while time.time() - t0 < seconds:
        x @ x
    torch.cuda.synchronize()


def _resolve(tile, T):
    """A tile for T: BLOCK_T 0 is the whole row (next power of two of T); num_warps
    below 0 is -(steps per thread): warps = BLOCK_N x BLOCK_T / (32 x that), 1..32."""
    bn, bt, w = tile[:3]
    if bt == 0:
        bt = max(16, triton.next_power_of_2(T))
    if w < 0:
        w = max(1, min(32, bn * bt // (32 * -w)))
    return (bn, bt, w) + tuple(tile[3:])


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--deadline-s", type=float, default=240)
    p.add_argument("--shapes", default="4096x128,16384x512,1x1048576,256x1024")
    p.add_argument("--estimators", default="gae,vtrace,episodic_cumsum")
    p.add_argument("--layouts", default="bm,tm")
    p.add_argument("--out", default="")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    p.add_argument("--tm-tiles", default="", help="time-major tiles instead of TM_TILES: "
                   "bn:bt:warps:scalar(0/1)[:stages[:programs per SM]] joined by commas")
    p.add_argument("--bm-tiles", default="", help="batch-major tiles instead of BM_TILES: "
                   "bn:bt:warps[:scalar:stages:programs per SM] joined by commas; bt 0: the "
                   "whole row (next power of two of T); warps -k: k steps per thread")
    a = p.parse_args()
    global TM_TILES, BM_TILES
    if a.tm_tiles:
        TM_TILES = [_parse_tile(x) for x in a.tm_tiles.split(",")]
    if a.bm_tiles:
        BM_TILES = [_parse_tile(x) for x in a.bm_tiles.split(",")]
    t_end = time.time() + a.deadline_s
    gen = torch.Generator().manual_seed(0)
    base_tune = _config.current_tuning().replace(cached_launch=False)  # reach the planner
    lines = ["| estimator | shape | layout | floor us | default us | 128-step tiles us "
             "| best tile | best us | all (tile: us) |", "|---|---|---|---|---|---|---|---|---|"]
    _spin()
    for shape in a.shapes.split(","):
        N, T = (int(x) for x in shape.split("x"))
        for layout in a.layouts.split(","):
            d, td = inputs(N, T, layout, gen)
            cpu = {k: x.cpu() for k, x in d.items()}
            for est, (fn, rfn, (narrow, per_stream, n_out)) in calls(d, td).items():
                if est not in a.estimators.split(","):
                    continue
                if time.time() > t_end:
                    print("deadline reached", flush=True)
                    break
                _config.set_tuning(base_tune)
                base = _tuple(fn())
                want = _tuple(rfn(cpu))
                err = max((b.double().cpu() - w).abs().max().item() for b, w in zip(base, want))
                if N * T <= 1 << 21 and not err <= 1e-3:
                    print(f"{est} {shape} {layout}: default plan off by {err}", flush=True)
                floor_fn = make_floor([x.contiguous() for x in narrow], [], per_stream, n_out,
                                      base[0].shape, torch.float32)
                # the configurations: floor, the plan, the plan without whole-row tiles,
                # then the swept tiles; each checked against the plan's output once, then
                # timed in ROUNDS interleaved rounds (median)
                confs = [("floor", None, floor_fn), ("default", base_tune, fn),
                         ("old", base_tune.replace(row_tiles=False), fn)]
                tiles = BM_TILES if layout == "bm" else TM_TILES
                notes = {}
                for tile in dict.fromkeys(_resolve(x, T) for x in tiles):
                    tune = base_tune.replace(tile=tile)
                    _config.set_tuning(tune)
                    try:
                        got = _tuple(fn())
                        diff = max((g - b).abs().max().item() for g, b in zip(got, base))
                        if not diff <= 1e-3 * (1 + base[0].abs().max().item()):
                            notes[tile] = f"WRONG {diff:.2g}"
                            continue
                        confs.append((tile, tune, fn))
                    except Exception as e:  # noqa: BLE001
                        notes[tile] = type(e).__name__
                times = {c[0]: [] for c in confs}
                _spin(0.2)  # the reference's CPU time left the GPU idle
                for _ in range(a.rounds):
                    for key, tune, f in confs:
                        if time.time() > t_end:
                            break
                        if tune is not None:
                            _config.set_tuning(tune)
                        times[key].append(graph_us(f))
                _config.set_tuning(base_tune)
                med = {k: statistics.median(v) if v else float("nan") for k, v in times.items()}
                res = [(k, med[k], "") for k, *_ in confs[3:]] + [
                    (k, float("nan"), v) for k, v in notes.items()]
                ok = [r for r in res if r[1] == r[1]]
                best = min(ok, key=lambda r: r[1]) if ok else (None, float("nan"), "")
                allt = " ".join(f"{_name(r[0])}:{r[1]:.1f}{r[2]}" for r in res)
                line = (f"| {est} | {shape} | {layout} | {med['floor']:.1f} | "
                        f"{med['default']:.1f} | {med['old']:.1f} | {best[0]} | {best[1]:.1f} "
                        f"| {allt} |")
                print(line, flush=True)
                lines.append(line)
    if a.out:
        open(a.out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
