"""The token estimators of ``rl_triton_core.tokens`` (LLM post-training: masked GAE and
returns over response tokens, whitening, packed sequences): their Triton kernel
(``_token_kernel``) and their CPU kernels (``_token_cpu``, numba, and the C extension
``_ctoken``). Nothing here is public: ``rl_triton_core.tokens`` is.
"""
