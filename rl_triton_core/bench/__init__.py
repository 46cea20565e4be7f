"""The benchmark: ``python -m rl_triton_core.bench`` (or ``nox -s bench``).

For each estimator the install has (gae, lambda_returns, discounted_returns, vtrace,
retrace, retrace_from_actions, eligibility_traces, episodic_cumsum, linear_recurrence),
each shape (N streams x T steps), layout (batch-major ``[N, T]`` with ``time_dim=-1``,
time-major ``[T, N]`` with ``time_dim=0``) and truncation case (``truncated=None`` or
a flag tensor), it checks the output against the float64 reference and times the call
three ways (full call, back-to-back, CUDA-graph device time), beside the peers: the
floor (a Triton elementwise kernel moving the same bytes), a CleanRL-style Python
loop, TorchRL's functional GAE / TD(lambda), a ``torch.compile``d log-depth scan, and,
given a checkout of rl-triton (``--rl-triton-src PATH`` or ``$RL_TRITON_SRC``),
rl-triton 0.1.3's estimators and PufferLib 3.0's advantage kernel.

    python -m rl_triton_core.bench                 # the full set, ~5 min on an H200
    python -m rl_triton_core.bench --quick         # three shapes, ~1-2 min
    python -m rl_triton_core.bench --estimators gae --shapes 4096x128 --layouts batch
    python -m rl_triton_core.bench --cpu-smoke     # no GPU: tiny shapes, harness logic only
    python -m rl_triton_core.bench.plots bench_out/benchmarks.json   # remake md + PNGs

Files (Liger-Kernel style: a small setup per estimator handed to one shared harness,
a long-format result file, plotting kept separate):

* ``harness.py`` -- the estimators' setup (:class:`~rl_triton_core.bench.harness.Spec`:
  how to call, which inputs), the input data, the reference check, the timing harness
  and the run loop;
* ``peers.py``   -- the floor kernel and the peer implementations;
* ``ext_peers.py`` -- the peers imported from an rl-triton checkout (rl-triton, PufferLib)
  and how each case is mapped onto their conventions;
* ``plots.py``   -- the markdown table and the PNG plots, made from the JSON only.

Nothing here is imported by the library itself.
"""
