"""Compile the scan kernel for sm_90 on a machine without a GPU and count its SASS.

Runs a real estimator call on CPU tensors shaped like the GPU case, catches the
kernel launch, compiles the same specialisation with Triton's bundled ptxas and
reports registers, spills, and the instruction mix per element. Used to iterate
on the kernel's code generation offline (docs/notes.md); no device time.

    python scripts/sass_report.py                      # default cases
    python scripts/sass_report.py --dump gae-bm        # also write PTX/SASS to /tmp
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import torch
import triton
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import ASTSource

import rl_triton_core as rtc
from rl_triton_core import _launch

TARGET = GPUTarget("cuda", 90, 32)
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


class _Recorder:
    def __init__(self, fn):
        self.fn = fn
        self.calls = []

    def __getitem__(self, grid):
        def launch(*args, num_warps=4, **kw):
            self.calls.append((grid, args, kw, num_warps))
            return None
        return launch


def capture(call):
    """The launches (grid, args, constexprs, num_warps) one estimator call makes."""
    real = _launch.scan_kernel
    rec = _Recorder(real.fn)
    _launch.scan_kernel = rec
    os.environ["RL_TRITON_CORE_BACKEND"] = "triton"
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        call()
    finally:
        _launch.scan_kernel = real
        del os.environ["TRITON_INTERPRET"]
        del os.environ["RL_TRITON_CORE_BACKEND"]
    return rec.calls


def _specialize(a, path, consts, attrs, do_not_specialize=False):
    """The signature type of one argument (tuples nested), as the launcher computes it."""
    if isinstance(a, tuple):
        return tuple(_specialize(x, path + (j,), consts, attrs) for j, x in enumerate(a))
    if do_not_specialize:  # as the launcher: a plain i32, no "1" constant
        return "i32"
    ty, spec = native_specialize_impl(BaseBackend, a, False, True, True)
    if isinstance(ty, str) and ty == "constexpr":
        consts[path] = spec
        return "constexpr"
    if spec == "D":
        attrs[path] = [["tt.divisibility", 16]]
    return ty


def compile_sm90(args, constexprs, num_warps, base=None):
    import inspect

    fn = _launch.scan_kernel
    names = list(inspect.signature(fn.fn).parameters)
    signature, consts, attrs = {}, {}, {}
    pos = 0
    for i, name in enumerate(names):
        if name in constexprs:
            signature[name] = "constexpr"
            consts[(i,)] = constexprs[name]
            continue
        a = args[pos]
        pos += 1
        signature[name] = _specialize(a, (i,), consts, attrs, fn.params[i].do_not_specialize)
    src = ASTSource(fn, signature, consts, attrs)
    ck = triton.compile(src, target=TARGET, options={"num_warps": num_warps})
    return ck


def sass_of(ck):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(ck.asm["cubin"])
        path = f.name
    out = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", path], capture_output=True,
                         text=True, check=True).stdout
    os.unlink(path)
    return out


def summarize(ck, elems_per_program):
    sass = sass_of(ck)
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            ops[m.group(1)] += 1
    total = sum(ops.values())
    ldg = {k: v for k, v in ops.items() if k.startswith("LDG")}
    stg = {k: v for k, v in ops.items() if k.startswith("STG")}
    shfl = sum(v for k, v in ops.items() if k.startswith("SHFL"))
    sts = sum(v for k, v in ops.items() if k.startswith(("STS", "LDS")))
    bar = sum(v for k, v in ops.items() if k.startswith("BAR"))
    meta = ck.metadata
    n_regs = getattr(ck, "n_regs", None)
    return dict(total=total, ldg=ldg, stg=stg, shfl=shfl, smem_ops=sts, bar=bar,
                shared=meta.shared, num_warps=meta.num_warps, n_regs=n_regs,
                per_elem=total * meta.num_warps * 32 / elems_per_program, sass=sass,
                ptx=ck.asm["ptx"])


def cases():
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g)

    def d(*s):
        return torch.rand(*s, generator=g) < 0.05

    out = {}
    for name, (N, T) in {"4096x128": (4096, 128), "16384x512": (16384, 512),
                         "1x1M": (1, 1 << 20)}.items():
        for lay in ("bm", "tm"):
            shp = (N, T) if lay == "bm" else (T, N)
            td = -1 if lay == "bm" else 0
            rw, vv, te, tr, lr = r(*shp), r(*shp), d(*shp), d(*shp), r(*shp) * 0.3
            bs = r(N)
            out[f"gae-{lay}-{name}"] = (lambda rw=rw, vv=vv, te=te, tr=tr, bs=bs, td=td:
                                        rtc.gae(rw, vv, te, tr, bootstrap_value=bs, gamma=0.99,
                                                lmbda=0.95, time_dim=td))
            out[f"vtrace-{lay}-{name}"] = (lambda rw=rw, vv=vv, te=te, tr=tr, bs=bs, lr=lr, td=td:
                                           rtc.vtrace(lr, rw, vv, te, tr, bootstrap_value=bs,
                                                      gamma=0.99, time_dim=td))
            out[f"cumsum-{lay}-{name}"] = (lambda rw=rw, te=te, td=td:
                                           rtc.episodic_cumsum(rw, te, time_dim=td))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--only", default="")
    p.add_argument("--dump", default="")
    a = p.parse_args()
    for name, call in cases().items():
        if a.only and not re.search(a.only, name):
            continue
        for grid, args, kw, nw in capture(call):
            bn, bt = kw["BLOCK_N"], kw["BLOCK_T"]
            ck = compile_sm90(args, kw, nw)
            s = summarize(ck, bn * bt)
            print(f"{name:22s} ph{kw['PHASE']} grid={grid} tile={bn}x{bt} w={nw} "
                  f"regs={s['n_regs']} smem={s['shared']} sass={s['total']} "
                  f"instr/elem~{s['per_elem']:.1f} ldg={s['ldg']} stg={s['stg']} "
                  f"shfl={s['shfl']} lds/sts={s['smem_ops']} bar={s['bar']}")
            if a.dump and re.search(a.dump, name):
                base = f"/tmp/sass_{name}_ph{kw['PHASE']}"
                open(base + ".sass", "w").write(s["sass"])
                open(base + ".ptx", "w").write(s["ptx"])


if __name__ == "__main__":
    main()
