"""One recorded call for every cached launch: the scan on Triton, the two passes of
``retrace_from_actions`` on Triton, and the CPU scan (its C kernel or numba).

A call that ran through the full path is recorded as where each argument of its kernel
comes from -- by position in the kernel's parameter list, found from the parameter's
name where the record is made:

- a constant: the ``template`` (the layout's strides, the sizes, an absent input's
  stand-in);
- one of the user's tensors (``tensors``: kernel position <- position in the call's
  arguments);
- one of the user's numbers, as a float (``numbers``), or as the float32 pair of a
  float64 coefficient (``pairs``: the high half at its position, the low half at its
  place in a tuple argument);
- a tensor the call allocates (``allocs``: like one of the user's tensors, or of a
  fixed shape; placed at kernel positions by ``placed``): the outputs, a workspace.

A repeated call with the same key (shapes, strides, dtypes, devices, tuning: the key
fixes everything the record took from the first call) checks its numbers' ranges and,
for a call with ``out=`` tensors, that they share no memory with the inputs (pointers
against recorded byte extents: no data read, no host synchronisation), allocates,
fills the arguments and hands them to its ``run``: the compiled Triton kernels
(``_tl.Replay``) or the CPU scan (``_dispatch.CpuRun``). The same record, turned
into ``_claunch``'s C record, is what a CUDA call repeated in C runs.
"""

from __future__ import annotations

import torch

from rl_triton_core._host import empty, split


class Alloc:
    """A tensor the call allocates: ``torch.empty_like`` of the user's argument ``like``
    in ``dtype``, or of ``shape`` (``zero``: ``torch.zeros``) on ``device``; ``pooled``:
    a CPU output of ``shape`` as the CPU path makes it (``_host.empty``)."""

    __slots__ = ("like", "shape", "dtype", "device", "zero", "pooled")

    def __init__(self, like, shape, dtype, device, zero=False, pooled=False):
        self.like, self.shape, self.dtype, self.device, self.zero = like, shape, dtype, device, zero
        self.pooled = pooled

    def make(self, raw):
        if self.pooled:
            return empty(self.shape, self.dtype)
        if self.like is not None:
            return torch.empty_like(raw[self.like], dtype=self.dtype)
        new = torch.zeros if self.zero else torch.empty
        return new(self.shape, dtype=self.dtype, device=self.device)


class Recorded:
    """A recorded call (see the module's docstring). Calling it with a repeated call's
    arguments (``raw``, in the order the key was made from) returns the call's result,
    or None where the full path must run: a number out of range, an ``out=`` tensor
    that overlaps, or a ``run`` that could not launch (``broken`` where the run says
    that no record of its kind can be replayed here: ``run.fatal``)."""

    __slots__ = ("run", "template", "tensors", "numbers", "pairs", "checks", "allocs",
                 "placed", "returns", "in_extents", "out_extents", "broken")

    def __init__(self, run, template, *, tensors=(), numbers=(), pairs=(), checks=(),
                 allocs=(), placed=(), returns=(), in_extents=(), out_extents=()):
        self.run = run
        self.tensors, self.numbers, self.pairs = tuple(tensors), tuple(numbers), tuple(pairs)
        self.checks, self.allocs, self.placed = tuple(checks), tuple(allocs), tuple(placed)
        self.returns = tuple(returns)
        self.in_extents, self.out_extents = tuple(in_extents), tuple(out_extents)
        self.broken = False
        template = list(template)
        for pos, _ in self.tensors + self.placed:  # no reference to the first call's tensors
            template[pos] = None
        self.template = tuple(template)

    def _overlap(self, raw) -> bool:
        """Whether an out= tensor shares memory with an input or the other output."""
        outs = []
        for idx, ext in self.out_extents:
            p = raw[idx].data_ptr()
            outs.append((p, p + ext))
        for idx, ext in self.in_extents:
            p = raw[idx].data_ptr()
            q = p + ext
            for lo, hi in outs:
                if p < hi and lo < q:
                    return True
        return len(outs) == 2 and outs[0][0] < outs[1][1] and outs[1][0] < outs[0][1]

    def __call__(self, raw):
        for idx, lo, hi in self.checks:
            if not lo <= raw[idx] <= hi:  # also catches NaN: the full path raises the error
                return None
        if self.out_extents and self._overlap(raw):  # the full path raises the error
            return None
        made = [a.make(raw) for a in self.allocs]
        args = list(self.template)
        for pos, k in self.placed:
            args[pos] = made[k]
        for pos, idx in self.tensors:
            args[pos] = raw[idx]
        for pos, idx in self.numbers:
            args[pos] = float(raw[idx])
        if self.pairs:
            lo_pos = self.pairs[0][1]
            lo = list(args[lo_pos])
            for pos, _, k, idx in self.pairs:
                args[pos], lo[k] = split(float(raw[idx]))
            args[lo_pos] = tuple(lo)
        if not self.run(args):
            self.broken = self.run.fatal
            return None
        if len(self.returns) == 1:
            made_, idx = self.returns[0]
            return made[idx] if made_ else raw[idx]
        return tuple(made[idx] if made_ else raw[idx] for made_, idx in self.returns)

    def sources(self):
        """``{path: (kind, index)}`` of every argument the call fills, by kind: "alloc"
        (an allocation), "arg" (a user's tensor), "f32" (a number), "hi" and "lo" (a
        float64 number's halves); a path is (position,) or (position, tuple index)."""
        out = {(pos,): ("alloc", k) for pos, k in self.placed}
        out.update({(pos,): ("arg", idx) for pos, idx in self.tensors})
        out.update({(pos,): ("f32", idx) for pos, idx in self.numbers})
        for pos, lo_pos, k, idx in self.pairs:
            out[(pos,)] = ("hi", idx)
            out[(lo_pos, k)] = ("lo", idx)
        return out
