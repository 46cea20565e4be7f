"""The benchmark: ``python -m rl_triton_core.bench`` (or ``nox -s bench``).

For each estimator, shape (N streams x T steps), layout (batch-major ``[N, T]``,
``time_dim=-1``, or time-major ``[T, N]``, ``time_dim=0``) and truncation case, it
checks the output against the float64 reference and times the call three ways
(full call, back-to-back, CUDA-graph device time), beside the peers: the floor
(a Triton elementwise kernel moving the same bytes), a CleanRL-style Python loop,
TorchRL's functional GAE / TD(lambda) and a ``torch.compile``d log-depth scan.

Files (Liger-Kernel style: small setup functions handed to one shared harness,
a long-format result file, plotting kept separate):

* ``harness.py`` -- the estimators' setup (which inputs, how to call), the input
  data, the reference check, the timing harness and the run loop;
* ``peers.py``   -- the floor kernel and the peer implementations;
* ``plots.py``   -- the markdown table and the PNG plots, made from the JSON only
  (``python -m rl_triton_core.bench.plots bench_out/benchmarks.json`` remakes them).

Nothing here is imported by the library itself.
"""
