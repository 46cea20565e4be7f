"""numba compiles one at a time across processes (``_host.compile_lock``): numba's on-disk
cache has no lock, and two processes saving variants of one function at once can leave
an index entry pointing at the other's code, which then fails on every call ("can't
unbox array from PyObject"). A process that needs a compile while another holds the lock
waits for it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HOLD = r"""
import sys, time
from rl_triton_core import _host
with _host.compile_lock():
    print("held", flush=True)
    time.sleep(float(sys.argv[1]))
    print("released", repr(time.time()), flush=True)
"""

COMPILE = r"""
import time, torch
import rl_triton_core as rc
x = torch.randn(3, 50, dtype=torch.float64)
done = torch.rand(3, 50) < 0.1
start = time.time()
rc.eligibility_traces(x, done, gamma=0.9, lmbda=0.8, time_dim=-1)  # a fresh cache: a compile
masks = torch.rand(2, 40) < 0.7
rc.masked_gae(torch.randn(2, 40), torch.randn(2, 40), masks, whiten=True, time_dim=-1)
print("compiled", repr(start), repr(time.time()), flush=True)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="the lock is between threads only there")
def test_a_compile_waits_for_another_process_holding_the_lock(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path), NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               RL_TRITON_CORE_CPU_KERNEL="numba", RL_TRITON_CORE_BACKEND="cpu",
               RL_TRITON_CORE_NUMBA_CACHE="1")
    env.pop("TRITON_INTERPRET", None)
    hold_s = 4.0
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(hold_s)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        res = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True,
                             text=True, timeout=600)
        out, err = holder.communicate(timeout=60)
    finally:
        holder.kill()
    assert res.returncode == 0, res.stderr[-4000:]
    released = float(out.split()[-1])
    _, start, done = res.stdout.split()
    assert float(done) >= released, (start, done, released)
    assert (tmp_path / "numba").exists()  # the compiles went to the on-disk cache
