"""Tuning knobs: one explicit, immutable object, part of every launch's cache key.

The defaults come from measurements on the H200 (docs/benchmarks.md); they are for
sweeps, tests and bug reports, not something a user needs to set::

    import rl_triton_core as rc
    with rc.tuning(look_back=False):      # segmented scans as three launches
        rc.gae(r, v, term, time_dim=-1)
    rc.current_tuning()                   # the Tuning in effect

Some knobs' defaults read the environment once, at import: ``RL_TRITON_CORE_FASTPATH=0``
(``cached_launch=False``), ``RL_TRITON_CORE_LOOKBACK=1|0`` (``look_back``),
``RL_TRITON_CORE_FUSED_ACTIONS=1|0`` (``fused_actions``), ``RL_TRITON_CORE_FLIP=0``,
``RL_TRITON_CORE_EVEN=0`` and ``RL_TRITON_CORE_PIPE=1|0`` (``flip``, ``even``, ``pipe``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Tuning:
    """The launch knobs (all part of the cache key of a launch).

    Attributes:
        cached_launch: a repeated call with the same shapes, strides, dtypes and device
            replays the recorded launch (no validation, layout work or argument binding).
        segment_len: split time into segments of this many steps (a power of two >= 16)
            on the Triton path, whatever the shape (tests use it to reach the segmented
            scan on small shapes); None: the plan decides.
        tile: ``(BLOCK_N, BLOCK_T, num_warps[, SCALAR_N[, STAGES[, PROGRAMS_PER_SM]]])``
            instead of the plan's tile (sweeps); None: the plan's.
        programs_per_sm: time is split into segments until there are about this many
            programs per multiprocessor.
        look_back: segmented plans as one launch with a look-back over the segments'
            maps (True), as three launches (False), or where measured to pay (None).
        look_window: segments per block of the look-back, read at a time (a power of
            two >= 2).
        middle_elems: the middle pass's tile (streams x maps per step).
        tm_steps: steps per thread and chunk of the time-major (thread-per-stream) tiles
            (at least 16).
        tm_few: time-major data of fewer than 32 streams in one-warp tiles of a stream a
            lane, the lanes left over along time (each its own ``tm_steps`` consecutive
            steps), so each thread scans its steps in registers and only the lanes' maps
            cross lanes: True wherever there are lanes left over, False never (the tile
            of up to 32 streams x 128 steps over 8 warps, whose scan crosses threads at
            every step), None where measured faster (up to 8 streams: 4 lanes or more).
        prefetch: CUDA: ask L2 for the inputs of the chunk this many ahead at the top of
            each chunk of the loop over chunks (0: off); None: 2 where measured faster
            (time-major programs of one warp that walk all of T: 16384x512 0.70-0.79x;
            with time segments it was slower).
        flip: time-major reverse scans load each chunk latest step first and scan
            forward (no cross-warp reversal of every value), in the look-back and in the
            loops over chunks that build the next chunk first (``pipe``) on one warp a
            program (V-trace also on two); False: Triton's reverse scan
            (``RL_TRITON_CORE_FLIP=0``).
        even: the look-back's time-major tiles without bounds where every stream block is
            full and T a whole number of chunks (``RL_TRITON_CORE_EVEN=0``: bounded).
        pipe: the time-major loops over chunks build the next chunk's coefficients (its
            loads) before this chunk's scan and stores: True everywhere (the few-stream
            tile of ``tm_few`` included), False nowhere, None where measured faster
            (TD(lambda) and discounted returns, traces and episodic sums; GAE and
            V-trace on one warp a program, V-trace also on two; not the few-stream
            tile; ``RL_TRITON_CORE_PIPE=1`` / ``=0``).
        cpu_threads: threads of the CPU path (None: min(cores, 8)).
        cpu_plans: tests: record and replay cached launches for CPU tensors too (under
            the Triton interpreter), so the replay logic is checked without a GPU.
        row_tiles: batch-major rows of 129-4096 steps as one chunk per program (a whole
            row, 4-16 steps a thread) where that fills the GPU; False: the 128-step
            chunk tiles (sweeps).
        wide_index: tests: int64 element offsets even where int32 ones reach every
            element (the plan's choice for tensors under $2^{31}$ elements).
        small_tokens: token estimators that whiten or fill, on batches of at most this
            many tokens (responses and tokens each rounded up to a power of two; not
            packed) run in one launch of one program (0: never; the scan, then the
            whitening pass).
        fused_actions: ``retrace_from_actions`` on the Triton path in one pass (the
            per-action pieces built as the scan's coefficients): None (default) where
            it measured faster than two passes (batch-major rows of 16-1024 steps);
            True wherever its plan allows (no time segments, at most 4 steps a thread;
            ``RL_TRITON_CORE_FUSED_ACTIONS=1``); False (``=0``): the pass over the
            actions, then retrace's scan.
    """

    cached_launch: bool = os.environ.get("RL_TRITON_CORE_FASTPATH", "1") == "1"
    segment_len: int | None = None
    tile: tuple | None = None
    programs_per_sm: int = 8
    look_back: bool | None = {"1": True, "0": False}.get(
        os.environ.get("RL_TRITON_CORE_LOOKBACK", ""))
    look_window: int = 16
    middle_elems: int = 2048
    tm_steps: int = 16
    tm_few: bool | None = None
    prefetch: int | None = None
    flip: bool = os.environ.get("RL_TRITON_CORE_FLIP", "1") == "1"
    even: bool = os.environ.get("RL_TRITON_CORE_EVEN", "1") == "1"
    pipe: bool | None = {"1": True, "0": False}.get(os.environ.get("RL_TRITON_CORE_PIPE", ""))
    cpu_threads: int | None = None
    cpu_plans: bool = False
    row_tiles: bool = True
    wide_index: bool = False
    small_tokens: int = 4096
    fused_actions: bool | None = {"1": True, "0": False}.get(
        os.environ.get("RL_TRITON_CORE_FUSED_ACTIONS", ""))

    def __post_init__(self):
        # (name, lowest, power of two, what the message says)
        for name, lo, pow2, what in (
                ("prefetch", 0, False, "None or a whole number of chunks >= 0"),
                ("small_tokens", 0, False, "a whole number of tokens >= 0"),
                ("look_window", 2, True, "a power of two >= 2"),
                ("tm_steps", 16, True, "a power of two >= 16"),
                ("segment_len", 16, True, "None or a power of two >= 16"),
                ("middle_elems", 2, True, "a power of two >= 2"),
                ("programs_per_sm", 0, False, "a whole number >= 0")):
            v = getattr(self, name)
            if v is None and name in ("segment_len", "prefetch"):
                continue
            if (isinstance(v, bool) or not isinstance(v, int) or v < lo
                    or (pow2 and v & (v - 1))):
                raise ValueError(f"{name} must be {what}, got {v!r}")
        # hashed once: the tuning is part of every cached launch's key
        fields = tuple(getattr(self, f.name) for f in dataclasses.fields(self))
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self):
        return self._hash

    def replace(self, **changes) -> Tuning:
        return dataclasses.replace(self, **changes)


_current = Tuning()
_INTERNED = {_current: _current}  # each Tuning value set so far, as its first object


def current_tuning() -> Tuning:
    """The [`Tuning`][] in effect."""
    return _current


def set_tuning(value: Tuning) -> Tuning:
    """Make ``value`` the tuning in effect (process-wide); returns the previous one."""
    global _current
    if not isinstance(value, Tuning):
        raise TypeError(f"set_tuning takes a Tuning, got {type(value).__name__}")
    # one object per value: the C replay finds a recorded call by the tuning's identity,
    # so a block entered again with the same knobs repeats the calls recorded before
    # (at most 4096 values: past that a new value is used as it is; none is forgotten,
    # which would give a block entered again another object)
    known = _INTERNED.get(value)
    if known is None and len(_INTERNED) < 4096:
        known = _INTERNED[value] = value
    previous, _current = _current, known if known is not None else value
    return previous


_CHANGED = {}  # (tuning, changes) -> the interned tuning with those changes


class _Block(contextlib.ContextDecorator):
    """The context manager of :func:`tuning` (a class: a generator-based one costs more
    than a short call; also a decorator, as ``contextlib.contextmanager``'s)."""

    __slots__ = ("changes", "previous")

    def _recreate_cm(self):  # each decorated call its own block
        return _Block(self.changes)

    def __init__(self, changes):
        self.changes = changes

    def __enter__(self) -> Tuning:
        global _current
        try:
            key = (_current, tuple(self.changes.items()))
            new = _CHANGED.get(key)
        except TypeError:  # an unhashable value: Tuning's own check says what is wrong
            key = new = None
        if new is not None:  # a block entered before with these changes: its tuning
            self.previous, _current = _current, new
            return new
        self.previous = set_tuning(_current.replace(**self.changes))
        if key is not None and len(_CHANGED) < 4096 and _INTERNED.get(_current) is _current:
            _CHANGED[key] = _current
        return _current

    def __exit__(self, *exc):
        set_tuning(self.previous)
        return False


def tuning(**changes):
    """Run a block with some knobs changed (see [`Tuning`][] for their names)."""
    return _Block(changes)
