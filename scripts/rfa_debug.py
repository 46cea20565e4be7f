"""GPU check: the fused retrace_from_actions pass against the two passes (int64 actions),
and int64 flags on whole-row tiles of the scan against the float64 reference.

    python scripts/rfa_debug.py
"""

import torch

import rl_triton_core as rc
from rl_triton_core import _config
from rl_triton_core import reference as ref

dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)


def rand(*shape):
    return torch.randn(*shape, device=dev, generator=g)


def flags(shape, p=0.02):
    return torch.rand(shape, device=dev, generator=g) < p


def case(N, T, A, adt, lm, cb, calls):
    q, r = rand(N, T, A), rand(N, T)
    p = torch.softmax(rand(N, T, A), -1)
    act = torch.randint(0, A, (N, T), device=dev, generator=g, dtype=adt)
    lmu = torch.log(torch.rand(N, T, device=dev, generator=g) * 0.9 + 0.05)
    term, tr = flags((N, T)), flags((N, T))
    kw = dict(gamma=0.99, lmbda=lm, c_bar=cb, time_dim=-1, bootstrap_q_values=rand(N, A),
              bootstrap_target_probs=torch.softmax(rand(N, A), -1))
    with _config.tuning(fused_actions=False):
        want = rc.retrace_from_actions(q, p, act, lmu, r, term, tr, **kw)
    with _config.tuning(fused_actions=True):
        for _ in range(calls):
            got = rc.retrace_from_actions(q, p, act, lmu, r, term, tr, **kw)
    err = (got - want).abs()
    bad = (err > 1e-3).nonzero()
    msg = f"rfa {N}x{T} A={A} {adt}: max {err.max().item():.3g}"
    if len(bad):
        msg += (f" WRONG: {len(bad)} steps, rows {bad[:, 0].unique()[:8].tolist()}, "
                f"steps {bad[:, 1].unique()[:12].tolist()}")
    print(msg, flush=True)


def flags64(N, T):
    r, v, nv = rand(N, T), rand(N, T), rand(N, T)
    lr = rand(N, T) * 0.3
    term, tr = flags((N, T)).long(), flags((N, T)).long()
    d = torch.Tensor.double
    kw = dict(time_dim=-1)
    for name, got, want in (
        ("gae", rc.gae(r, v, term, tr, next_values=nv, **kw)[0],
         ref.gae(d(r), d(v), term, tr, next_values=d(nv), **kw)[0]),
        ("vtrace", rc.vtrace(lr, r, v, term, tr, next_values=nv, **kw)[0],
         ref.vtrace(d(lr), d(r), d(v), term, tr, next_values=d(nv), **kw)[0]),
        ("traces", rc.eligibility_traces(r, term, **kw),
         ref.eligibility_traces(d(r), term, **kw)),
        ("cumsum", rc.episodic_cumsum(r, term, **kw), ref.episodic_cumsum(d(r), term, **kw))):
        err = (got.double() - want).abs().max().item()
        print(f"int64 flags {name} {N}x{T}: max err {err:.3g}",
              "WRONG" if err > 1e-3 else "ok", flush=True)


for N, T in ((512, 4096), (1024, 2048), (512, 1024), (256, 1024), (4096, 128), (16384, 512)):
    case(N, T, 6, torch.int64, 0.85, 1.3, 3)
for N, T in ((512, 4096), (1024, 2048), (140, 4096)):
    flags64(N, T)
