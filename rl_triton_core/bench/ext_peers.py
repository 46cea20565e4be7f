"""The peers that live in a checkout of rl-triton (github.com/simonsays1980/rl-triton):
rl-triton's own Triton estimators and PufferLib 3.0's advantage kernel, which
rl-triton vendors under ``benchmarks/pufferlib_ext``.

Neither is part of this project (nor copied into it): the benchmark imports them
from the checkout named by ``--rl-triton-src PATH`` or ``$RL_TRITON_SRC`` (the
repository root, holding ``src/rl_triton`` and ``benchmarks/pufferlib_ext``), and
each row is "n/a" with the reason when it is absent. Use tag v0.1.3::

    git clone --branch v0.1.3 https://github.com/simonsays1980/rl-triton .peers/rl-triton
    python -m rl_triton_core.bench --peers rl_triton,pufferlib --rl-triton-src .peers/rl-triton

Both take their own input conventions, which :func:`make` builds once per case
outside the timed call (as :func:`_inputs._explicit_next_values` does for TorchRL),
only where that gives our numbers (the harness checks every peer row against the
float64 reference before timing it, so a wrong mapping shows as WRONG):

* rl-triton is batch-major ``[num_envs, seq_len]`` float32 only, with float32
  flags, and asserts CUDA tensors: time-major cases get ``[N, T]`` contiguous
  copies (its outputs are handed back as transposed views, no copy), flags are
  converted to float32, ``truncated`` is passed as ``truncated & ~terminated``
  (rl-triton requires the two exclusive; ours counts a step with both as
  terminated). Its V' is ``values[t+1]`` except where ``bootstrap_values[N, T]``
  takes over (truncated steps and the last step), so GAE and V-trace cannot take
  an arbitrary ``next_values`` (skipped with ``--next-values explicit``);
  ``compute_lambda_returns`` takes ``next_values`` itself.
* rl-triton's ``compute_retrace`` weights Q(s_{t+1}, .) by the policy row that also
  gives pi(a_t|s_t), i.e. by pi(.|s_t); Retrace (and ours) by pi(.|s_{t+1}). To run
  it on the same numbers its ``next_q_values_all`` is Q(s_{t+1}, a) pi(a|s_{t+1}) /
  pi(a|s_t) (same size as its natural input), its behaviour input the probability
  exp(behaviour_log_probs), its ``q_values`` the gathered Q(s_t, a_t). It has no
  form taking log-ratios and E_t (our ``retrace``: skipped).
* rl-triton's GAE returns advantages only, PufferLib's too: the value targets
  (advantages + values, as our ``gae`` returns) are one torch add in the timed
  call. rl-triton's Retrace and V-trace also write advantages we do not return.
* PufferLib's ``compute_puff_advantage`` works on ``[rows, H]`` rows where slot
  t+1 holds the reward and done flag of step t and values[H-1] bootstraps: the
  case becomes ``H = T + 1`` columns, with the importance ratios 1 (and clips 1:
  plain GAE). It has one done flag for the bootstrap and the trace, so a
  truncated step's bootstrap gamma V'_t is folded into its reward (as
  Stable-Baselines3 does). It writes ``advantages`` in place (allocated per call,
  inside the timed call); its CUDA kernel launches on the legacy default stream,
  so it is not captured in a CUDA graph (b2b and full-call times only).

On the CPU (the smoke mode, ``TRITON_INTERPRET=1``) rl-triton runs in the Triton
interpreter with its ``is_cuda`` asserts lifted for the duration of its call, and
PufferLib's CPU path (``pufferlib.cpp``) is built instead of the CUDA one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import time
from pathlib import Path

import torch

from rl_triton_core.bench._inputs import _explicit_next_values

__all__ = ["Skip", "ENV", "APPLIES", "source", "rl_triton_version", "pufferlib_desc", "make"]


class Skip(Exception):
    """The peer does not run for this case; the message says why. (Defined here, below
    ``peers``, which imports this module and re-exports it as ``peers.Skip``.)"""


ENV = "RL_TRITON_SRC"
RL_TRITON_ESTIMATORS = ("gae", "gae_advantages", "lambda_returns", "discounted_returns",
                        "vtrace", "retrace", "retrace_from_actions", "eligibility_traces",
                        "episodic_cumsum")
APPLIES = {"rl_triton": RL_TRITON_ESTIMATORS, "pufferlib": ("gae", "gae_advantages")}
FLAT_MAX_T = 131072  # rl-triton's forward scans have no chunked path beyond this


def source(opts=None) -> Path | None:
    """The rl-triton checkout: ``opts.rl_triton_src``, else ``$RL_TRITON_SRC``, else None."""
    path = getattr(opts, "rl_triton_src", None) or os.environ.get(ENV)
    return Path(path).expanduser().resolve() if path else None


def _need_source(opts) -> Path:
    src = source(opts)
    if src is None:
        raise Skip(f"no rl-triton checkout (--rl-triton-src PATH or ${ENV}: the root of "
                   "github.com/simonsays1980/rl-triton, e.g. tag v0.1.3)")
    return src


# ------------------------------------------------------------------------- rl-triton

_rl_triton: dict = {}  # source path -> (module, None) or (None, reason)


def _import_rl_triton(opts):
    src = _need_source(opts)
    key = str(src)
    if key not in _rl_triton:
        pkg = src / "src" / "rl_triton"
        if not (pkg / "__init__.py").is_file():
            _rl_triton[key] = (None, f"no src/rl_triton/__init__.py under {src}")
        else:
            if str(src / "src") not in sys.path:
                sys.path.insert(0, str(src / "src"))
            try:
                import rl_triton
            except Exception as e:  # noqa: BLE001 - any import failure means "not available"
                _rl_triton[key] = (None, f"rl_triton does not import from {src} "
                                         f"({type(e).__name__}: {e})"[:200])
            else:
                where = Path(rl_triton.__file__).resolve()
                if pkg.resolve() not in where.parents:
                    _rl_triton[key] = (None, f"rl_triton is already imported from {where}, "
                                             f"not from {src}")
                else:
                    _rl_triton[key] = (rl_triton, None)
    mod, reason = _rl_triton[key]
    if mod is None:
        raise Skip(reason)
    return mod


def rl_triton_version(opts=None) -> str | None:
    """"rl-triton <version> (<path>)", or None when it is not there."""
    try:
        mod = _import_rl_triton(opts)
    except Exception:  # noqa: BLE001 - Skip or anything else: not available
        return None
    return f"rl-triton {getattr(mod, '__version__', '?')} ({source(opts)})"


@contextlib.contextmanager
def _lift_cuda_asserts():
    """rl-triton asserts ``t.is_cuda`` on every input: in the Triton interpreter (CPU
    tensors) the assert is lifted while its call runs, nothing else changes."""
    torch.Tensor.is_cuda = property(lambda self: True)
    try:
        yield
    finally:
        del torch.Tensor.is_cuda


def _runs_here(device, what):
    if device.type == "cuda":
        return False
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return True
    raise Skip(f"{what} runs on CUDA only (on the CPU: in the Triton interpreter, "
               "TRITON_INTERPRET=1)")


def _bm(t, td):
    """Batch-major ``[N, T(, A)]`` contiguous (a copy for time-major data)."""
    if t is None:
        return None
    if td == 0:
        t = t.transpose(0, 1)
    return t.contiguous()


def _back(t, td):
    """An ``[N, T]`` output in the case's layout (a view)."""
    return t.t() if td == 0 else t


