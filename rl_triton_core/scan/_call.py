"""One estimator call, checked and run: the table row's arguments validated into kernel
slots, then the cached launch or the full path.

``raw`` is a call's arguments as the user passed them, in the row's ``args`` order
(tensors, coefficients, the ``reverse`` option), followed by the two ``out=`` slots.
Checks raise a ValueError or TypeError that names the argument; they read shapes,
dtypes and devices only (no host synchronisation on CUDA).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from rl_triton_core import _validate as check
from rl_triton_core._layout import Layout, normalize_time_dim
from rl_triton_core._table import COEF_OF, COEF_RANGE, Estimator
from rl_triton_core.scan import _dispatch


class Call(NamedTuple):
    """A validated call: what ``_dispatch.run`` takes."""

    layout: Layout
    dtype: torch.dtype
    device: torch.device
    ins: dict  # kernel slot -> tensor or None
    coefs: dict  # coefficient slot -> (number or None, tensor or None)
    reverse: bool
    out: tuple | None  # validated (out0, out1 or None)


@functools.cache
def index(spec: Estimator) -> dict:
    """Kernel slot -> the position in ``raw`` of the argument that feeds it."""
    pos = {name: i for i, name in enumerate(spec.args)}
    idx = {slot: pos[name] for name, slot in spec.slots}
    idx.update({COEF_OF[name]: pos[name] for name in spec.coefs})
    return idx


def out_slots(out, n_out):
    """The (out0, out1) slots of an ``out=`` argument as the user passed it."""
    if out is None:
        return None, None
    if n_out == 1:
        return out, None
    if type(out) in (tuple, list) and len(out) == 2:
        return out[0], out[1]
    return _NOT_A_SLOT, _NOT_A_SLOT


_NOT_A_SLOT = object()  # a malformed out= argument: no key, the full path says why


def forward(spec: Estimator, raw: tuple, time_dim, out_arg=None):
    """Run the estimator without autograd: the cached launch where there is one, else
    validation and the full path (recording a plan for the next call)."""
    key, hit = _dispatch.cached((spec.name, type(time_dim), time_dim), raw)
    if hit is not None:
        return hit
    call = prepare(spec, raw, time_dim, out_arg)
    return _dispatch.run(spec.mode, call.layout, call.dtype, call.device, call.ins, call.coefs,
                         reverse=call.reverse, n_out=spec.n_out, out=call.out,
                         fast=(key, raw, index(spec)))


def values(raw: tuple) -> tuple:
    """``raw`` with every tensor that has the negative bit (a view such as
    ``z.conj().imag``, whose memory holds its values' negatives) replaced by its values
    (``resolve_neg``, a copy): the kernels read memory. The tuple itself where none has
    it."""
    if not any(type(t) is torch.Tensor and t.is_neg() for t in raw):
        return raw
    return tuple(t.resolve_neg() if isinstance(t, torch.Tensor) and t.is_neg() else t
                 for t in raw)


def prepare(spec: Estimator, raw: tuple, time_dim, out_arg=None) -> Call:
    """Validate a call's arguments (see the module docstring for ``raw``)."""
    raw = values(raw)
    args = dict(zip(spec.args, raw))
    for name in spec.required:
        check.tensor(name, args[name], flag=name in ("terminated", "done"))
    return CHECKS[spec.checks](spec, args, time_dim, out_arg)


def _outputs(spec, out_arg, shape, device, named):
    if out_arg is None:
        return None
    return check.outputs(out_arg, spec.n_out == 2, shape, device, named)


def _coefs(spec, args, shape) -> dict:
    coefs = {}
    for name in spec.coefs:
        slot = COEF_OF[name]
        lo, hi = COEF_RANGE[slot]
        coefs[slot] = check.coefficient(name, args[name], shape, lo, hi)
    return coefs


def _returns(spec, args, time_dim, out_arg) -> Call:
    """rewards-shaped data, step-aligned flags, V' explicit or shifted (semantics.md)."""
    names = {slot: name for name, slot in spec.slots}
    x_name = names["x"]
    rewards = check.tensor(x_name, args[x_name])
    shape = tuple(rewards.shape)
    td = normalize_time_dim(time_dim, rewards.dim())
    ins = {"x": rewards}
    for slot in ("v", "rho"):
        name = names.get(slot)
        if name is not None and args[name] is not None:
            t = check.tensor(name, args[name])
            check.same_shape(name, t, x_name, shape)
            ins[slot] = t
    for slot in ("term", "trunc"):
        name = names[slot]
        t = check.optional(name, args[name], flag=True)
        if t is not None:
            check.broadcastable(name, t, shape, f"{x_name}' shape")
            ins[slot] = t
    nv_name, boot_name = names["nv"], names.get("boot")
    nv = check.optional(nv_name, args[nv_name])
    boot = None if boot_name is None else check.optional(boot_name, args[boot_name])
    if nv is not None:
        if boot is not None:
            raise ValueError(
                f"pass {nv_name} or {boot_name}, not both: with {nv_name} the "
                f"window end bootstraps from {nv_name}[T-1]"
            )
        check.same_shape(nv_name, nv, x_name, shape)
        ins["nv"] = nv
    if boot is not None:
        check.broadcastable(boot_name, boot, shape[:td] + shape[td + 1:],
                            "the data's shape without the time axis")
        ins["boot"] = boot
    coefs = _coefs(spec, args, shape)
    named = [(names[s], t) for s, t in ins.items() if s != "term" and s != "trunc"]
    dtype = check.data_dtype(named)
    named = [(names[s], t) for s, t in ins.items()] + [
        (n, coefs[COEF_OF[n]][1]) for n in spec.coefs]
    device = check.same_device(named)
    out = _outputs(spec, out_arg, shape, device, named)
    return Call(Layout(shape, td), dtype, device, ins, coefs, True, out)


def _forward_coefficient(name, value, done_shape, shape, feat):
    """gamma/lmbda of a forward scan: a number, or a tensor broadcastable to ``done``
    (read with trailing feature axes added) or to ``x`` itself."""
    if isinstance(value, torch.Tensor) and feat and \
            check.aligned_strides(value, tuple(done_shape)) is None:
        return check.coefficient(name, value, shape)
    value, tensor = check.coefficient(name, value, done_shape)
    if tensor is not None:
        tensor = tensor.reshape(tuple(tensor.shape) + (1,) * feat)
    return value, tensor


def _forward(spec, args, time_dim, out_arg) -> Call:
    """``x`` [..., T, *F] with ``done`` of x's shape without the feature axes."""
    x = check.tensor("x", args["x"])
    done = check.tensor("done", args["done"], flag=True)
    td = normalize_time_dim(time_dim, x.dim())
    shape = tuple(x.shape)
    feat = x.dim() - done.dim()
    if feat < 0 or done.dim() <= td:
        raise ValueError(
            f"done of shape {tuple(done.shape)} must be x's shape {shape} without trailing "
            f"feature axes, time axis included (time_dim={time_dim})"
        )
    # (done itself where there are no feature axes: the CPU replay records a call only
    # when the kernel reads the user's own tensors)
    done_b = done.reshape(tuple(done.shape) + (1,) * feat) if feat else done
    check.broadcastable("done", done_b, shape, "x's shape (without its feature axes)")
    init = check.optional("init", args["init"])
    if init is not None:
        check.broadcastable("init", init, shape[:td] + shape[td + 1:],
                            "x's shape without the time axis")
    # gamma / lmbda broadcast to done's full shape (x's without the feature axes), not to
    # a broadcast done's own: done [1, T] with gamma [B, T] is gamma per (stream, step)
    coefs = {COEF_OF[n]: _forward_coefficient(n, args[n], shape[:done.dim()], shape, feat)
             for n in spec.coefs}
    dtype = check.data_dtype([("x", x), ("init", init)])
    named = [("x", x), ("done", done), ("init", init)] + [
        (n, coefs[COEF_OF[n]][1]) for n in spec.coefs]
    device = check.same_device(named)
    out = _outputs(spec, out_arg, shape, device, named)
    return Call(Layout(shape, td), dtype, device, {"x": x, "term": done_b, "init": init}, coefs,
                False, out)


def _linrec(spec, args, time_dim, out_arg) -> Call:
    alpha = check.tensor("alpha", args["alpha"])
    beta = check.tensor("beta", args["beta"])
    reverse = check.flag("reverse", args["reverse"])
    td = normalize_time_dim(time_dim, alpha.dim())
    shape = tuple(alpha.shape)
    check.broadcastable("beta", beta, shape, "alpha's shape")
    init = check.optional("init", args["init"])
    if init is not None:
        check.broadcastable("init", init, shape[:td] + shape[td + 1:],
                            "alpha's shape without the time axis")
    named = [("alpha", alpha), ("beta", beta), ("init", init)]
    dtype = check.data_dtype(named)
    device = check.same_device(named)
    out = _outputs(spec, out_arg, shape, device, named)
    return Call(Layout(shape, td), dtype, device, {"x": alpha, "v": beta, "init": init}, {},
                reverse, out)


# the validation each row names (``Estimator.checks``)
CHECKS = {"returns": _returns, "forward": _forward, "linrec": _linrec}
