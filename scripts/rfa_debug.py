"""GPU check: the fused retrace_from_actions pass against the two passes (int64 actions),
and int64 flags on whole-row tiles of the scan against the float64 reference."""
import itertools, torch
import rl_triton_core as rc
from rl_triton_core import _config, _dispatch
dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)
def case(N, T, A, adt, lm, cb, calls):
    q = torch.randn(N, T, A, device=dev, generator=g)
    p = torch.softmax(torch.randn(N, T, A, device=dev, generator=g), -1)
    act = torch.randint(0, A, (N, T), device=dev, generator=g, dtype=adt)
    lmu = torch.log(torch.rand(N, T, device=dev, generator=g) * 0.9 + 0.05)
    r = torch.randn(N, T, device=dev, generator=g)
    term = torch.rand(N, T, device=dev, generator=g) < 0.02
    tr = torch.rand(N, T, device=dev, generator=g) < 0.02
    bq = torch.randn(N, A, device=dev, generator=g)
    bp = torch.softmax(torch.randn(N, A, device=dev, generator=g), -1)
    kw = dict(gamma=0.99, lmbda=lm, c_bar=cb, time_dim=-1, bootstrap_q_values=bq,
              bootstrap_target_probs=bp)
    with _config.tuning(fused_actions=False):
        want = rc.retrace_from_actions(q, p, act, lmu, r, term, tr, **kw)
    with _config.tuning(fused_actions=True):
        for _ in range(calls):
            got = rc.retrace_from_actions(q, p, act, lmu, r, term, tr, **kw)
    err = (got - want).abs()
    bad = (err > 1e-3).nonzero()
    msg = f"{N}x{T} A={A} {adt} lm={lm} cb={cb} calls={calls}: max {err.max().item():.3g}"
    if len(bad):
        msg += f" bad={len(bad)} rows {bad[:,0].unique()[:8].tolist()} cols {bad[:,1].unique()[:12].tolist()} nan={got.isnan().sum().item()}"
    print(msg, flush=True)
for N, T in ((512, 4096), (1024, 2048), (512, 1024), (256, 1024), (4096, 128), (16384, 512)):
    case(N, T, 6, torch.int64, 0.85, 1.3, 3)
"""GPU check: int64 flags at whole-row tiles of 2048-4096 steps (8-16 steps a thread)."""
import torch
import rl_triton_core as rc
from rl_triton_core import reference as ref
dev = "cuda"
g = torch.Generator(device=dev).manual_seed(1)
for N, T in ((512, 4096), (1024, 2048), (140, 4096)):
    r, v, nv = (torch.randn(N, T, device=dev, generator=g) for _ in range(3))
    lr = torch.randn(N, T, device=dev, generator=g) * 0.3
    term = (torch.rand(N, T, device=dev, generator=g) < 0.02).long()
    tr = (torch.rand(N, T, device=dev, generator=g) < 0.02).long()
    d = lambda x: x.double()
    for name, got, want in (
        ("gae", rc.gae(r, v, term, tr, next_values=nv, gamma=0.99, lmbda=0.95, time_dim=-1)[0],
         ref.gae(d(r), d(v), term, tr, next_values=d(nv), gamma=0.99, lmbda=0.95, time_dim=-1)[0]),
        ("vtrace", rc.vtrace(lr, r, v, term, tr, next_values=nv, gamma=0.99, time_dim=-1)[0],
         ref.vtrace(d(lr), d(r), d(v), term, tr, next_values=d(nv), gamma=0.99, time_dim=-1)[0]),
        ("traces", rc.eligibility_traces(r, term, gamma=0.99, lmbda=0.9, time_dim=-1),
         ref.eligibility_traces(d(r), term, gamma=0.99, lmbda=0.9, time_dim=-1)),
        ("cumsum", rc.episodic_cumsum(r, term, time_dim=-1),
         ref.episodic_cumsum(d(r), term, time_dim=-1))):
        err = (got.double() - want).abs().max().item()
        print(f"int64 flags {name} {N}x{T}: max err {err:.3g}", "WRONG" if err > 1e-3 else "ok", flush=True)