def _inputs(d):
    """The per-case pieces every mapping uses, batch-major: float32 flags, the
    effective truncation (truncated and not terminated), V', the last-step mask."""
    td = d.time_dim % 2
    term = _bm(d.terminated, td)
    trunc = None if d.truncated is None else _bm(d.truncated, td) & ~term
    N, T = term.shape
    last = torch.zeros(N, T, dtype=torch.bool, device=term.device)
    last[:, -1] = True
    return td, term, trunc, last


def _boot_values(nv, trunc, last):
    """rl-triton's ``bootstrap_values [N, T]``: V'_t at the truncated steps and at the
    last step, 0 elsewhere (its docs: nonzero anywhere else double-counts)."""
    cut = last if trunc is None else (last | trunc)
    return torch.where(cut, nv, torch.zeros((), dtype=nv.dtype, device=nv.device))


def _make_rl_triton(estimator, d, opts):
    if estimator not in RL_TRITON_ESTIMATORS:
        raise Skip(f"rl-triton has no {estimator}")
    if estimator == "retrace":
        raise Skip("rl-triton's compute_retrace takes per-action tensors only (no form "
                   "taking log-ratios and E_t): see the retrace_from_actions rows")
    R = _import_rl_triton(opts)
    device = d.rewards.device
    interp = _runs_here(device, "rl-triton")
    td, term, trunc, last = _inputs(d)
    T = term.shape[1]
    term_f = term.float()
    trunc_f = None if trunc is None else trunc.float()
    gamma, lmbda = d.gamma, d.lmbda
    explicit = d.next_values is not None
    prep = []
    if td == 0:
        prep.append("time-major inputs as [N, T] copies (outside the call)")

    if estimator in ("gae", "gae_advantages", "vtrace") and explicit:
        raise Skip(f"rl-triton's {estimator} reads V(s_{{t+1}}) from values[t+1] except at "
                   "truncated steps: an arbitrary next_values is not expressible")
    if estimator in ("eligibility_traces", "episodic_cumsum") and T > FLAT_MAX_T:
        raise Skip(f"T={T} > {FLAT_MAX_T}: rl-triton's forward scans have no chunked path")

    if estimator in ("gae", "gae_advantages"):
        r, v = _bm(d.rewards, td), _bm(d.values, td)
        targets = estimator == "gae"  # gae_advantages: its advantages alone
        if trunc is None:
            boot = d.bootstrap.contiguous()

            def call():
                adv = R.compute_gae(r, v, term_f, None, gamma, lmbda, last_value=boot)
                return (_back(adv, td), _back(adv + v, td)) if targets else _back(adv, td)
        else:
            bv = _boot_values(_bm(_explicit_next_values(d), td), trunc, last)
            prep.append("bootstrap_values [N, T] = V' at truncated and last steps")

            def call():
                adv = R.compute_gae(r, v, term_f, trunc_f, gamma, lmbda, bootstrap_values=bv)
                return (_back(adv, td), _back(adv + v, td)) if targets else _back(adv, td)
        if targets:
            prep.append("value targets = advantages + values (a torch add in the call)")

    elif estimator == "lambda_returns":
        r = _bm(d.rewards, td)
        nv = _bm(_explicit_next_values(d), td)
        bv = _boot_values(nv, trunc, last)
        prep.append("next_values = V'; bootstrap_values = V' at truncated and last steps")

        def call():
            g = R.compute_lambda_returns(r, nv, term_f, trunc_f, gamma, lmbda,
                                         bootstrap_values=bv)
            return _back(g, td)

    elif estimator == "discounted_returns":
        r = _bm(d.rewards, td)
        if explicit:
            nv = _bm(d.next_values, td)
        else:  # no values inside the window: V'_t = 0 for t < T-1, the bootstrap at T-1
            nv = torch.zeros_like(r)
            nv[:, -1] = d.bootstrap
        bv = _boot_values(nv, trunc, last)
        prep.append("bootstrap_values = V' at truncated and last steps")

        def call():
            return _back(R.compute_discounted_returns(r, term_f, trunc_f, gamma,
                                                      bootstrap_values=bv), td)

    elif estimator == "vtrace":
        lr, r, v = _bm(d.log_rhos, td), _bm(d.rewards, td), _bm(d.values, td)
        zero = torch.zeros_like(lr)  # log pi_behaviour: the ratio is exp(log_rhos - 0)
        prep.append("log_pi_target = log_rhos, log_pi_behavior = 0")
        if trunc is None:
            boot = d.bootstrap.contiguous()

            def call():
                vs, adv = R.compute_vtrace(lr, zero, v, r, term_f, None, gamma, 1.0, 1.0,
                                           last_value=boot)
                return _back(vs, td), _back(adv, td)
        else:
            bv = _boot_values(_bm(_explicit_next_values(d), td), trunc, last)
            prep.append("bootstrap_values = V' at truncated and last steps")

            def call():
                vs, adv = R.compute_vtrace(lr, zero, v, r, term_f, trunc_f, gamma, 1.0, 1.0,
                                           bootstrap_values=bv)
                return _back(vs, td), _back(adv, td)

    elif estimator == "retrace_from_actions":
        q = _bm(d.q_actions, td)
        p = _bm(d.target_probs, td)
        a = _bm(d.actions, td).long()
        mu = _bm(d.behaviour_log_probs, td).exp()
        r = _bm(d.rewards, td)
        if explicit:
            q_next, p_next = _bm(d.next_q_actions, td), _bm(d.next_target_probs, td)
        else:
            q_next = torch.cat([q[:, 1:], d.bootstrap_q_values[:, None]], dim=1)
            p_next = torch.cat([p[:, 1:], d.bootstrap_target_probs[:, None]], dim=1)
        nq = (q_next * p_next / p).contiguous()  # its E_t = sum_a p[t] nq[t] = ours
        q_taken = q.gather(-1, a.unsqueeze(-1)).squeeze(-1).contiguous()
        tr = trunc_f if trunc_f is not None else torch.zeros_like(term_f)
        prep.append("next_q_values_all = Q(s', a) pi(a|s') / pi(a|s_t) (its E_t uses "
                    "pi(.|s_t)); action_probs_behavior = exp(behaviour_log_probs); "
                    "q_values = Q(s_t, a_t); it also writes advantages")

        def call():
            q_ret, _adv = R.compute_retrace(p, mu, q_taken, nq, a, r, term_f, tr, gamma)
            return _back(q_ret, td)

    elif estimator == "eligibility_traces":
        x, done = _bm(d.x, td), _bm(d.done, td).float()

        def call():
            return _back(R.compute_eligibility_traces(x, done, gamma, lmbda), td)

    else:  # episodic_cumsum
        x, done = _bm(d.x, td), _bm(d.done, td).float()

        def call():
            return _back(R.compute_episodic_prefix_sum(x, done), td)

    fn = call
    if interp:
        def fn():
            with _lift_cuda_asserts():
                return call()
        prep.append("Triton interpreter, is_cuda asserts lifted")
    info = {"peer_version": f"rl-triton {getattr(R, '__version__', '?')}"}
    if prep:
        info["prep"] = "; ".join(prep)
    return fn, device.type == "cuda", info


