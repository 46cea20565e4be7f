"""Group outcome advantages (GRPO, Dr. GRPO, RLOO): one score per response, a baseline per
prompt group.

An LLM post-training step samples several responses per prompt; each response gets one
scalar score (the sum of its token rewards) and its advantage is the score measured
against the other responses to the same prompt. With ``n_g`` responses in group ``g``,
``mean_g`` their mean and ``std_g`` their unbiased standard deviation (``torch.std``)::

    "grpo"       A_i = (s_i - mean_g) / (std_g + eps)     (a group of one: s_i / (1 + eps))
    "grpo_mean"  A_i = s_i - mean_g                        (Dr. GRPO; a group of one: s_i)
    "rloo"       A_i = s_i n_g / (n_g - 1) - mean_g n_g / (n_g - 1)
                     = s_i - (sum_g - s_i) / (n_g - 1)     (leave-one-out; a group of one: s_i)

These are verl 0.9.1's ``compute_grpo_outcome_advantage`` (``norm_adv_by_std_in_grpo``
True / False) and ``compute_rloo_outcome_advantage``, computed without a Python loop
over groups and without synchronising the host: group ids are integers in
``[0, num_groups)``, and ``num_groups`` defaults to the batch size (an upper bound, so
its value need not be read from the device). The per-group sums are accumulated in
float64 with ``index_put_(accumulate=True)``, whatever the scores' dtype; the result is
rounded once to the scores' dtype. On CUDA a batch of up to 4,096 scores that needs no
gradient is one Triton launch (the scores sorted by group, each group summed by a
fixed-order scan: bitwise repeatable; a repeated call replays its recorded launch); larger
batches, and scores that need a gradient, take PyTorch operations (about twenty
launches), as the CPU does. On the CPU the accumulation is sequential, so results are
bitwise repeatable; on CUDA, PyTorch sorts the indices for an accumulating
``index_put_``, and the float64 sums make the rounded result independent of their order
in all but exceptional ties. Framework adapters (``rl_triton_verl`` and others) map their
group labels (uid strings) to these ids on the host and broadcast the result over the
response tokens.
"""

from __future__ import annotations

import numbers

import torch
from torch.autograd import forward_ad as _forward_ad

from rl_triton_core import _config, _record, _validate
from rl_triton_core.scan import _claunch, _cpu_c, _dispatch

__all__ = ["group_advantages", "group_sizes"]

_METHODS = ("grpo", "grpo_mean", "rloo")
_F64 = torch.float64


def _check_group(scores_len: int, device, group, num_groups):
    group = _validate.tensor("group", group)
    if group.dtype == torch.bool or group.is_floating_point():
        raise TypeError(f"group must be an integer tensor of group ids, got dtype {group.dtype}")
    if group.dim() != 1 or group.shape[0] != scores_len:
        raise ValueError(f"group must have shape ({scores_len},) like scores, got "
                         f"{tuple(group.shape)}")
    if group.device != device:
        raise ValueError(f"group must be on the scores' device {device}, got {group.device}")
    if num_groups is None:
        num_groups = scores_len
    elif isinstance(num_groups, bool) or not isinstance(num_groups, numbers.Integral):
        raise TypeError(f"num_groups must be an int, got {type(num_groups).__name__}")
    elif num_groups < 1 and scores_len > 0:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    return group, max(int(num_groups), 1)


def _segment_sum(x: torch.Tensor, group: torch.Tensor, num_groups: int) -> torch.Tensor:
    out = torch.zeros(num_groups, dtype=x.dtype, device=x.device)
    return out.index_put_((group,), x, accumulate=True)


def group_sizes(group: torch.Tensor, *, num_groups: int | None = None) -> torch.Tensor:
    """The size of each element's group: ``[B]`` int64, ``n_g`` at every member of ``g``.

    ``group`` is a ``[B]`` integer tensor of ids in ``[0, num_groups)`` (default ``B``).
    No host synchronisation.

    Examples:
        >>> import torch
        >>> from rl_triton_core.groups import group_sizes
        >>> group_sizes(torch.tensor([0, 0, 1, 2, 2, 2]))
        tensor([2, 2, 1, 3, 3, 3])
    """
    group = _validate.tensor("group", group)
    if group.dim() != 1:
        raise ValueError(f"group must be 1-D [B], got shape {tuple(group.shape)}")
    group, num_groups = _check_group(group.shape[0], group.device, group, num_groups)
    group = group.long()
    ones = torch.ones(group.shape, dtype=torch.int64, device=group.device)
    return _segment_sum(ones, group, num_groups)[group]


