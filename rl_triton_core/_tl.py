"""Device-side helpers the scan's and the token estimators' Triton kernels share: a load
in the compute dtype, a flag read as a bool whatever its dtype, and a Python number
passed as float32 hi and lo halves (``_host.split``) read back in the compute dtype.

Imported by the Triton kernels only (``scan._kernel``, ``token._token_kernel``): the CPU
path never imports Triton.
"""

import triton
import triton.language as tl


@triton.jit
def load(P, off, m, FP64: tl.constexpr):
    """``P[off]`` where ``m`` (0 elsewhere) in the compute dtype: float64 for float64
    data, float32 otherwise."""
    x = tl.load(P + off, mask=m, other=0)
    if FP64:
        return x.to(tl.float64)
    else:
        return x.to(tl.float32)


@triton.jit
def flag(P, off, m):
    """A flag as a bool, False where ``m`` is: nonzero means set, as ``flag.bool()``
    reads it (2.0, -1 and NaN are set, -0.0 is not), whatever its dtype."""
    ety: tl.constexpr = P.dtype.element_ty
    if ety.is_floating():
        # a float flag read in 16-bit pieces: set where any piece is nonzero, the sign bit
        # aside (-0.0 is clear; NaN and inf are set). Loaded as floats (or as integers of
        # their width), the flags made the scan's layout pass run the forward scans in the
        # flag load's layout instead of the data's: another scan tree, 1 ulp off the
        # result of the same flags as bool. (Byte offsets in int64: an element offset that
        # fits int32 may not, times the pieces.)
        nh: tl.constexpr = ety.primitive_bitwidth // 16
        q = P.to(tl.pointer_type(tl.int16)) + off.to(tl.int64) * nh
        acc = tl.load(q + (nh - 1), mask=m, other=0) & 0x7FFF  # the sign's piece (LE)
        for j in tl.static_range(nh - 1):
            acc = acc | tl.load(q + j, mask=m, other=0)
        return acc != 0
    else:
        return tl.load(P + off, mask=m, other=0) != 0


@triton.jit
def number(hi, lo, FP64: tl.constexpr):
    """A Python float passed as float32 ``hi`` + ``lo`` (``_host.split``): their sum in
    float64 for float64 data (exact to ~48 bits), ``hi`` otherwise."""
    if FP64:
        one = tl.full([], 1.0, tl.float64)  # (not .to: the interpreter passes floats)
        return hi * one + lo * one
    else:
        return hi
