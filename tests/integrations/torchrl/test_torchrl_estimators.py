"""The estimator modules: TorchRL's behaviour around the math, the core's recursion inside."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrl")

import rl_triton_torchrl  # noqa: E402
from rl_triton_torchrl import estimators as ours  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from tensordict.nn import TensorDictModule  # noqa: E402
from torch import nn  # noqa: E402
from torchrl.modules import ProbabilisticActor  # noqa: E402
from torchrl.objectives import ClipPPOLoss  # noqa: E402
from torchrl.objectives.value import advantages as trl  # noqa: E402
from torchrl_testlib import DEVICES, assert_close, flags  # noqa: E402

import rl_triton_core  # noqa: E402

OBS = 3
PAIRS = {
    "GAE": (trl.GAE, ours.TritonGAE, {"gamma": 0.97, "lmbda": 0.9}),
    "TD1": (trl.TD1Estimator, ours.TritonTD1Estimator, {"gamma": 0.97}),
    "TDLambda": (trl.TDLambdaEstimator, ours.TritonTDLambdaEstimator,
                 {"gamma": 0.97, "lmbda": 0.9}),
}


def critic(device="cpu", seed=0):
    torch.manual_seed(seed)
    return TensorDictModule(nn.Linear(OBS, 1), in_keys=["obs"], out_keys=["state_value"]).to(
        device
    )


def actor(device="cpu", seed=1):
    torch.manual_seed(seed)
    net = TensorDictModule(nn.Linear(OBS, 2), in_keys=["obs"], out_keys=["logits"])
    return ProbabilisticActor(
        net, in_keys=["logits"], distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    ).to(device)


def rollout(gen, batch=(4,), T=25, device="cpu", truncated_key=False):
    """A TorchRL rollout ``[*batch, T]``: next obs is the true successor, terminated <= done."""
    shape = (*batch, T)
    obs = torch.randn(*shape, OBS, generator=gen)
    next_obs = torch.randn(*shape, OBS, generator=gen)
    done, terminated = flags(gen, (*shape, 1))
    nxt = {"obs": next_obs, "reward": torch.randn(*shape, 1, generator=gen), "done": done,
           "terminated": terminated}
    if truncated_key:
        nxt["truncated"] = done & ~terminated
    td = TensorDict({"obs": obs, "next": nxt}, batch_size=shape)
    return td.to(device)


def run_pair(torchrl_cls, our_cls, td, keys=("advantage", "value_target"), call=None, **kwargs):
    outs = []
    for cls in (torchrl_cls, our_cls):
        est = cls(**kwargs)
        data = td.clone()
        out = est(data) if call is None else call(est, data)
        outs.append(out)
    for key in keys:
        assert_close(outs[1].get(key), outs[0].get(key))
    return outs


def test_methods_are_rebuilt_not_torchrl():
    assert ours.TritonGAE.forward is not trl.GAE.forward
    assert ours.TritonGAE.value_estimate is not trl.GAE.value_estimate
    assert ours.TritonMultiAgentGAE.forward is not trl.MultiAgentGAE.forward
    assert ours.TritonTD1Estimator.value_estimate is not trl.TD1Estimator.value_estimate
    assert ours.TritonTDLambdaEstimator.value_estimate is not trl.TDLambdaEstimator.value_estimate
    assert ours.TritonVTrace.forward is not trl.VTrace.forward
    # TorchRL's module is untouched by the import
    functional = trl.vec_generalized_advantage_estimate
    assert functional.__module__ == "torchrl.objectives.value.functional"
    assert rl_triton_torchrl.GAE is ours.TritonGAE


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(PAIRS))
def test_estimator_matches_torchrl(name, device, gen):
    torchrl_cls, our_cls, kw = PAIRS[name]
    td = rollout(gen, device=device)
    run_pair(torchrl_cls, our_cls, td, value_network=critic(device), device=device, **kw)


def test_the_core_does_the_math(gen, monkeypatch):
    calls = []
    for fn in ("gae", "lambda_returns", "discounted_returns"):
        original = getattr(rl_triton_core, fn)

        def counting(*a, _original=original, _fn=fn, **k):
            calls.append(_fn)
            return _original(*a, **k)

        monkeypatch.setattr(rl_triton_core, fn, counting)
    td = rollout(gen)
    for _, cls, kw in PAIRS.values():
        cls(value_network=critic(), **kw)(td.clone())
    assert calls == ["gae", "lambda_returns", "lambda_returns"]


@pytest.mark.parametrize("vectorized", [None, False, True])
@pytest.mark.parametrize("name", ["GAE", "TDLambda"])
def test_vectorized_both_paths(name, vectorized, gen):
    torchrl_cls, our_cls, kw = PAIRS[name]
    if vectorized is None and name == "TDLambda":
        pytest.skip("TDLambdaEstimator's vectorized is a bool")
    run_pair(torchrl_cls, our_cls, rollout(gen), value_network=critic(), vectorized=vectorized,
             **kw)


@pytest.mark.parametrize(
    "option",
    ["average_gae", "shifted", "steps_to_next_obs", "time_dim_0", "time_named", "set_keys",
     "skip_existing", "auto_reset_env", "no_value_network", "batch_7x3", "value_estimate",
     "shifted_budget", "value_chunk_size", "deactivate_vmap", "tensor_gamma"],
)
def test_gae_options(option, gen):
    kw = {"gamma": 0.97, "lmbda": 0.9, "value_network": critic()}
    td = rollout(gen, truncated_key=option == "auto_reset_env")
    keys = ("advantage", "value_target")
    call = None
    if option == "average_gae":
        kw["average_gae"] = True
    elif option in ("shifted", "shifted_budget"):
        kw["shifted"] = True
        if option == "shifted_budget":
            kw["shifted_budget"] = 3
    elif option == "steps_to_next_obs":
        td["steps_to_next_obs"] = torch.randint(1, 4, (*td.batch_size, 1), generator=gen)
    elif option == "time_dim_0":
        td = rollout(gen, batch=(4,), T=25).transpose(0, 1).contiguous()  # [T, B]
        kw["time_dim"] = 0
    elif option == "time_named":
        td = rollout(gen, batch=(4,), T=25).transpose(0, 1).contiguous()
        td.names = ["time", None]
    elif option == "set_keys":
        td.rename_key_(("next", "reward"), ("next", "r"))
        keys = ("adv", "vt")

        def call(est, data):
            est.set_keys(reward="r", advantage="adv", value_target="vt")
            return est(data)
    elif option == "skip_existing":
        kw["skip_existing"] = True
        td["state_value"] = torch.randn(*td.batch_size, 1, generator=gen)
        td["next", "state_value"] = torch.randn(*td.batch_size, 1, generator=gen)
    elif option == "auto_reset_env":
        kw["auto_reset_env"] = True
    elif option == "no_value_network":
        kw["value_network"] = None
        td["state_value"] = torch.randn(*td.batch_size, 1, generator=gen)
        td["next", "state_value"] = torch.randn(*td.batch_size, 1, generator=gen)
    elif option == "batch_7x3":
        td = rollout(gen, batch=(7, 3), T=20)
    elif option == "value_estimate":
        keys = ("vt",)

        def call(est, data):
            data.set("vt", est.value_estimate(data))
            return data
    elif option == "value_chunk_size":
        kw["value_chunk_size"] = 2
    elif option == "deactivate_vmap":
        kw["deactivate_vmap"] = True
    elif option == "tensor_gamma":
        kw["gamma"] = torch.tensor(0.97)
        kw["lmbda"] = torch.tensor(0.9)
    run_pair(trl.GAE, ours.TritonGAE, td, keys=keys, call=call, **kw)


@pytest.mark.parametrize("name", ["TD1", "TDLambda"])
@pytest.mark.parametrize("option", ["average_rewards", "shifted", "steps_to_next_obs",
                                    "time_dim_0"])
def test_td_options(name, option, gen):
    torchrl_cls, our_cls, kw = PAIRS[name]
    kw = dict(kw, value_network=critic())
    td = rollout(gen)
    if option == "average_rewards":
        kw["average_rewards"] = True
    elif option == "shifted":
        kw["shifted"] = True
    elif option == "steps_to_next_obs":
        td["steps_to_next_obs"] = torch.randint(1, 4, (*td.batch_size, 1), generator=gen)
    elif option == "time_dim_0":
        td = td.transpose(0, 1).contiguous()
        kw["time_dim"] = 0
    run_pair(torchrl_cls, our_cls, td, **kw)


def test_params_and_target_params(gen):
    """Losses call the estimator with params / target_params (functional critics)."""
    from tensordict import from_module

    net = critic()
    params = from_module(net).detach().clone()
    target = params.apply(lambda p: p + 0.1)
    td = rollout(gen)

    def call(est, data):
        return est(data, params=params, target_params=target)

    run_pair(trl.GAE, ours.TritonGAE, td, call=call, gamma=0.97, lmbda=0.9, value_network=net)
    run_pair(trl.TDLambdaEstimator, ours.TritonTDLambdaEstimator, td, call=call, gamma=0.97,
             lmbda=0.9, value_network=net)


def test_multi_agent_gae(gen):
    n_agents, T = 3, 20
    net = TensorDictModule(nn.Linear(OBS, 1), in_keys=["obs"], out_keys=["state_value"])
    done, terminated = flags(gen, (4, T, 1))
    td = TensorDict(
        {
            "obs": torch.randn(4, T, n_agents, OBS, generator=gen),
            "next": {"obs": torch.randn(4, T, n_agents, OBS, generator=gen),
                     "reward": torch.randn(4, T, 1, generator=gen),  # team reward
                     "done": done, "terminated": terminated},
        },
        batch_size=(4, T),
    )
    for average_gae in (False, True):
        run_pair(trl.MultiAgentGAE, ours.TritonMultiAgentGAE, td, gamma=0.97, lmbda=0.9,
                 value_network=net, average_gae=average_gae)


def vtrace_data(gen, act, T=25):
    td = rollout(gen, T=T)
    with torch.no_grad():
        act(td)
    # a behaviour policy a bit off the current one
    td["action_log_prob"] = td["action_log_prob"] + 0.3 * torch.randn(
        td["action_log_prob"].shape, generator=gen
    )
    return td


def test_vtrace(gen):
    act = actor()
    td = vtrace_data(gen, act)
    for kw in ({}, {"rho_thresh": 0.8, "c_thresh": 0.9}, {"average_adv": True}):
        run_pair(trl.VTrace, ours.TritonVTrace, td, gamma=0.97, value_network=critic(),
                 actor_network=act, **kw)


def test_differentiable_gradients_reach_rewards(gen):
    """differentiable=True: gradients reach the rewards, not the critic's parameters."""
    td = rollout(gen)
    grads = []
    for cls in (trl.GAE, ours.TritonGAE):
        net = critic()
        est = cls(gamma=0.97, lmbda=0.9, value_network=net, differentiable=True)
        data = td.clone()
        reward = data["next", "reward"].clone().requires_grad_(True)
        data["next", "reward"] = reward
        est(data)
        data["advantage"].pow(2).sum().backward()
        grads.append(reward.grad)
        assert all(p.grad is None for p in net.parameters())
    assert_close(grads[1], grads[0])


