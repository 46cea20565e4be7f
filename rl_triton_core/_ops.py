"""The estimators as one PyTorch custom op, so ``torch.compile(fullgraph=True)`` traces a
training step that calls them without a graph break.

Eager calls never come here (the dispatcher costs microseconds per call): each
public estimator checks ``torch.compiler.is_compiling()`` first and, only while
tracing, routes through ``rl_triton_core::call``, whose fake implementation
gives the outputs' shape, dtype and strides without running anything.
"""

from __future__ import annotations

import torch

# name -> (tensor arguments in order, coefficient arguments (float or tensor), int options,
#          number of outputs)
SPECS = {
    "gae": (("rewards", "values", "terminated", "truncated", "next_values", "bootstrap_value"),
            ("gamma", "lmbda"), ("time_dim",), 2),
    "lambda_returns": (("rewards", "values", "terminated", "truncated", "next_values",
                        "bootstrap_value"), ("gamma", "lmbda"), ("time_dim",), 1),
    "discounted_returns": (("rewards", "terminated", "truncated", "next_values",
                            "bootstrap_value"), ("gamma",), ("time_dim",), 1),
    "vtrace": (("log_rhos", "rewards", "values", "terminated", "truncated", "next_values",
                "bootstrap_value"), ("gamma", "lmbda", "rho_bar", "c_bar", "pg_rho_bar"),
               ("time_dim",), 2),
    "retrace": (("log_rhos", "rewards", "q_values", "expected_next_q", "terminated",
                 "truncated"), ("gamma", "lmbda", "c_bar"), ("time_dim",), 1),
    "eligibility_traces": (("x", "done", "init"), ("gamma", "lmbda"), ("time_dim",), 1),
    "episodic_cumsum": (("x", "done", "init"), (), ("time_dim",), 1),
    "linear_recurrence": (("alpha", "beta", "init"), (), ("time_dim", "reverse"), 1),
}


@torch.library.custom_op("rl_triton_core::call", mutates_args=())
def _call(name: str, tensors: list[torch.Tensor | None], coef_values: list[float],
          coef_tensors: list[torch.Tensor | None], ints: list[int]) -> list[torch.Tensor]:
    from rl_triton_core import estimators

    tnames, cnames, inames, _ = SPECS[name]
    kwargs = dict(zip(tnames, tensors))
    for cname, value, tensor in zip(cnames, coef_values, coef_tensors):
        kwargs[cname] = tensor if tensor is not None else value
    for iname, value in zip(inames, ints):
        kwargs[iname] = bool(value) if iname == "reverse" else value
    out = getattr(estimators, name)(**kwargs)
    return list(out) if isinstance(out, tuple) else [out]


@_call.register_fake
def _(name, tensors, coef_values, coef_tensors, ints):
    n_out = SPECS[name][3]
    data = tensors[0]
    dtype = None
    for t in tensors:
        if t is not None and t.is_floating_point():
            dtype = t.dtype
            break
    out = torch.empty_like(data, dtype=dtype or torch.float32)
    return [out] + [torch.empty_like(out) for _ in range(n_out - 1)]


def call(name: str, args: dict, out=None):
    """Route one estimator call through the custom op (used while tracing).

    ``out``: the estimator's ``out=`` argument; the op stays functional and its
    result is copied into ``out`` (an input mutation the graph records), which is
    returned."""
    tnames, cnames, inames, n_out = SPECS[name]
    tensors = [args[n] for n in tnames]
    coef_values, coef_tensors = [], []
    for cname in cnames:
        value = args[cname]
        if isinstance(value, torch.Tensor):
            coef_values.append(1.0)
            coef_tensors.append(value)
        else:
            coef_values.append(float(value))
            coef_tensors.append(None)
    ints = [int(args[n]) for n in inames]
    res = _call(name, tensors, coef_values, coef_tensors, ints)
    if out is not None:
        from rl_triton_core import _validate

        o0, o1 = _validate.outputs(out, n_out == 2, res[0].shape, res[0].device)
        o0.copy_(res[0])
        if n_out == 1:
            return o0
        o1.copy_(res[1])
        return o0, o1
    return tuple(res) if n_out == 2 else res[0]
