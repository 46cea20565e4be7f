"""The scan: every estimator of ``rl_triton_core.estimators`` as one first-order linear
recurrence, from the argument checks (``_call``) through the backend's choice and the
cached launch (``_dispatch``) to the Triton kernel (``_launch``, ``_kernel``), the CPU
kernels (``_cpu_c`` and the C extension ``_cscan``; ``_cpu``, numba), the gradients
(``_autograd``), the custom ops (``_ops``), ``retrace_from_actions``' per-action pass
(``_from_actions``, ``_actions``) and CUDA calls repeated in C (``_claunch``).
Nothing here is public: the estimators are.
"""
