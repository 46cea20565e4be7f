"""Under torch.func's transforms (functionalize, vmap) an estimator takes its custom op,
as under torch.compile: the transforms' tensors (functionalized, batched) have no memory
of their own, so neither the C replay nor the CPU kernel may read them. A repeated call
under ``functionalize`` read address 0 (a crash), and the full path read garbage."""

import warnings

import pytest
import torch

import rl_triton_core as rc

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _data(seed):
    g = torch.Generator().manual_seed(seed)
    r, v = torch.randn(3, 70, generator=g), torch.randn(3, 70, generator=g)
    done = torch.rand(3, 70, generator=g) < 0.1
    return r, v, done


@pytest.mark.parametrize("repeat", [False, True])
def test_functionalize_gives_the_eager_bits(repeat):
    from torch.func import functionalize

    r, v, done = _data(int(repeat))
    want = rc.gae(r, v, done, gamma=0.9, lmbda=0.8, time_dim=-1)
    if repeat:  # recorded: the C replay and the Python record would both find it
        rc.gae(r, v, done, gamma=0.9, lmbda=0.8, time_dim=-1)
    got = functionalize(lambda a: rc.gae(a, v, done, gamma=0.9, lmbda=0.8, time_dim=-1))(r)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    got = functionalize(lambda a: rc.discounted_returns(a, done, gamma=0.9, time_dim=-1))(r)
    assert torch.equal(got, rc.discounted_returns(r, done, gamma=0.9, time_dim=-1))


def test_vmap_gives_the_eager_bits_row_by_row():
    from torch.func import vmap

    r, v, done = _data(2)
    want = rc.gae(r, v, done, gamma=0.9, lmbda=0.8, time_dim=-1)
    rc.gae(r, v, done, gamma=0.9, lmbda=0.8, time_dim=-1)
    with warnings.catch_warnings():  # (torch's note that the op has no batching rule)
        warnings.simplefilter("ignore")
        got = vmap(lambda a, b, c: rc.gae(a, b, c, gamma=0.9, lmbda=0.8, time_dim=-1))(
            r, v, done)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("name", ["masked_gae", "masked_returns", "masked_whiten"])
def test_token_estimators_refuse_transforms(name):
    """The token kernels read the tensors' memory: inside a transform they raise instead
    of reading a functionalized tensor's (they returned garbage)."""
    from torch.func import functionalize

    g = torch.Generator().manual_seed(3)
    r, v = torch.randn(4, 64, generator=g), torch.randn(4, 64, generator=g)
    m = (torch.rand(4, 64, generator=g) < 0.8).long()
    calls = {"masked_gae": lambda a: rc.masked_gae(a, v, m, gamma=1.0, lmbda=0.95, time_dim=-1),
             "masked_returns": lambda a: rc.masked_returns(a, m, gamma=1.0, time_dim=-1),
             "masked_whiten": lambda a: rc.masked_whiten(a, m)}
    fn = calls[name]
    fn(r)
    fn(r)  # recorded, where a record is kept
    with pytest.raises(NotImplementedError, match="torch.func"):
        functionalize(fn)(r)
