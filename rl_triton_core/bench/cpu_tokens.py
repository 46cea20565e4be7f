"""CPU: token-level masked GAE with whitening against verl, and against the floor.

    python -m rl_triton_core.bench.cpu_tokens [--reps 20] [--shapes 1024x8192,256x4096]

* peer: verl 0.9.1's ``compute_gae_advantage_return`` (``verl.trainer.ppo.core_algos``:
  its Python loop over tokens, then ``verl_F.masked_whiten``);
* ours: ``rl_triton_core.masked_gae(skip=True, whiten=True, count_eps=1e-8)``, what the
  verl drop-in (``integrations/verl``) calls, new output tensors every call;
* floor: the same bytes moved by the fastest vectorised code at hand -- rewards, values
  and the mask read once, the two outputs written, no recurrence: numpy ufuncs with
  ``out=`` over row blocks on one thread and split over two Python threads (numpy
  releases the GIL), torch ops with ``out=`` on one and on all torch threads, and C
  passes (``_cscan.floor``: each input read once, in L1-sized blocks; ``floor_fused``:
  every input in one loop, outputs streamed) on one and two threads; each with two
  outputs of its own, preallocated and reused; the fastest of them.

Inputs as ``rl_triton_core.bench.tokens``: fp32 rewards and values, verl's int64 response
mask (right padding to random lengths, 5% observation tokens). The three run interleaved
in one process (same machine load), median of ``reps`` calls each after warm-up.
"""

from __future__ import annotations

import argparse
import threading

import numpy as np
import torch

from rl_triton_core.bench._timing import median_ms

SHAPES = ((1024, 8192), (256, 4096))
GAMMA, LAM = 1.0, 0.95


def _floors(r, v, m):
    """The floor's candidates: callables that read r, v, m once and write two outputs,
    each candidate into two outputs of its own (as cpu_peers.floor_variants: shared
    outputs would be in the caches because another candidate had just written them)."""
    names = list(_floor_set(r, v, m))
    return {name: _floor_set(r, v, m, name)[name] for name in names}


def _floor_set(r, v, m, only=None):
    """Every candidate (or just ``only``), all writing into one pair of outputs."""
    o0, o1 = torch.empty_like(r), torch.empty_like(r)
    rn, vn, mn, a0, a1 = r.numpy(), v.numpy(), m.numpy(), o0.numpy(), o1.numpy()
    B = r.shape[0]
    step = max(1, (1 << 16) // max(r.shape[1], 1))  # row blocks: the inputs once, in cache

    def np_rows(lo, hi):
        for i in range(lo, hi, step):
            j = min(i + step, hi)
            np.add(rn[i:j], vn[i:j], out=a0[i:j])
            np.copyto(a1[i:j], mn[i:j], casting="unsafe")

    def np1():
        np_rows(0, B)

    def np2():
        t = threading.Thread(target=np_rows, args=(B // 2, B))
        t.start()
        np_rows(0, B // 2)
        t.join()

    def torch_ops():
        torch.add(r, v, out=o0)
        o1.copy_(m)

    def torch1():
        n = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            torch_ops()
        finally:
            torch.set_num_threads(n)

    floors = {"numpy 1 thread": np1, "numpy 2 threads": np2, "torch 1 thread": torch1,
              "torch threads": torch_ops}
    try:  # the C passes (each input read once, vectorised), where the extension is built
        from rl_triton_core.scan import _cscan
    except ImportError:
        _cscan = None
    flat = [rn.reshape(-1), vn.reshape(-1), mn.reshape(-1)]
    if (_cscan is not None and all(a.flags.c_contiguous for a in flat)
            and mn.dtype in (np.int64, np.uint8, np.bool_)):
        flat[2] = flat[2].view(np.uint8) if mn.dtype == np.bool_ else flat[2]
        o0f, o1f = a0.reshape(-1), a1.reshape(-1)
        for name, fn in (("C", _cscan.floor), ("C fused", _cscan.floor_fused)):
            floors[f"{name} 1 thread"] = lambda fn=fn: fn(o0f, o1f, 1, *flat)
            floors[f"{name} 2 threads"] = lambda fn=fn: fn(o0f, o1f, 2, *flat)
    return floors if only is None else {only: floors[only]}


def _interleaved_ms(fns, reps):
    """Median ms of each callable, run interleaved ``reps`` times after two warm-ups (the
    cpu_peers rule: a fresh random order every round, so no callable always runs right
    after the peer)."""
    return dict(zip(fns, median_ms(list(fns.values()), reps)))


def verl_rows(reps=20, shapes=SHAPES):
    """Rows (dicts: peer, shape, peer_ms, ours_ms, floor_ms, max_err, floor_by) of verl 0.9.1's
    compute_gae_advantage_return against rl_triton_core's masked GAE with whitening."""
    from verl.trainer.ppo.core_algos import compute_gae_advantage_return

    import rl_triton_core as rc
    from rl_triton_core.bench.tokens import inputs

    rows = []
    for B, T in shapes:
        r, v, m = inputs(B, T, torch.float32, "cpu")

        def ours(r=r, v=v, m=m):
            return rc.masked_gae(r, v, m, gamma=GAMMA, lmbda=LAM, skip=True, whiten=True,
                                 count_eps=1e-8, time_dim=-1)

        def peer(r=r, v=v, m=m):
            return compute_gae_advantage_return(r, v, m, GAMMA, LAM)

        got, want = ours(), peer()
        err = max(float((a.double() - b.double()).abs().max()) for a, b in zip(got, want))
        del got, want
        floors = _floors(r, v, m)
        t = _interleaved_ms({"peer": peer, "ours": ours, **floors}, reps)
        by = min(floors, key=lambda k: t[k])
        rows.append(dict(peer="verl 0.9.1 compute_gae_advantage_return", shape=f"[{B}, {T}]",
                         peer_ms=t["peer"], ours_ms=t["ours"], floor_ms=t[by], max_err=err,
                         floor_by=by))
    return rows


def table(rows):
    lines = ["| peer | shape | peer ms | ours ms | floor ms | peer / ours | ours / floor "
             "| max err |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for w in rows:
        lines.append(f"| {w['peer']} | {w['shape']} | {w['peer_ms']:.1f} | {w['ours_ms']:.2f} "
                     f"| {w['floor_ms']:.2f} ({w.get('floor_by', '')}) "
                     f"| {w['peer_ms'] / w['ours_ms']:.0f}x "
                     f"| {w['ours_ms'] / w['floor_ms']:.2f}x | {w['max_err']:.1e} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", default=",".join(f"{b}x{t}" for b, t in SHAPES))
    opts = ap.parse_args(argv)
    shapes = [tuple(int(x) for x in s.lower().split("x")) for s in opts.shapes.split(",")]
    from rl_triton_core import tokens

    ck = tokens._ckernel()
    kernel = "numba" if ck is None else f"C ({ck.simd()})"
    print(f"torch {torch.__version__}, CPU kernel: {kernel}, {torch.get_num_threads()} torch "
          "threads\n")
    print(table(verl_rows(opts.reps, shapes)))


if __name__ == "__main__":
    main()