# ------------------------------------------------------------------ through a loss


def ppo_data(gen, device="cpu"):
    act = actor(device)
    td = rollout(gen, T=30, device=device)
    with torch.no_grad():
        act(td)
    return act, td


@pytest.mark.parametrize("device", DEVICES)
def test_clip_ppo_loss_make_value_estimator(device, gen):
    act, td = ppo_data(gen, device)
    losses = []
    for cls in (trl.GAE, ours.TritonGAE):
        crit = critic(device)
        loss = ClipPPOLoss(act, crit)
        loss.make_value_estimator(cls, gamma=0.97, lmbda=0.9, value_network=crit)
        assert type(loss.value_estimator) is cls
        data = td.clone()
        out = loss(data)
        total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
        total.backward()
        losses.append((out["loss_objective"], out["loss_critic"]))
    for a, b in zip(losses[1], losses[0], strict=True):
        assert_close(a, b)


@pytest.mark.parametrize(
    "value_type, classes",
    [
        ("GAE", (trl.GAE, ours.TritonGAE)),
        ("TDLambda", (trl.TDLambdaEstimator, ours.TritonTDLambdaEstimator)),
        ("TD1", (trl.TD1Estimator, ours.TritonTD1Estimator)),
        ("VTrace", (trl.VTrace, ours.TritonVTrace)),
    ],
)
def test_clip_ppo_loss_registry_after_install(value_type, classes, gen, installed):
    from torchrl.objectives.utils import ValueEstimators

    act, td = ppo_data(gen)
    outs = []
    for patched, cls in zip((False, True), classes, strict=True):
        if patched:
            rl_triton_torchrl.install()
        crit = critic()
        loss = ClipPPOLoss(act, crit)
        loss.make_value_estimator(getattr(ValueEstimators, value_type), gamma=0.97)
        assert type(loss.value_estimator) is cls
        data = td.clone()
        out = loss(data)
        outs.append((out["loss_objective"], out["loss_critic"]))
    for a, b in zip(outs[1], outs[0], strict=True):
        assert_close(a, b)


def test_default_estimator_after_install(installed, gen):
    act, td = ppo_data(gen)
    rl_triton_torchrl.install()
    loss = ClipPPOLoss(act, critic())
    assert type(loss.value_estimator) is ours.TritonGAE  # built lazily from the registry
    loss(td.clone())
