"""Quick GPU check used during kernel work: correctness of every estimator against the
float64 CPU path on large shapes, and device time (CUDA-graph replay) against a floor
kernel that moves the same bytes. The full benchmark is `python -m rl_triton_core.bench`."""

import os
import sys
import time

import torch
import triton
import triton.language as tl

import rl_triton_core as rc


@triton.jit
def _floor(a, b, c, d, o1, o2, n, TWO: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(a + i, mask=m) + tl.load(b + i, mask=m) + tl.load(c + i, mask=m).to(tl.float32) \
        + tl.load(d + i, mask=m).to(tl.float32)
    tl.store(o1 + i, x, mask=m)
    if TWO:
        tl.store(o2 + i, x + 1.0, mask=m)


def floor_call(a, b, c, d, o1, o2, two):
    n = a.numel()
    _floor[(triton.cdiv(n, 2048),)](a, b, c, d, o1, o2, n, TWO=two, BLOCK=2048, num_warps=8)


def graph_time(fn, reps=50):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    ts = []
    for _ in range(5):
        e0.record()
        for _ in range(reps):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / reps * 1e3)
    return sorted(ts)[len(ts) // 2]


def call_time(fn, reps=200):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3)
    return sorted(ts)[len(ts) // 2]


def cpu64(fn, *args, **kw):
    os.environ["RL_TRITON_CORE_BACKEND"] = "cpu"
    conv = [a.detach().cpu().double() if isinstance(a, torch.Tensor) and a.is_floating_point()
            else (a.cpu() if isinstance(a, torch.Tensor) else a) for a in args]
    kw = {k: (v.detach().cpu().double() if isinstance(v, torch.Tensor) and v.is_floating_point()
              else v) for k, v in kw.items()}
    out = fn(*conv, **kw)
    os.environ["RL_TRITON_CORE_BACKEND"] = "auto"
    return out if isinstance(out, tuple) else (out,)


def main():
    shapes = [(4096, 128), (512, 128), (32768, 32), (16384, 16), (256, 1024), (16384, 512),
              (1024, 4096), (65536, 1024), (16, 131072), (1, 1_000_000)]
    if len(sys.argv) > 1 and sys.argv[1] == "--quick":
        shapes = shapes[:3] + shapes[-2:]
    dev = "cuda"
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    print(f"{'est':8s} {'shape':>14s} {'lay':3s} {'err':>8s} {'dev_us':>8s} {'floor':>8s} "
          f"{'ratio':>6s} {'call_us':>8s} {'fl_call':>8s} {'GB/s':>6s}")
    for N, T in shapes:
        for tm in (False, True):
            shp = (T, N) if tm else (N, T)
            td = 0 if tm else -1
            g = torch.Generator(device=dev).manual_seed(N * 7 + T)
            r = torch.randn(shp, device=dev, generator=g)
            v = torch.randn(shp, device=dev, generator=g)
            lr = 0.3 * torch.randn(shp, device=dev, generator=g)
            term = torch.rand(shp, device=dev, generator=g) < 0.01
            trunc = torch.rand(shp, device=dev, generator=g) < 0.01
            boot = torch.randn(N, device=dev, generator=g)
            nv = torch.randn(shp, device=dev, generator=g)
            cases = {
                "gae": (rc.gae, (r, v, term, trunc), dict(bootstrap_value=boot, time_dim=td), 2),
                "lambda": (rc.lambda_returns, (r, v, term, trunc),
                           dict(bootstrap_value=boot, time_dim=td), 1),
                "vtrace": (rc.vtrace, (lr, r, v, term, trunc),
                           dict(bootstrap_value=boot, time_dim=td), 2),
                "retrace": (rc.retrace, (lr, r, v, nv, term, trunc), dict(time_dim=td), 1),
                "cumsum": (rc.episodic_cumsum, (r, term), dict(time_dim=td), 1),
            }
            for name, (fn, args, kw, nout) in cases.items():
                out = fn(*args, **kw)
                out = out if isinstance(out, tuple) else (out,)
                torch.cuda.synchronize()
                ref = cpu64(fn, *args, **kw)
                err = max(((o.double().cpu() - rf).abs().max() / rf.abs().max().clamp_min(1))
                          .item() for o, rf in zip(out, ref))
                n_f = sum(a.is_floating_point() for a in args)
                n_b = len(args) - n_f
                nbytes = (n_f + nout) * r.numel() * 4 + n_b * r.numel()
                fa = [a for a in args if a.is_floating_point()] + [r, r]
                fb = [a for a in args if not a.is_floating_point()] + [term, term]
                o1, o2 = torch.empty_like(r), torch.empty_like(r)
                fl = lambda: floor_call(fa[0], fa[1], fb[0], fb[1], o1, o2, nout == 2)  # noqa
                ours = lambda: fn(*args, **kw)  # noqa
                td_ours, td_floor = graph_time(ours), graph_time(fl)
                tc_ours, tc_floor = call_time(ours), call_time(fl)
                print(f"{name:8s} {N:>6d}x{T:<7d} {'TM' if tm else 'BM':3s} {err:8.1e} "
                      f"{td_ours:8.1f} {td_floor:8.1f} {td_ours / td_floor:6.2f} {tc_ours:8.1f} "
                      f"{tc_floor:8.1f} {nbytes / td_ours / 1e3:6.0f}", flush=True)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"total {time.time() - t0:.0f} s")
