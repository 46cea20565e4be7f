"""PPO and APPO with a GPU learner (``num_gpus_per_learner=1``, local learner) and the
flag on: the credit assignment runs on ``cuda:0`` through the core's Triton kernels, and
the training step succeeds. Skipped without CUDA (run on the H200:
``bash scripts/rllib_gpu.sh``).

How the adapter hooks in, and so where the device is checked:

* PPO: the learner connector's ``TritonGeneralAdvantageEstimation`` piece calls
  ``rl_triton_rllib._core.gae`` (looked up at call time) and writes
  ``Postprocessing.ADVANTAGES`` / ``VALUE_TARGETS`` into the train batch;
* APPO: the loss calls ``rl_triton_rllib.functional.vtrace_torch`` (through the
  dispatcher that ``TritonVTraceMixin`` patches into RLlib's learner module), which
  calls ``rl_triton_core.vtrace``.

Under both lies ``rl_triton_core.scan._dispatch``: a first call of a shape goes through
``_run_triton`` (the kernel launch; later ones of the same shape replay the recorded
launch), a CPU call through ``_run_cpu``. The spies below pass everything through.
"""

from __future__ import annotations

import math

import pytest
import rl_triton_rllib
import torch
from ray.rllib.algorithms.appo import APPOConfig
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.evaluation.postprocessing import Postprocessing
from rl_triton_rllib import _core, functional

from rl_triton_core.scan import _dispatch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("ray_session"),
]

CUDA0 = torch.device("cuda", 0)


@pytest.fixture
def kernel_calls(monkeypatch):
    """Records every backend call of the core in this process: ``("triton", device)``
    for a Triton launch, ``("cpu", device)`` for the CPU path."""
    calls = []
    run_triton, run_cpu = _dispatch._run_triton, _dispatch._run_cpu

    def spy_triton(mode, layout, out0, *args, **kwargs):
        calls.append(("triton", out0.device))
        return run_triton(mode, layout, out0, *args, **kwargs)

    def spy_cpu(mode, layout, out0, *args, **kwargs):
        calls.append(("cpu", out0.device))
        return run_cpu(mode, layout, out0, *args, **kwargs)

    monkeypatch.setattr(_dispatch, "_run_triton", spy_triton)
    monkeypatch.setattr(_dispatch, "_run_cpu", spy_cpu)
    monkeypatch.setattr(_dispatch, "_PLANS", {})  # no replays of launches recorded earlier
    monkeypatch.delenv("RL_TRITON_CORE_BACKEND", raising=False)  # auto: CUDA -> triton
    return calls


def assert_on_cuda0_by_the_kernel(calls, kernel_calls, what):
    assert calls, f"the Triton {what} was never called"
    for inputs, outputs in calls:
        assert set(inputs) == {CUDA0}, f"{what} inputs on {inputs}"
        assert set(outputs) == {CUDA0}, f"{what} outputs on {outputs}"
    assert _dispatch.backend_for(CUDA0) == "triton"
    assert not any(backend == "cpu" for backend, _ in kernel_calls), kernel_calls
    assert ("triton", CUDA0) in kernel_calls, f"no Triton kernel launch: {kernel_calls}"


def learner_device(algo):
    (device,) = [r.get() for r in algo.learner_group.foreach_learner(
        lambda learner: str(learner._device))]
    return device


def test_ppo_gae_on_cuda(monkeypatch, kernel_calls):
    gae_calls, batch_columns = [], []
    inner_gae = _core.gae

    def spy_gae(rewards, values, terminated, truncated=None, **kwargs):
        out = inner_gae(rewards, values, terminated, truncated, **kwargs)
        gae_calls.append(({t.device for t in (rewards, values, terminated, truncated)},
                          {t.device for t in out}))
        return out

    monkeypatch.setattr(_core, "gae", spy_gae)
    piece_cls = rl_triton_rllib.TritonGeneralAdvantageEstimation
    inner_call = piece_cls.__call__

    def spy_call(self, *, rl_module, episodes, batch, **kwargs):
        out = inner_call(self, rl_module=rl_module, episodes=episodes, batch=batch,
                         **kwargs)
        for module_batch in out.values():
            batch_columns.append({
                column: (module_batch[column].device, module_batch[column].dtype)
                for column in (Postprocessing.ADVANTAGES, Postprocessing.VALUE_TARGETS)})
        return out

    monkeypatch.setattr(piece_cls, "__call__", spy_call)
    config = (PPOConfig()
              .environment("CartPole-v1")
              .env_runners(num_env_runners=0)
              .learners(num_learners=0, num_gpus_per_learner=1)
              .training(train_batch_size_per_learner=500, minibatch_size=250, num_epochs=1)
              .debugging(seed=0))
    algo = rl_triton_rllib.enable(config).build_algo()
    try:
        assert algo.learner_group.is_local
        assert learner_device(algo) == "cuda:0"
        for _ in range(2):
            result = algo.train()
    finally:
        algo.stop()
    losses = result["learners"]["default_policy"]
    assert math.isfinite(losses["total_loss"]) and math.isfinite(losses["vf_loss"])
    assert result["env_runners"]["num_env_steps_sampled_lifetime"] >= 1000
    assert_on_cuda0_by_the_kernel(gae_calls, kernel_calls, "GAE")
    assert len(batch_columns) >= 2  # one train batch per iteration
    for columns in batch_columns:
        for column, (device, dtype) in columns.items():
            assert device == CUDA0, (column, device)
            assert dtype == torch.float32, (column, dtype)


def test_appo_vtrace_on_cuda(monkeypatch, kernel_calls):
    vtrace_calls = []
    inner = functional.vtrace_torch

    def spy(**kwargs):
        out = inner(**kwargs)
        vtrace_calls.append(({v.device for v in kwargs.values()
                              if isinstance(v, torch.Tensor)}, {t.device for t in out}))
        return out

    monkeypatch.setattr(functional, "vtrace_torch", spy)
    config = (APPOConfig()
              .environment("CartPole-v1")
              .env_runners(num_env_runners=0, rollout_fragment_length=50)
              .learners(num_learners=0, num_gpus_per_learner=1)
              .training(train_batch_size_per_learner=200, num_gpu_loader_threads=1)
              .reporting(min_time_s_per_iteration=1)
              .debugging(seed=0))
    algo = rl_triton_rllib.enable(config).build_algo()
    try:
        assert algo.learner_group.is_local
        assert learner_device(algo) == "cuda:0"
        trained = 0
        for _ in range(10):
            result = algo.train()
            losses = result.get("learners", {}).get("default_policy", {})
            if "total_loss" in losses:
                assert math.isfinite(losses["total_loss"])
                trained += 1
                if trained == 2:
                    break
        assert trained, "APPO made no learner update in 10 iterations"
    finally:
        algo.stop()
    assert_on_cuda0_by_the_kernel(vtrace_calls, kernel_calls, "V-trace")
