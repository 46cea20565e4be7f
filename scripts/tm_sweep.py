"""Tile sweep: device time of each estimator under named tuning variants,
against the same-bytes floor, on CUDA (the benchmark's CUDA-graph replay timer).

    python scripts/tm_sweep.py 16384x512,4096x128,16x131072b gae,vtrace lb16,3l32

Shapes are N streams x T steps, data ``[T, N]`` float32 (``time_dim=0``) with 2% done
flags and a bootstrap value; a shape ending in ``b`` (``16x131072b``) is batch-major,
``[N, T]`` (``time_dim=-1``). Each line: the variant's device time and its ratio to the
plan's (``default``); ``FLOOR`` is the benchmark's elementwise kernel reading and writing
the same bytes (``rl_triton_core.bench.peers.make_floor``). A variant whose outputs differ
from the plan's beyond 1e-4 is marked WRONG (rounding differences: BITS DIFFER).
``TM_DONE=0`` (a probability): the done flags' rate instead of 2% (0: no episode ends,
so no segment's map cuts the carry).
"""

import os
import re
import sys

import torch

import rl_triton_core as rc
from rl_triton_core.bench.harness import Timer
from rl_triton_core.bench.peers import make_floor

VARIANTS = {
    "default": {},
    "s32": dict(tm_steps=32),
    # time segments: the look-back with one chunk a program, or three launches
    "lb16": dict(look_back=True, segment_len=16),
    "lb32": dict(look_back=True, segment_len=32, tm_steps=32),
    "3l32": dict(look_back=False, programs_per_sm=32),
    "pf0": dict(prefetch=0), "pf1": dict(prefetch=1), "pf2": dict(prefetch=2),
    "pf3": dict(prefetch=3), "pf4": dict(prefetch=4),
    # the look-back's window (segments read at a time; the plan's is 16) and the middle
    # pass's tile (the plan's 2048 elements)
    "w4": dict(look_window=4), "w8": dict(look_window=8), "w32": dict(look_window=32),
    "lbw32": dict(look_back=True, look_window=32), "lbw64": dict(look_back=True, look_window=64),
    "mid8k": dict(middle_elems=8192),
    "pipe": dict(pipe=True), "nopipe": dict(pipe=False),
    "pps4": dict(programs_per_sm=4), "pps16": dict(programs_per_sm=16),
    "few": dict(tm_few=True), "nofew": dict(tm_few=False),
    "fewpipe": dict(tm_few=True, pipe=True), "few32": dict(tm_few=True, tm_steps=32),
    # no time split (each program walks all of T)
    "pps0": dict(programs_per_sm=0), "pps0s32": dict(programs_per_sm=0, tm_steps=32),
    "lb": dict(look_back=True), "lb3": dict(look_back=False),
    "lbw64s": dict(look_back=True, look_window=64, segment_len=2048),
    # batch-major few long streams: the look-back over whole-row-sized tiles (one
    # program a segment of 2048-8192 steps), longer than the plan's look-back chunk
    # (segment_len does not lengthen the look-back's chunk: lbw64s measured as lbw64)
    "lbrow1k": dict(tile=(1, 1024, 8), look_back=True),
    "lbrow2k": dict(tile=(1, 2048, 8), look_back=True),
    "lbrow4k": dict(tile=(1, 4096, 16), look_back=True),
    "lbrow4kw64": dict(tile=(1, 4096, 16), look_back=True, look_window=64),
    "lbrow8k": dict(tile=(1, 8192, 16), look_back=True),
    # time-major 8-16 streams: the look-back over longer [16, T] tiles than the plan's
    # [16, 256] (512 programs at 16x131072), and a wider window
    "tm512": dict(tile=(16, 512, 8), look_back=True),
    "tm1k": dict(tile=(16, 1024, 16), look_back=True),
    "tm1kw64": dict(tile=(16, 1024, 16), look_back=True, look_window=64),
    # the plan's [16, 256] tile there takes 206-223 registers on 8 warps (one program an
    # SM, 12.5% occupancy): the same tile on 16 warps (128 registers), or [16, 128] on 8
    # (128-198: two programs an SM)
    # batch-major few long streams: the three launches over one-row tiles (row3l1k is
    # the plan's own tile for one stream since it measured 0.59-0.64x at 1x1000000; at
    # 16x131072 both were slower)
    "row3l1k": dict(tile=(1, 1024, 8), look_back=False),
    "row3l2k": dict(tile=(1, 2048, 16), look_back=False),
}


_TILE = re.compile(r"t(\d+)x(\d+)w(\d+)")