def group_advantages(scores: torch.Tensor, group: torch.Tensor, *, method: str = "grpo",
                     eps: float = 1e-6, num_groups: int | None = None) -> torch.Tensor:
    """Outcome advantages of ``scores`` against their prompt group's baseline.

    With ``n_g``, ``mean_g`` and the unbiased ``std_g`` of the scores of group ``g``:

        "grpo"       (s_i - mean_g) / (std_g + eps)            n_g == 1: mean 0, std 1
        "grpo_mean"  s_i - mean_g   (Dr. GRPO)                 n_g == 1: s_i
        "rloo"       s_i n_g/(n_g - 1) - mean_g n_g/(n_g - 1)  n_g == 1: s_i

    exactly verl 0.9.1's ``compute_grpo_outcome_advantage`` and
    ``compute_rloo_outcome_advantage`` (its per-group Python loops), accumulated in
    float64. Group ids need not be contiguous or sorted; an id outside
    ``[0, num_groups)`` is not checked (that would read the device): PyTorch's
    operations raise an indexing error, the one-launch kernel on CUDA makes it a group
    of its own.

    Args:
        scores: ``[B]`` float tensor (any float dtype, bfloat16 included), one score
            per response.
        group: ``[B]`` integer tensor, the group id of each response, on the same device.
        method: ``"grpo"``, ``"grpo_mean"`` or ``"rloo"``.
        eps: added to ``std_g`` (``"grpo"`` only); verl's ``epsilon``, 1e-6.
        num_groups: an upper bound on the number of groups (ids are below it); default
            ``B``.

    Returns:
        Tensor: ``[B]`` advantages, a new tensor in the scores' dtype and device
        (differentiable in ``scores`` through plain torch ops).

    Examples:
        >>> import torch, rl_triton_core as rc
        >>> scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 3.0])
        >>> group = torch.tensor([0, 0, 0, 1, 1, 2])
        >>> rc.group_advantages(scores, group, method="grpo")
        tensor([ 1.1547, -0.5773, -0.5773,  0.0000,  0.0000,  3.0000])
        >>> rc.group_advantages(scores, group, method="rloo")
        tensor([ 1.0000, -0.5000, -0.5000,  0.0000,  0.0000,  3.0000])
    """
    if type(scores) is torch.Tensor and type(method) is str and type(eps) in (float, int) \
            and (num_groups is None or (type(num_groups) is int and num_groups >= 1)) \
            and _forward_ad._current_level < 0:
        prefix = _prefix(method, eps)
        res = _replay(prefix, scores, group)
        if res is not None:
            return res
    raw = (scores, group)
    scores = _validate.floating("scores", _validate.tensor("scores", scores))
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B] (one score per response), got shape "
                         f"{tuple(scores.shape)}")
    if not isinstance(method, str) or method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a number, got {type(eps).__name__}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    group, num_groups = _check_group(scores.shape[0], scores.device, group, num_groups)
    if scores.shape[0] == 0:
        return torch.empty_like(scores, memory_format=torch.contiguous_format)
    if _kernel_takes(scores, raw[1], eps):
        from rl_triton_core.token import _group_kernel

        out = torch.empty(scores.shape, dtype=scores.dtype, device=scores.device)
        ran = _group_kernel.run(method, scores, raw[1], out, eps)
        _remember(_prefix(method, eps), raw, ran, out)
        return out
    group = group.long()

    s = scores.to(_F64)
    n = _segment_sum(torch.ones_like(s), group, num_groups)
    mean = _segment_sum(s, group, num_groups) / n.clamp_min(1.0)
    n_i, mean_i = n[group], mean[group]
    single = n_i <= 1.0
    if method == "grpo_mean":
        adv = torch.where(single, s, s - mean_i)
    elif method == "rloo":
        k = n_i / (n_i - 1.0).clamp_min(1.0)
        adv = torch.where(single, s, s * k - mean_i * k)
    else:
        centered = s - mean_i
        var = _segment_sum(centered * centered, group, num_groups) / (n - 1.0).clamp_min(1.0)
        std_i = var.sqrt()[group]
        adv = torch.where(single, s / (1.0 + float(eps)), centered / (std_i + float(eps)))
    return adv.to(scores.dtype)


