"""More kinds of bad input: a clear ValueError or TypeError naming the argument, and the
inputs never modified. (tests/core/test_bad_input.py has the shapes, dtypes, devices and
coefficient ranges.)"""

import warnings

import pytest
import torch

import rl_triton_core as rc


def _data(gen, shape=(3, 9)):
    r, v = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    te = torch.rand(shape, generator=gen) < 0.3
    return r, v, te


def _unchanged(before, after):
    for b, a in zip(before, after):
        assert torch.equal(b, a)


@pytest.mark.parametrize("where", ["rewards", "values", "terminated"])
def test_meta_tensor(where, gen):
    r, v, te = _data(gen)
    args = {"rewards": r, "values": v, "terminated": te}
    args[where] = args[where].to("meta")
    with pytest.raises(ValueError, match=f"{where} is a meta tensor"):
        rc.gae(args["rewards"], args["values"], args["terminated"], time_dim=-1)


@pytest.mark.parametrize("where", ["rewards", "values", "terminated"])
def test_sparse_tensor(where, gen):
    r, v, te = _data(gen)
    args = {"rewards": r, "values": v, "terminated": te}
    args[where] = args[where].to_sparse()
    keep = [t.clone() for t in (r, v, te)]
    with pytest.raises(TypeError, match=f"{where} must be a dense"):
        rc.gae(args["rewards"], args["values"], args["terminated"], time_dim=-1)
    _unchanged(keep, (r, v, te))


def test_nested_tensor(gen):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype API
        x = torch.nested.nested_tensor([torch.randn(5, generator=gen),
                                        torch.randn(7, generator=gen)])
    with pytest.raises(TypeError, match="x must be a dense.*nested"):
        rc.episodic_cumsum(x, torch.zeros(2, 5, dtype=torch.bool), time_dim=-1)


@pytest.mark.parametrize("name", ["terminated", "truncated", "done"])
def test_flags_that_require_grad(name, gen):
    r, v, te = _data(gen)
    flag = te.float().requires_grad_(True)
    with pytest.raises(ValueError, match=f"{name} is a flag.*requires grad"):
        if name == "terminated":
            rc.gae(r, v, flag, time_dim=-1)
        elif name == "truncated":
            rc.lambda_returns(r, v, te, flag, time_dim=-1)
        else:
            rc.eligibility_traces(r, flag, time_dim=-1)
    assert flag.grad is None


def test_out_aliasing_an_input_through_a_view(gen):
    r, v, te = _data(gen)
    keep = r.clone()
    with pytest.raises(ValueError, match="out overlaps the memory of rewards"):
        rc.lambda_returns(r, v, te, time_dim=-1, out=r.view(r.shape))
    with pytest.raises(ValueError, match=r"out\[1\] overlaps the memory of values"):
        rc.gae(r, v, te, time_dim=-1, out=(torch.empty_like(r), v.t().t()))
    _unchanged([keep], [r])


@pytest.mark.gpu
def test_cuda_flags_with_cpu_data(gen):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    r, v, te = _data(gen)
    with pytest.raises(ValueError, match="terminated is on cuda"):
        rc.gae(r, v, te.cuda(), time_dim=-1)
