"""The package works where Triton does not install (macOS, Windows, a CPU-only image).

``triton`` is a Linux-only dependency (``sys_platform == "linux"`` in pyproject.toml),
so ``import rl_triton_core`` and every public estimator, forward and backward, must run
on the CPU path without it. A child interpreter (this test process has imported triton
already) puts a ``sys.meta_path`` finder first that refuses ``triton`` and every
``triton.*`` module, as a missing install would, then calls each estimator on small
random CPU float32 tensors against the float64 reference, differentiates through
gae, vtrace, eligibility_traces and linear_recurrence, and checks that triton never got
into ``sys.modules``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = r'''
import importlib.abc
import sys


class _NoTriton(importlib.abc.MetaPathFinder):
    """Refuses triton and its submodules, as an interpreter without triton installed."""

    blocked = []

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "triton" or fullname.startswith("triton."):
            self.blocked.append(fullname)
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked by the test)",
                                      name=fullname)
        return None


sys.meta_path.insert(0, _NoTriton())
assert "triton" not in sys.modules

import torch

import rl_triton_core as rc
from rl_triton_core import reference as ref

torch.manual_seed(0)
F32 = torch.float32
B, T, A = 3, 17, 4
GAMMA, LMBDA = 0.9, 0.8


def data(shape):
    return torch.randn(shape, dtype=F32)


def flags(shape, p=0.2):
    return torch.rand(shape) < p


def close(name, got, expected):
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(got) == len(expected), name
    for g, e in zip(got, expected):
        assert g.dtype == F32, (name, g.dtype)
        torch.testing.assert_close(g.double(), e.double(), rtol=1e-4, atol=1e-4,
                                   msg=lambda m: f"{name}: {m}")


def check_grads(name, leaves):
    for key, leaf in leaves.items():
        g = leaf.grad
        assert g is not None, f"{name}: no gradient reached {key}"
        assert g.shape == leaf.shape, (name, key, g.shape)
        assert torch.isfinite(g).all(), f"{name}: non-finite gradient to {key}"
        assert (g != 0).any(), f"{name}: all-zero gradient to {key}"


def ref_grads(name, fn, leaves, weights):
    """The gradients of the float64 reference (plain torch ops, differentiable) at the
    same point, for the same weighted sum."""
    ref_leaves = {k: v.detach().double().requires_grad_(True) for k, v in leaves.items()}
    out = fn(**ref_leaves)
    out = out if isinstance(out, tuple) else (out,)
    sum((o * w.double()).sum() for o, w in zip(out, weights)).backward()
    for key, leaf in leaves.items():
        torch.testing.assert_close(leaf.grad.double(), ref_leaves[key].grad, rtol=1e-4,
                                   atol=1e-4, msg=lambda m: f"{name} grad {key}: {m}")


def backward(name, fn, reference, leaves):
    leaves = {k: v.clone().requires_grad_(True) for k, v in leaves.items()}
    out = fn(**leaves)
    out = out if isinstance(out, tuple) else (out,)
    assert all(o.requires_grad for o in out), f"{name}: output does not require grad"
    weights = [torch.randn(o.shape, dtype=F32) for o in out]
    sum((o * w).sum() for o, w in zip(out, weights)).backward()
    check_grads(name, leaves)
    ref_grads(name, reference, leaves, weights)


# batch-major [B, T] with time_dim=1 and time-major [T, B] with time_dim=0
for td, shape in ((1, (B, T)), (0, (T, B))):
    notime = (B,)
    r, v, nv = data(shape), data(shape), data(shape)
    term, trunc = flags(shape), flags(shape)
    boot = data(notime)
    log_rhos = 0.5 * data(shape)
    common = dict(gamma=GAMMA, time_dim=td)

    close(f"gae td={td}",
          rc.gae(r, v, term, trunc, bootstrap_value=boot, lmbda=LMBDA, **common),
          ref.gae(r, v, term, trunc, bootstrap_value=boot, lmbda=LMBDA, **common))
    close(f"gae next_values td={td}",
          rc.gae(r, v, term, trunc, next_values=nv, lmbda=LMBDA, **common),
          ref.gae(r, v, term, trunc, next_values=nv, lmbda=LMBDA, **common))
    close(f"lambda_returns td={td}",
          rc.lambda_returns(r, v, term, trunc, bootstrap_value=boot, lmbda=LMBDA, **common),
          ref.lambda_returns(r, v, term, trunc, bootstrap_value=boot, lmbda=LMBDA, **common))
    close(f"discounted_returns td={td}",
          rc.discounted_returns(r, term, trunc, next_values=nv, **common),
          ref.discounted_returns(r, term, trunc, next_values=nv, **common))
    vkw = dict(lmbda=LMBDA, rho_bar=1.0, c_bar=0.9, pg_rho_bar=1.2, **common)
    close(f"vtrace td={td}",
          rc.vtrace(log_rhos, r, v, term, trunc, bootstrap_value=boot, **vkw),
          ref.vtrace(log_rhos, r, v, term, trunc, bootstrap_value=boot, **vkw))
    expected_next_q = data(shape)
    close(f"retrace td={td}",
          rc.retrace(log_rhos, r, v, expected_next_q, term, trunc, lmbda=LMBDA, c_bar=1.0,
                     **common),
          ref.retrace(log_rhos, r, v, expected_next_q, term, trunc, lmbda=LMBDA, c_bar=1.0,
                      **common))

    # retrace_from_actions: per-action tensors [*shape, A], explicit next state
    q_all = data((*shape, A))
    probs = torch.softmax(data((*shape, A)), -1)
    actions = torch.randint(0, A, shape)
    mu_log = torch.log(torch.softmax(data((*shape, A)), -1)).gather(
        -1, actions.unsqueeze(-1)).squeeze(-1)
    next_q, next_probs = data((*shape, A)), torch.softmax(data((*shape, A)), -1)
    idx = actions.unsqueeze(-1)
    q_taken = q_all.gather(-1, idx).squeeze(-1)
    lr = probs.gather(-1, idx).squeeze(-1).double().log() - mu_log.double()
    close(f"retrace_from_actions td={td}",
          rc.retrace_from_actions(q_all, probs, actions, mu_log, r, term, trunc,
                                  next_q_values=next_q, next_target_probs=next_probs,
                                  lmbda=LMBDA, c_bar=1.0, **common),
          ref.retrace(lr, r, q_taken, ref.expected_next_q_from_actions(next_probs, next_q),
                      term, trunc, lmbda=LMBDA, c_bar=1.0, **common))

    x, done, init = data(shape), flags(shape), data(notime)
    close(f"eligibility_traces td={td}",
          rc.eligibility_traces(x, done, gamma=GAMMA, lmbda=LMBDA, init=init, time_dim=td),
          ref.eligibility_traces(x, done, gamma=GAMMA, lmbda=LMBDA, init=init, time_dim=td))
    close(f"episodic_cumsum td={td}",
          rc.episodic_cumsum(x, done, init=init, time_dim=td),
          ref.episodic_cumsum(x, done, init=init, time_dim=td))
    alpha, beta = data(shape), torch.rand(shape, dtype=F32)
    for reverse in (True, False):
        close(f"linear_recurrence reverse={reverse} td={td}",
              rc.linear_recurrence(alpha, beta, reverse=reverse, init=init, time_dim=td),
              ref.linear_recurrence(alpha, beta, reverse=reverse, init=init, time_dim=td))

    # backward passes (the adjoint scans run on the same CPU path)
    backward(
        f"gae td={td}",
        lambda rewards, values, bootstrap_value: rc.gae(
            rewards, values, term, trunc, bootstrap_value=bootstrap_value, lmbda=LMBDA,
            **common),
        lambda rewards, values, bootstrap_value: ref.gae(
            rewards, values, term, trunc, bootstrap_value=bootstrap_value, lmbda=LMBDA,
            **common),
        dict(rewards=r, values=v, bootstrap_value=boot))
    backward(
        f"vtrace td={td}",
        lambda rewards, values, next_values: rc.vtrace(
            log_rhos, rewards, values, term, trunc, next_values=next_values, **vkw),
        lambda rewards, values, next_values: ref.vtrace(
            log_rhos, rewards, values, term, trunc, next_values=next_values, **vkw),
        dict(rewards=r, values=v, next_values=nv))
    backward(
        f"eligibility_traces td={td}",
        lambda x, init: rc.eligibility_traces(x, done, gamma=GAMMA, lmbda=LMBDA, init=init,
                                              time_dim=td),
        lambda x, init: ref.eligibility_traces(x, done, gamma=GAMMA, lmbda=LMBDA, init=init,
                                               time_dim=td),
        dict(x=x, init=init))
    for reverse in (True, False):
        backward(
            f"linear_recurrence reverse={reverse} td={td}",
            lambda alpha, beta, init: rc.linear_recurrence(alpha, beta, reverse=reverse,
                                                           init=init, time_dim=td),
            lambda alpha, beta, init: ref.linear_recurrence(alpha, beta, reverse=reverse,
                                                            init=init, time_dim=td),
            dict(alpha=alpha, beta=beta, init=init))

loaded = sorted(m for m in sys.modules if m == "triton" or m.startswith("triton."))
assert not loaded, f"triton modules got imported: {loaded}"
print(f"NO-TRITON OK (refused imports: {sorted(set(_NoTriton.blocked))})")
'''


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in ("TRITON_INTERPRET", "RL_TRITON_CORE_BACKEND"):
        env.pop(key, None)
    # the child imports the rl_triton_core this test process would (a source checkout
    # or an install), found without importing it here
    spec = importlib.util.find_spec("rl_triton_core")
    assert spec is not None and spec.origin, "rl_triton_core is not importable"
    root = str(Path(spec.origin).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def test_the_package_works_with_triton_blocked(tmp_path):
    # cwd outside the source tree: the child finds the package through PYTHONPATH only
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          env=_child_env(), cwd=tmp_path, timeout=900)
    if proc.returncode != 0 or "NO-TRITON OK" not in proc.stdout:
        pytest.fail(
            f"with triton blocked, the child exited {proc.returncode}\n"
            f"--- child stdout ---\n{proc.stdout[-4000:]}\n"
            f"--- child stderr ---\n{proc.stderr[-12000:]}",
            pytrace=False,
        )
