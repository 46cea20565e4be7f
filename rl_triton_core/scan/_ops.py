"""One PyTorch custom op per estimator (``rl_triton_core::gae``, ...), with a fake
implementation and an autograd formula, so ``torch.compile(fullgraph=True)`` traces a
training step that calls the estimators -- forward and backward -- without a graph break
and with the eager gradients.

Eager calls never come here (the dispatcher costs microseconds per call): the public
front door checks ``torch.compiler.is_compiling()`` first and only while tracing routes
through :func:`call`. The op's schema is derived from the estimator's table row:
each tensor input is ``Tensor?``, each coefficient a ``float`` plus a ``Tensor?`` (a
tensor coefficient), then ``time_dim`` (and ``reverse``). The backward is one more op,
``rl_triton_core::estimator_backward``, whose implementation is the same ``*_backward`` function
the eager ``autograd.Function`` runs.
"""

from __future__ import annotations

import torch

from rl_triton_core import _validate
from rl_triton_core._layout import normalize_time_dim
from rl_triton_core._table import TABLE, Estimator
from rl_triton_core.scan import _autograd, _call

_OPS: dict = {}


def _schema(spec: Estimator) -> str:
    args = [f"Tensor? {n}" for n in spec.inputs]
    for c in spec.coefs:
        args += [f"float {c}", f"Tensor? {c}_t"]
    args.append("int time_dim")
    if spec.reverse is None:
        args.append("bool reverse")
    outs = ", ".join(["Tensor"] * spec.n_out)
    return f"({', '.join(args)}) -> ({outs})" if spec.n_out > 1 else \
        f"({', '.join(args)}) -> Tensor"


def _raw(spec: Estimator, flat: tuple) -> tuple:
    """The op's flat arguments back into the estimator's raw arguments (+ out= slots)."""
    n = len(spec.inputs)
    raw = list(flat[:n])
    pos = n
    for _ in spec.coefs:
        value, tensor = flat[pos], flat[pos + 1]
        raw.append(tensor if tensor is not None else value)
        pos += 2
    time_dim = flat[pos]
    if spec.reverse is None:
        raw.append(flat[pos + 1])
    return tuple(raw) + (None, None), time_dim


_DATA_SLOTS = ("x", "v", "nv", "boot", "rho", "init")


def _data_of(spec, flat):
    """The tensor the outputs are shaped like and the outputs' dtype (the data's)."""
    slots = dict(spec.slots)
    data = flat[spec.inputs.index(next(n for n, s in spec.slots if s == "x"))]
    dtype = None
    for name, t in zip(spec.inputs, flat):
        if slots[name] in _DATA_SLOTS and isinstance(t, torch.Tensor) and t.is_floating_point():
            dtype = t.dtype
            break
    return data, dtype or torch.float32


def _make(spec: Estimator):
    name = f"rl_triton_core::{spec.name}"

    def impl(*flat):
        raw, time_dim = _raw(spec, flat)
        with torch.no_grad():
            out = _call.forward(spec, raw, time_dim)
        # an output must not alias an input (the op is functional): the scan never
        # returns an input, but be explicit for the one-output case
        return tuple(o.clone() if _aliases(o, flat) else o for o in out) \
            if spec.n_out == 2 else (out.clone() if _aliases(out, flat) else out)

    op = torch.library.custom_op(name, impl, mutates_args=(), schema=_schema(spec))

    @op.register_fake
    def _(*flat):
        data, dtype = _data_of(spec, flat)
        out = torch.empty_like(data, dtype=dtype)
        return (out, torch.empty_like(out)) if spec.n_out == 2 else out

    if spec.grads:
        op.register_autograd(_backward_of(spec), setup_context=_setup_of(spec))
    else:  # not differentiable (as in eager): no gradient reaches any input
        op.register_autograd(lambda ctx, *grads: (None,) * ctx.n_args,
                             setup_context=_setup_none)
    return op


def _setup_none(ctx, inputs, output):
    ctx.n_args = len(inputs)


def _aliases(o, flat) -> bool:
    return any(isinstance(t, torch.Tensor) and t is o for t in flat)


# ------------------------------------------------------------------- the autograd formula


def _setup_of(spec: Estimator):
    def setup_context(ctx, inputs, output):
        raw, time_dim = _raw(spec, inputs)
        first = output[0] if spec.n_out == 2 else output
        ctx.s = _autograd.saved_of(spec, raw, normalize_time_dim(time_dim, first.dim()), first)
        n = len(spec.inputs)
        coef_t = [inputs[n + 2 * i + 1] for i in range(len(spec.coefs))]
        ctx.coef_v = [inputs[n + 2 * i] for i in range(len(spec.coefs))]
        tensors = _autograd.saved_tensors(spec, raw, first)
        ctx.reverse = bool(dict(zip(spec.args, raw)).get("reverse", False))
        ctx.n_saved = len(tensors)
        ctx.save_for_backward(*tensors, *coef_t)  # tensor coefficients: saved, not in ctx.s
        ctx.grad_pos = [spec.inputs.index(n) for n in spec.grads]
        ctx.n_args = len(inputs)

    return setup_context


