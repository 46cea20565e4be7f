"""The ncu target behind docs/bench/h200-2026-12-03-token-rows.md: one whitened masked GAE
call at 256x4096 and the floor's two passes, between cudaProfilerStart/Stop, after
warm-up calls. Counters, not time (ncu serialises and replays each kernel):

    S=smsp__average_warps_issue_stalled
    M=gpu__time_duration.sum,smsp__inst_executed.sum,lts__t_bytes.sum,\
smsp__issue_active.avg.pct_of_peak_sustained_active
    for s in barrier long_scoreboard short_scoreboard wait not_selected; do
      M=$M,${S}_${s}_per_issue_active.ratio; done
    ncu --clock-control none --cache-control none --profile-from-start off --metrics $M \
        python scripts/token_ncu.py [BT:warps:K]

(a git show of an older rl_triton_core/_token_kernel.py, put in its place, profiles
that version the same way).
"""
import sys

import torch

import rl_triton_core as rc
from rl_triton_core import _token_kernel as K
from rl_triton_core.bench import peers as P
from rl_triton_core.bench.tokens import inputs

if len(sys.argv) > 1:
    cfg = (*(int(x) for x in sys.argv[1].split(":")), 1)[:3]  # K = 1 when left out
    K.config = lambda n, t: cfg
B, T = 256, 4096
r, v, m = inputs(B, T, torch.float32, "cuda")
adv = torch.empty(B, T, device="cuda")
f1 = P.make_floor([r, v, m], [], [], 2, (B, T), torch.float32)
f2 = P.make_floor([adv], [], [], 1, (B, T), torch.float32)


def call():
    return rc.masked_gae(r, v, m, gamma=1.0, lmbda=0.95, whiten=True, count_eps=1e-8,
                         time_dim=-1)


for _ in range(30):
    call(), f1(), f2()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
call()
f1()
f2()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
