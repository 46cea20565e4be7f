"""Two GPUs (issue 10): every estimator launches on its inputs' device, mixed devices
are refused, and GAE inside a two-process DDP step equals a single-GPU run.

Run on a machine with two GPUs: ``NCCL_NVLS_ENABLE=0 python -m pytest -m multigpu``.
"""

import os

import pytest
import torch

import rl_triton_core as rc
import rl_triton_core.reference as ref

pytestmark = [
    pytest.mark.multigpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                       reason="needs two CUDA GPUs"),
]


def _calls(dev, seed=0, B=6, T=300):
    g = torch.Generator().manual_seed(seed)
    r, v, lr, nv = (torch.randn(B, T, generator=g) for _ in range(4))
    te = torch.rand(B, T, generator=g) < 0.02
    tr = torch.rand(B, T, generator=g) < 0.02
    b = torch.randn(B, generator=g)
    x = [t.to(dev) for t in (r, v, lr, nv, te, tr, b)]
    r, v, lr, nv, te, tr, b = x
    return {
        "gae": (r, v, te, tr), "lambda_returns": (r, v, te, tr),
        "discounted_returns": (r, te, tr), "vtrace": (lr, r, v, te, tr),
        "retrace": (lr, r, v, nv, te, tr), "eligibility_traces": (r, te | tr),
        "episodic_cumsum": (r, te), "linear_recurrence": (r, torch.sigmoid(v)),
    }


class _kernels_on:
    """The scan kernels launched inside the block ran on GPU ``index`` (the profiler's
    record of each kernel: a launch on the current device with another GPU's pointers
    can still give the right numbers through peer access, so the numbers alone would
    not show a missing device guard)."""

    def __init__(self, index, kernel=("scan_kernel",)):
        from torch.profiler import ProfilerActivity, profile

        self.index, self.kernel = index, kernel  # the names to look for (any of them)
        self.prof = profile(activities=[ProfilerActivity.CUDA])

    def __enter__(self):
        self.prof.__enter__()

    def __exit__(self, *exc):
        torch.cuda.synchronize(self.index)
        self.prof.__exit__(*exc)
        if exc[0] is None:
            names = [(e.name, e.device_index) for e in self.prof.events()
                     if any(k in e.name for k in self.kernel)]
            assert names, f"the profiler saw no {self.kernel} launch"
            assert all(i == self.index for _, i in names), names


@pytest.mark.parametrize("repeat", [1, 2])  # the second call takes the cached launch path
@pytest.mark.parametrize("name", list(_calls("cpu")))
def test_runs_on_the_inputs_device(name, repeat, monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    torch.cuda.set_device(0)
    for _ in range(repeat):
        args = _calls("cuda:1")[name]
        with _kernels_on(1):
            out = getattr(rc, name)(*args)
        want = getattr(ref, name)(*[a.cpu() for a in args])
    out = out if isinstance(out, tuple) else (out,)
    want = want if isinstance(want, tuple) else (want,)
    for o, w in zip(out, want):
        assert o.device == torch.device("cuda:1")
        torch.testing.assert_close(o.double().cpu(), w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("repeat", [1, 2])
@pytest.mark.parametrize("name", ["masked_gae", "masked_whiten", "group_advantages"])
def test_llm_estimators_run_on_the_inputs_device(name, repeat, monkeypatch):
    """The token kernels and group_advantages' one launch, on cuda:1 while cuda:0 is
    current (the full path, then the recorded launch)."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    torch.cuda.set_device(0)
    g = torch.Generator().manual_seed(3)
    r, v = torch.randn(6, 40, generator=g), torch.randn(6, 40, generator=g)
    m = torch.rand(6, 40, generator=g) < 0.8
    s, ids = torch.randn(48, generator=g), torch.arange(48) // 6
    calls = {"masked_gae": (lambda *a: rc.masked_gae(*a, gamma=1.0, lmbda=0.95, time_dim=-1)[0],
                            (r, v, m), ("token_scan_kernel", "token_small_kernel")),
             "masked_whiten": (rc.masked_whiten, (r, m), ("whiten_kernel", "token_small_kernel")),
             "group_advantages": (rc.group_advantages, (s, ids), ("group_kernel",))}
    fn, args, kernel = calls[name]
    want = fn(*args)
    for _ in range(repeat):
        with _kernels_on(1, kernel):
            out = fn(*[a.to("cuda:1") for a in args])
    assert out.device == torch.device("cuda:1")
    torch.testing.assert_close(out.double().cpu(), want.double(), rtol=1e-5, atol=1e-5)


def test_gradients_on_the_inputs_device():
    torch.cuda.set_device(0)
    r, v, te, tr = _calls("cuda:1")["gae"]
    r = r.clone().requires_grad_(True)
    adv, _ = rc.gae(r, v, te, tr, time_dim=-1)
    with _kernels_on(1):  # the fused backward's kernel
        adv.sum().backward()
    assert r.grad.device == torch.device("cuda:1") and torch.isfinite(r.grad).all()


def test_mixed_devices_are_refused():
    r, v, te, tr = _calls("cuda:0")["gae"]
    with pytest.raises(ValueError, match="values is on cuda:1"):
        rc.gae(r, v.to("cuda:1"), te, tr, time_dim=-1)


def _ddp_worker(rank, world, port, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.distributed.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1).to(dev),
                                                      device_ids=[rank])
    g = torch.Generator().manual_seed(rank)
    obs = torch.randn(8, 64, 4, generator=g).to(dev)
    rewards = torch.randn(8, 64, generator=g).to(dev)
    term = (torch.rand(8, 64, generator=g) < 0.05).to(dev)
    values = model(obs).squeeze(-1)
    adv, target = rc.gae(rewards, values.detach(), term, gamma=0.99, lmbda=0.95, time_dim=-1)
    loss = ((values - target) ** 2).mean()
    loss.backward()
    torch.save({"adv": adv.cpu(), "target": target.cpu()}, f"{out_path}.{rank}")
    torch.distributed.destroy_process_group()


def test_ddp_step_matches_single_gpu(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "gae")
    mp.spawn(_ddp_worker, args=(2, port, out), nprocs=2, join=True)
    for rank in range(2):
        got = torch.load(f"{out}.{rank}")
        g = torch.Generator().manual_seed(rank)
        torch.randn(8, 64, 4, generator=g)
        rewards = torch.randn(8, 64, generator=g)
        term = torch.rand(8, 64, generator=g) < 0.05
        values = got["target"] - got["adv"]  # the values the rank used
        adv, target = ref.gae(rewards, values, term, gamma=0.99, lmbda=0.95, time_dim=-1)
        torch.testing.assert_close(got["adv"].double(), adv, rtol=1e-5, atol=1e-5)