# ------------------------------------------------------------------ one launch on Triton
# A batch of up to _group_kernel.MAX_B scores that needs no gradient runs as one Triton
# launch (``token/_group_kernel.py``), recorded like the token estimators' launches: a
# repeated call with the same key (shapes, strides, dtypes, devices; the method and eps
# in the prefix) is launched again without the checks (``_record.Recorded``), on CUDA
# from C where the extension is built (``scan/_claunch.py``). num_groups does not reach
# the kernel (the groups are found by sorting), so it is not part of the key.


def _prefix(method, eps):
    return ("group_advantages", method, float(eps))


_EPS_LO, _EPS_HI = 1e-30, 1e30  # eps reaches the kernel as two float32s (``_host.split``)


def _kernel_takes(scores, group, eps) -> bool:
    """Whether the call runs as the one-launch kernel (else PyTorch operations: CPU
    tensors, a batch over ``MAX_B``, a gradient to track (forward-mode too), a traced or
    transformed call, an eps that two float32s do not carry)."""
    if _dispatch.backend_for(scores.device) != "triton":
        return False  # (before the import: the CPU path never imports triton)
    from rl_triton_core.token import _group_kernel

    if (scores.shape[0] > _group_kernel.MAX_B or scores.is_neg()
            or (scores.requires_grad and torch.is_grad_enabled())
            or _forward_ad._current_level >= 0  # (dual tensors: their tangents)
            or not (eps == 0 or _EPS_LO <= eps <= _EPS_HI)
            or torch.compiler.is_compiling()
            or torch._C._functorch.peek_interpreter_stack() is not None):
        return False
    return type(group) is torch.Tensor and not group.is_neg()


def _replay(prefix, scores, group):
    """The result of a recorded call with these arguments, or None (the full path runs):
    the C replay first on CUDA, then the recorded launch in Python."""
    if (not _dispatch._PLANS or not (scores.is_cuda or _config._current.cpu_plans)
            or torch.compiler.is_compiling()):
        return None
    if _claunch.recorded and scores.is_cuda:
        res = _cpu_c.replay(_dispatch._PLANS, _cprefix(prefix), (scores, group), 0,
                            _config._current)
        if res is not None:
            return res
    return _dispatch.cached(prefix, (scores, group))[1]


_CPREFIX: dict = {}


def _cprefix(prefix) -> bytes:
    b = _CPREFIX.get(prefix)
    if b is None:
        b = _CPREFIX[prefix] = b"groups/" + repr(prefix).encode()
    return b


def _remember(prefix, raw, ran, out):
    """Record the launch that just ran (``ran``: ``_group_kernel.run``'s), where caching
    is on (CUDA; CPU tensors only under the tests' ``cpu_plans``) and the kernel read the
    user's own tensors."""
    tune = _config._current
    device = out.device
    if (not _dispatch._replay_ok or not tune.cached_launch or raw[0].requires_grad
            or (device.type != "cuda" and not tune.cpu_plans)):
        return
    key = _dispatch.key_of(prefix, raw, tune)
    if key is None:
        return
    from rl_triton_core import _tl

    ((jit_fn, compiled, grid, consts, args),), ((ws, _),) = ran
    placed, tensors = [], []
    for pos, a in enumerate(args):
        if a is out or a is ws:
            placed.append((pos, int(a is ws)))
        elif a is raw[0] or a is raw[1]:
            tensors.append((pos, int(a is raw[1])))
        elif isinstance(a, torch.Tensor):
            return
    allocs = [_record.Alloc(None, tuple(out.shape), out.dtype, device),
              _record.Alloc(None, tuple(ws.shape), ws.dtype, device)]
    rec = _record.Recorded(_tl.Replay(jit_fn, [(compiled, grid, consts)], len(args), device),
                           args, tensors=tensors, allocs=allocs, placed=placed,
                           returns=[(True, 0)])
    _dispatch._store(key, rec)
    if device.type == "cuda" and _claunch.enabled():
        ckey = _claunch.key(_tl.knobs.runtime, _cprefix(prefix), raw, 0, tune)
        _dispatch._store(ckey, _claunch.of_recorded(ckey, rec, args, len(raw), tune))
