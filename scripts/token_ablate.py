"""Where the token scan's time goes: the scan's loop with its parts taken away, one at a
time, and the same loop with each warp scanning its own segment of the response (no
exchange between warps inside the loop).

Timing only: every level below 5, and every W > 1, gives wrong advantages. verl's skip
mode, fp32, right-padded [N, T], no whitening.

    python scripts/token_ablate.py [--shape 256x4096]

LEVEL 1: loads and stores (h = r - v where valid); 2: + each thread's row maps composed
and the step run over its row from the zero state; 3: + the scan across the rows (the
state entering a row taken as the scan's output, no gather); 4: + the gather; 5: + the
carry to the next chunk by a reduction of the last row (the loop before 2026-12-03); 6:
the carry by a gather from the last row instead (the loop since; W = 1 only). W: segments of the
response, one a warp (rows of a segment are a warp's lanes); W = 1 is the production
layout. Then the whitening pass alone, with and without its combine of the statistics.
"""
import argparse

import torch
import triton
import triton.language as tl

from rl_triton_core._token_kernel import (
    MODE_GAE_SKIP,
    _add2,
    _cols,
    _combine2,
    _compose,
    _loads,
    _step,
    _uncols,
)


@triton.jit
def _seg(x, W: tl.constexpr, RW: tl.constexpr):
    """[W * RW] -> [W, RW] (a warp's lanes: one segment's rows)."""
    y = x
    if W > 1:
        y = tl.reshape(x, [W, RW])
    return y


@triton.jit
def _flat(x, W: tl.constexpr, RW: tl.constexpr):
    y = x
    if W > 1:
        y = tl.reshape(x, [W * RW])
    return y