# ------------------------------------------------------------------------- PufferLib

_puff: dict = {}  # (ext dir, device type) -> (op, desc, build_s) or (None, reason, 0)


def pufferlib_desc(opts=None) -> str | None:
    src = source(opts)
    if src is None or not (src / "benchmarks" / "pufferlib_ext" / "pufferlib.cpp").is_file():
        return None
    return f"pufferlib 3.0 vendored JIT ({src / 'benchmarks' / 'pufferlib_ext'})"


def _load_pufferlib(opts, device):
    """``torch.ops.pufferlib.compute_puff_advantage``, built once per process (JIT,
    cached by torch under ``$TORCH_EXTENSIONS_DIR``): on CUDA with rl-triton's own
    ``build.py`` (pufferlib.cpp + pufferlib.cu, or an installed ``pufferlib._C``),
    on the CPU from pufferlib.cpp alone (its CPU path). Returns (op, desc, build_s),
    build_s > 0 only on the call that built it."""
    ext = _need_source(opts) / "benchmarks" / "pufferlib_ext"
    key = (str(ext), device.type)
    if key in _puff:
        op, desc, _ = _puff[key]
        if op is None:
            raise Skip(desc)
        return op, desc, 0.0
    if not (ext / "pufferlib.cpp").is_file():
        _puff[key] = (None, f"no benchmarks/pufferlib_ext/pufferlib.cpp under {ext.parent.parent}",
                      0.0)
        raise Skip(_puff[key][1])
    t0 = time.perf_counter()
    try:
        if device.type == "cuda":
            spec = importlib.util.spec_from_file_location("_rl_triton_pufferlib_build",
                                                          ext / "build.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            op, how = mod.load_puff_advantage()
            desc = f"pufferlib 3.0 vendored JIT ({how})"
        else:
            from torch.utils.cpp_extension import load

            load(name="_C", sources=[str(ext / "pufferlib.cpp")], extra_cflags=["-O3"],
                 verbose=False)
            op = torch.ops.pufferlib.compute_puff_advantage
            desc = "pufferlib 3.0 vendored JIT (pufferlib.cpp, its CPU path)"
    except Exception as e:  # noqa: BLE001 - a failed build: every row n/a, not rebuilt
        _puff[key] = (None, f"PufferLib's extension did not build ({type(e).__name__}: "
                            f"{e})"[:300], 0.0)
        raise Skip(_puff[key][1]) from None
    build_s = time.perf_counter() - t0
    _puff[key] = (op, desc, build_s)
    return op, desc, build_s


def _make_pufferlib(estimator, d, opts):
    if estimator not in ("gae", "gae_advantages"):
        raise Skip("PufferLib's advantage kernel is GAE only")
    targets = estimator == "gae"  # gae_advantages: its advantages alone
    if d.next_values is not None:
        raise Skip("PufferLib reads V(s_{t+1}) from values[t+1]: an arbitrary next_values "
                   "is not expressible")
    device = d.rewards.device
    if device.type not in ("cuda", "cpu"):
        raise Skip(f"PufferLib's extension has no {device.type} path")
    op, desc, build_s = _load_pufferlib(opts, device)
    td, term, trunc, _last = _inputs(d)
    N, T = term.shape
    H = T + 1
    r, v = _bm(d.rewards, td), _bm(d.values, td)
    done = term if trunc is None else term | trunc
    if trunc is not None:  # its one flag cuts the bootstrap too: gamma V'_t goes into r_t
        nv = _bm(_explicit_next_values(d), td)
        r = r + d.gamma * torch.where(trunc, nv, torch.zeros((), dtype=nv.dtype,
                                                             device=nv.device))
    col = torch.zeros(N, 1, dtype=torch.float32, device=device)
    values_p = torch.cat([v, d.bootstrap.float()[:, None]], dim=1).contiguous()
    rewards_p = torch.cat([col, r], dim=1).contiguous()
    dones_p = torch.cat([col, done.float()], dim=1).contiguous()
    importance = torch.ones(N, H, dtype=torch.float32, device=device)
    gamma, lmbda = float(d.gamma), float(d.lmbda)

    def fn():
        adv = torch.empty(N, H, dtype=torch.float32, device=device)
        op(values_p, rewards_p, dones_p, importance, adv, gamma, lmbda, 1.0, 1.0)
        a = adv[:, :T]
        return (_back(a, td), _back(a + v, td)) if targets else _back(a, td)

    prep = ["[N, T+1] rows: values + bootstrap, rewards/dones shifted by one slot, "
            "importance 1, clips 1"]
    if trunc is not None:
        prep.append("done = terminated | truncated, gamma V' folded into the truncated "
                    "steps' rewards")
    if td == 0:
        prep.append("time-major inputs as batch-major copies (outside the call)")
    if targets:
        prep.append("value targets = advantages + values (a torch add in the call)")
    prep.append("legacy default stream: no CUDA graph")
    info = {"peer_version": desc, "prep": "; ".join(prep)}
    if build_s:
        info["build_s"] = round(build_s, 1)
    return fn, False, info


def make(name, estimator, d, opts):
    """(fn, graphable, info) of the rl-triton or PufferLib peer, or Skip."""
    if name == "rl_triton":
        return _make_rl_triton(estimator, d, opts)
    if name == "pufferlib":
        return _make_pufferlib(estimator, d, opts)
    raise Skip(f"unknown peer {name!r}")