def variant(name):
    """The tuning knobs of a variant: a name of ``VARIANTS``, or ``tNxTwW`` for the tile of
    N rows (streams) by T steps on W warps (``tuning(tile=(N, T, W))``), in either layout:
    e.g. ``t1x128w2`` (one row a program, rl-triton's tile for 128-step rows) or
    ``t8x128w4`` (time-major: 8 streams of 32 bytes a row, Triton's lanes along time)."""
    m = _TILE.fullmatch(name)
    return dict(tile=tuple(map(int, m.groups()))) if m else VARIANTS[name]


_TIMER = Timer("cuda", target_ms=20.0)
DONE_P = float(os.environ.get("TM_DONE", "0.02"))


def gtime(fn):
    """Device microseconds per call of ``fn``: the benchmark's CUDA-graph replay."""
    for _ in range(3):
        fn()
    return _TIMER._graph(fn, _TIMER._b2b(fn, 20))


def _inputs(shape, N):
    def rand():
        return torch.randn(shape, device="cuda")
    r, v, x, lr = rand(), rand(), rand(), 0.5 * rand()
    return r, v, x, lr, torch.rand(shape, device="cuda") < DONE_P, torch.randn(N, device="cuda")


def estimator_calls(r, v, x, lr, d, boot, td):
    """Each estimator's call on these inputs, and its floor's arguments (the per-step
    inputs, the per-stream ones, the number of outputs)."""
    calls = {
        "gae_advantages": lambda: rc.gae_advantages(r, v, d, bootstrap_value=boot, time_dim=td),
        "gae": lambda: rc.gae(r, v, d, bootstrap_value=boot, time_dim=td),
        "lambda_returns": lambda: rc.lambda_returns(r, v, d, bootstrap_value=boot, time_dim=td),
        "vtrace": lambda: rc.vtrace(lr, r, v, d, bootstrap_value=boot, time_dim=td),
        "eligibility_traces": lambda: rc.eligibility_traces(x, d, time_dim=td),
        "discounted_returns": lambda: rc.discounted_returns(r, d, bootstrap_value=boot,
                                                            time_dim=td),
        "episodic_cumsum": lambda: rc.episodic_cumsum(x, d, time_dim=td),
    }
    floors = {"gae_advantages": ([r, v, d], [boot], 1), "gae": ([r, v, d], [boot], 2),
              "lambda_returns": ([r, v, d], [boot], 1), "vtrace": ([lr, r, v, d], [boot], 2),
              "eligibility_traces": ([x, d], [], 1), "discounted_returns": ([r, d], [boot], 1),
              "episodic_cumsum": ([x, d], [], 1)}
    return calls, floors


def sweep(N, T, ests, names, batch=False):
    shape, td = ((N, T), -1) if batch else ((T, N), 0)
    tag = "b" if batch else ""
    calls, floors = estimator_calls(*_inputs(shape, N), td)
    for e in ests:
        narrow, per_stream, n_out = floors[e]
        floor = gtime(make_floor(narrow, [], per_stream, n_out, shape, torch.float32))
        print(f"{e} {N}x{T}{tag} FLOOR: {floor:.1f} us", flush=True)
        base = t0 = None
        for name in names:
            f = _tuned(calls[e], variant(name))
            try:
                out = f()
                torch.cuda.synchronize()
                o = out[0] if isinstance(out, tuple) else out
                if base is None:
                    base = o.clone()
                mark = ""
                if not torch.equal(o, base):
                    close = torch.allclose(o, base, rtol=1e-4, atol=1e-4)
                    mark = " BITS DIFFER" if close else " WRONG"
                t = gtime(f)
                t0 = t0 or t
                print(f"{e} {N}x{T}{tag} {name}: {t:.1f} us ({t / t0:.2f} of the plan, "
                      f"{t / floor:.2f}x floor){mark}", flush=True)
            except Exception as ex:  # a variant that cannot compile or run: say so, go on
                print(f"{e} {N}x{T}{tag} {name}: FAILED {type(ex).__name__}: {str(ex)[:200]}",
                      flush=True)


def _tuned(fn, knobs):
    def call():
        with rc.tuning(**knobs):
            return fn()
    return call


def main(argv):
    shapes = [(*map(int, s.rstrip("b").split("x")), s.endswith("b"))
              for s in argv[0].split(",")]
    ests = argv[1].split(",")
    asked = argv[2].split(",") if len(argv) > 2 else []
    names = ["default"] + [v for v in asked if v != "default"]
    torch.manual_seed(0)
    for N, T, batch in shapes:
        sweep(N, T, ests, names, batch)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