@triton.jit
def abl_kernel(R, V, M, ADV, RET, srn, smn, T, g, gl, LEVEL: tl.constexpr,
               W: tl.constexpr, RW: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    R += row * srn
    V += row * srn
    M += row * smn
    ADV += row * T
    RET += row * T
    BT: tl.constexpr = 4 * RW
    S = tl.cdiv(T, W * BT) * BT  # segments of whole chunks (aligned loads)
    rho = tl.arange(0, W * RW)[:, None]
    wi = rho // RW
    i = rho % RW
    j = tl.arange(0, 4)[None, :]
    lo = wi * S
    hi = tl.minimum(lo + S, T)
    if W == 1:
        lane = tl.arange(0, RW)
        z2 = tl.full([], 0.0, tl.float32)
        if LEVEL == 6:
            z2 = tl.zeros([RW], tl.float32)
    else:
        lane = tl.arange(0, RW)[None, :]
        z2 = tl.zeros([W, 1], tl.float32)
    carry = z2
    carry_nv = z2
    n_chunks = tl.cdiv(S, BT)
    top = n_chunks * BT
    t = lo + top - 4 * (i + 1) + j
    ok = (t >= lo) & (t < hi)
    m, r, v = _loads(R, V, M, t, ok, 1, 1, 1, MODE_GAE_SKIP, False)
    for _ in range(0, n_chunks):
        top -= BT
        tn = lo + top - 4 * (i + 1) + j
        okn = (tn >= lo) & (tn < hi)
        nxt = _loads(R, V, M, tn, okn, 1, 1, 1, MODE_GAE_SKIP, False)
        if LEVEL == 1:
            h = tl.where(m, r - v, 0.0)
        else:
            m0, m1, m2, m3 = _cols(m)
            r0, r1, r2, r3 = _cols(r)
            v0, v1, v2, v3 = _cols(v)
            o0, o1, o2, o3 = _cols(ok)
            z1 = tl.zeros([W * RW], tl.float32)
            if LEVEL == 2:
                a = z1
                n = z1
            else:
                w = (z1, z1, z1 + 1.0, z1, z1 + 1.0)
                w = _compose(w, m3, r3, v3, o3, g, gl, MODE_GAE_SKIP)
                w = _compose(w, m2, r2, v2, o2, g, gl, MODE_GAE_SKIP)
                w = _compose(w, m1, r1, v1, o1, g, gl, MODE_GAE_SKIP)
                w = _compose(w, m0, r0, v0, o0, g, gl, MODE_GAE_SKIP)
                pr, qr, xr, yr, zr = tl.associative_scan(
                    (_seg(w[0], W, RW), _seg(w[1], W, RW), _seg(w[2], W, RW),
                     _seg(w[3], W, RW), _seg(w[4], W, RW)), W > 1, _combine2)
                oa = pr + xr * carry + yr * carry_nv
                on = qr + zr * carry_nv
                if LEVEL == 3:
                    a = oa
                    n = on
                else:
                    prev = tl.maximum(lane - 1, 0) + tl.zeros_like(oa).to(tl.int32)
                    a = tl.where(lane == 0, carry, tl.gather(oa, prev, W > 1))
                    n = tl.where(lane == 0, carry_nv, tl.gather(on, prev, W > 1))
                    if LEVEL == 6:  # the carry by a gather from the last row
                        idx = tl.zeros_like(oa).to(tl.int32) + (RW - 1)
                        carry = tl.gather(oa, idx, W > 1)
                        carry_nv = tl.gather(on, idx, W > 1)
                    elif LEVEL >= 5:
                        last = lane == RW - 1
                        ca, cn = tl.reduce((tl.where(last, oa, 0.0), tl.where(last, on, 0.0)),
                                           W > 1, _add2)
                        if W == 1:
                            carry = ca
                            carry_nv = cn
                        else:
                            carry = ca[:, None]
                            carry_nv = cn[:, None]
                a = _flat(a, W, RW)
                n = _flat(n, W, RW)
            h3, n = _step(m3, r3, v3, o3, a, n, g, gl, MODE_GAE_SKIP)
            h2, n = _step(m2, r2, v2, o2, h3, n, g, gl, MODE_GAE_SKIP)
            h1, n = _step(m1, r1, v1, o1, h2, n, g, gl, MODE_GAE_SKIP)
            h0, n = _step(m0, r0, v0, o0, h1, n, g, gl, MODE_GAE_SKIP)
            h = _uncols(h0, h1, h2, h3)
        tl.store(ADV + t, h, mask=ok)
        tl.store(RET + t, h + v, mask=ok)
        t = tn
        ok = okn
        m, r, v = nxt


def whiten_only(x, ws, n_rows, norm):
    """The library's whitening pass on contiguous x, with (norm) or without its combine of
    the n_rows statistics and its normalisation."""
    from rl_triton_core import _token_kernel as K
    from rl_triton_core._launch import _sm_count

    per_sm, block, warps = K.WHITEN_TILE
    n_blocks = triton.cdiv(x.numel(), block)
    K.whiten_kernel[(max(1, min(n_blocks, per_sm * _sm_count(x.device))),)](
        x, x, x, ws, n_rows, x.stride(0), x.stride(1), 0, 0, x.shape[1], x.numel(), n_blocks,
        triton.cdiv(x.shape[1], block), 0.0, *K._hilo(1e-8), *K._hilo(1e-8), NORM=norm,
        SHIFT=True, FILL=False, FLAT=True, UNBIASED=True, FP64=False, BLOCK=block,
        RB=max(128, min(2048, triton.next_power_of_2(n_rows))), num_warps=warps)
    return (x,)


def launch(r, v, m, adv, ret, level, W, RW, warps):
    if level == 6 and W != 1:
        raise ValueError("level 6 (the carry by a gather) is built for W = 1 only")
    abl_kernel[(r.shape[0],)](r, v, m, adv, ret, r.stride(0), m.stride(0), r.shape[1],
                              1.0, 0.95, LEVEL=level, W=W, RW=RW, num_warps=warps)
    return adv, ret


if __name__ == "__main__":
    import rl_triton_core as rc
    from rl_triton_core.bench import harness
    from rl_triton_core.bench import peers as P
    from rl_triton_core.bench.tokens import inputs

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="256x4096")
    ap.add_argument("--runs", default="1:1:256:8,2:1:256:8,3:1:256:8,4:1:256:8,5:1:256:8,"
                    "1:1:64:2,1:1:128:4,1:1:512:8,5:1:128:4,5:1:64:2,"
                    "1:8:32:8,2:8:32:8,3:8:32:8,4:8:32:8,5:8:32:8,5:4:32:4,"
                    "5:16:32:16,5:2:32:2,5:4:32:2")
    opts = ap.parse_args()
    timer = harness.Timer("cuda", 100)
    B, T = (int(s) for s in opts.shape.split("x"))
    r, v, m = inputs(B, T, torch.float32, "cuda")
    adv = torch.empty(B, T, device="cuda")
    ret = torch.empty(B, T, device="cuda")
    f1 = timer.measure(P.make_floor([r, v, m], [], [], 2, (B, T), torch.float32),
                       graph=True)["device_us"]
    ours = timer.measure(lambda: rc.masked_gae(r, v, m, gamma=1.0, lmbda=0.95, whiten=False,
                                               time_dim=-1), graph=True)["device_us"]
    want = rc.masked_gae(r, v, m, gamma=1.0, lmbda=0.95, whiten=False, time_dim=-1)[0]
    print(f"{opts.shape}: floor pass 1 {f1:.1f} µs, the library's scan {ours:.1f} µs")
    print("| level | W | rows a segment | warps | device µs | / floor | max err (level 5, W 1) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for run in opts.runs.split(","):
        lv, W, RW, w = (int(x) for x in run.split(":"))
        d = timer.measure(lambda lv=lv, W=W, RW=RW, w=w: launch(r, v, m, adv, ret, lv, W, RW, w),
                          graph=True)["device_us"]
        err = ""
        if lv == 5 and W == 1:
            adv.fill_(float("nan"))
            launch(r, v, m, adv, ret, lv, W, RW, w)
            err = f"{(adv - want).abs().max().item():.1e}"
        print(f"| {lv} | {W} | {RW} | {w} | {d:.1f} | {d / f1:.2f} | {err} |", flush=True)
    # the whitening pass: with its combine of the statistics, without, and its floor
    ws = torch.stack([torch.full((B,), float(T), device="cuda"), torch.randn(B, device="cuda"),
                      torch.rand(B, device="cuda") * T]).reshape(-1)
    f2 = timer.measure(P.make_floor([adv], [], [], 1, (B, T), torch.float32),
                       graph=True)["device_us"]
    wn = timer.measure(lambda: whiten_only(adv, ws, B, True), graph=True)["device_us"]
    w0 = timer.measure(lambda: whiten_only(adv, ws, B, False), graph=True)["device_us"]
    print(f"whitening pass: floor pass 2 {f2:.1f} µs, ours {wn:.1f}, ours without the "
          f"combine and normalisation (a copy) {w0:.1f}")