def _backward_of(spec: Estimator):
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        tensors, coef_t = list(saved[:ctx.n_saved]), list(saved[ctx.n_saved:])
        s = ctx.s
        coef_v = [float(v) for v in ctx.coef_v]
        needs = [bool(ctx.needs_input_grad[p]) for p in ctx.grad_pos]
        res = torch.ops.rl_triton_core.estimator_backward(
            spec.name, tensors, [g for g in grads], coef_v, coef_t, s.td, list(s.shape),
            [bool(h) for h in s.has], None if s.side_shape is None else list(s.side_shape),
            ctx.reverse, needs)
        out = [None] * ctx.n_args
        it = iter(res)
        for p, need in zip(ctx.grad_pos, needs):
            g = next(it)
            out[p] = g if need and _present(g) else None
        return tuple(out)

    return backward


def _present(g) -> bool:
    # the backward op returns an empty [0] tensor for a gradient that does not exist
    return not (g.dim() == 1 and g.shape[0] == 0 and g.dtype == torch.int8)


_ABSENT_DTYPE = torch.int8


def _absent(device):
    return torch.empty(0, dtype=_ABSENT_DTYPE, device=device)


def _backward_impl(name: str, tensors: list, grads: list, coef_v: list, coef_t: list,
                   td: int, shape: list, has: list, side_shape: list | None, reverse: bool,
                   needs: list) -> list:
    """The eager backward of row ``name`` (``_autograd.backward``), as a list of tensors
    (an absent gradient as an empty int8 tensor: an op returns no None)."""
    spec = TABLE[name]
    ref = next(g for g in grads if g is not None)
    coefs = {c: t if t is not None else v for c, v, t in zip(spec.coefs, coef_v, coef_t)}
    s = _autograd.Saved(td, tuple(shape), ref.dtype, tuple(has),
                        _autograd.coef_values(spec, coefs),
                        None if side_shape is None else tuple(side_shape))
    res = _autograd.backward(spec, s, tensors, grads, needs, reverse)
    return [g.contiguous() if g is not None else _absent(ref.device) for g in res]


def _backward_fake(name, tensors, grads, coef_v, coef_t, td, shape, has, side_shape, reverse,
                   needs):
    spec = TABLE[name]
    ref = next(g for g in grads if g is not None)
    full = tuple(shape)
    present = _autograd.present_grads(spec, has, needs, tensors)
    out = []
    for gname, p in zip(spec.grads, present):
        if not p:
            out.append(_absent(ref.device))
        elif gname in ("bootstrap_value", "init") and side_shape is not None:
            out.append(ref.new_empty(tuple(side_shape)))
        elif gname == "beta":
            out.append(ref.new_empty(tuple(tensors[0].shape)))
        else:
            out.append(ref.new_empty(full))
    return out


torch.library.custom_op(
    "rl_triton_core::estimator_backward", _backward_impl, mutates_args=(),
    schema="(str name, Tensor?[] tensors, Tensor?[] grads, float[] coef_v, Tensor?[] coef_t, "
           "int td, SymInt[] shape, bool[] has, SymInt[]? side_shape, bool reverse, "
           "bool[] needs) -> Tensor[]",
).register_fake(_backward_fake)


def define(spec: Estimator):
    """Define row ``spec``'s custom op (``estimators._row``, once per row, at import)."""
    _OPS[spec.name] = _make(spec)


def call(spec: Estimator, raw: tuple, time_dim, out_arg=None):
    """Route one estimator call through its custom op (used while tracing).

    ``out_arg``: the estimator's ``out=`` argument; the op stays functional and its
    result is copied into ``out`` (an input mutation the graph records), which is
    returned."""
    args = dict(zip(spec.args, raw))
    flat = [args[n] for n in spec.inputs]
    for c in spec.coefs:
        value = args[c]
        if isinstance(value, torch.Tensor):
            flat += [1.0, value]
        else:
            flat += [float(value), None]
    flat.append(int(time_dim))
    if spec.reverse is None:
        flat.append(bool(args["reverse"]))
    res = _OPS[spec.name](*flat)
    if out_arg is not None:
        first = res[0] if spec.n_out == 2 else res
        o0, o1 = _validate.outputs(out_arg, spec.n_out == 2, first.shape, first.device)
        if spec.n_out == 1:
            o0.copy_(res)
            return o0
        o0.copy_(res[0])
        o1.copy_(res[1])
        return o0, o1
    return res
