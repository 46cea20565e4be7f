"""The Triton launcher: the plan (tile, warps, time segments), the launch, and the
cached launch that repeats it.

``launch`` turns one validated call (tensors by slot, coefficients, layout) into the
kernel's lean argument list: a pointer per present input (None for an absent one),
one float32 per scalar coefficient, and one tuple of strides -- three shared by
every data tensor and the outputs where they agree (UNIFORM), else three per data
slot and two per no-time slot in the order of ``_table.STRIDE_SLOTS``.

The cached launch: a repeated call with the same shapes, strides, dtypes, device and
tuning skips validation, layout work and Triton's argument binding. The first call of
a configuration goes through the full path and is recorded (:func:`record`) as a
:class:`_record.Recorded` whose run is a :class:`Replay` of the compiled kernels and
their constexprs. Nothing in a repeat reads tensor data: no host synchronisation.
"""

from __future__ import annotations

import math

import torch
import triton
from triton import knobs  # noqa: F401 (the launch hooks _dispatch reads)

from rl_triton_core import _record, _table
from rl_triton_core._config import Tuning, current_tuning
from rl_triton_core._host import sm_count as _sm_count
from rl_triton_core._host import split
from rl_triton_core._tl import Replay
from rl_triton_core._validate import extent
from rl_triton_core.scan._kernel import scan_kernel

# scan_kernel's argument positions, from its parameter names: a slot's pointer is the
# slot's name in capitals, a coefficient's number the slot's own name
_ARG = {name: i for i, name in enumerate(scan_kernel.arg_names)}
POINTER_POS = {s: _ARG[s.upper()]
               for s in _table.DATA_SLOTS + _table.COEF_SLOTS + _table.NOTIME_SLOTS}
WS_POS = _ARG["WS"]
SCALAR_POS = {s: _ARG[s] for s in _table.COEF_SLOTS}
LO_POS, STR_POS = _ARG["LO"], _ARG["STR"]
LO_INDEX = {s: i for i, s in enumerate(_table.COEF_SLOTS)}  # the slot's place in LO
_DATA = _table.DATA_SLOTS + _table.COEF_SLOTS
ROW_MAX_T = 4096  # whole-row tiles (batch-major) up to this many steps


# ----------------------------------------------------------------------------- plan


def _segments(N: int, T: int, block_n: int, block_t: int, device, tune: Tuning,
              per_sm: int) -> tuple:
    """(SEG_LEN, S): split time when the stream blocks alone cannot fill the GPU."""
    if tune.segment_len is not None:  # tests: a power of two >= 16
        seg = max(block_t, tune.segment_len // block_t * block_t)
    else:
        # enough programs to keep every SM busy: a few long streams get ~per_sm per SM
        n_blocks = triton.cdiv(N, block_n)
        target = per_sm * _sm_count(device)
        seg = T
        chunks = triton.cdiv(T, block_t)
        if n_blocks < target // 4 and chunks > 1:
            S = min(chunks, triton.cdiv(target, n_blocks), 512)
            seg = triton.cdiv(chunks, S) * block_t
    S = max(1, triton.cdiv(T, seg))
    if S == 1:
        seg = max(T, 1)
    return seg, S


def plan(N: int, T: int, time_contiguous: bool, device, mode: str = _table.MODE_GAE,
         elem_bytes: int = 4, tune: Tuning | None = None, sub: bool = True):
    """Tile shape, warps and time segmentation:
    (BLOCK_N, BLOCK_T, SEG_LEN, S, num_warps, SCALAR_N, STAGES).

    Batch-major data (time contiguous): one warp per stream row and a chunk of
    32 x VEC steps (VEC = 16 bytes of the data type: one vector load per thread
    and tensor), so the scan runs in registers and warp shuffles, without shared
    memory. Measured on the H200 (docs/notes.md, "Tile sweep on the H200"): 8 rows x 8 warps
    for GAE / TD(lambda), 4 x 4 for the others; 2 rows x 4 warps where that alone
    fills the GPU and the larger tile would split time. One stream: 1 row x 8 warps
    (H100, docs/notes.md, "One batch-major stream: ..."). Rows of 129-4096 steps
    (float32) take a whole row per program in one chunk where there are at least as
    many rows as SMs: always for the light scans (traces, sums), and for the others
    up to 512 steps or where the chunk tiles would leave fewer than 4 programs per SM
    (rl-triton's one-row design; measured faster there: docs/notes.md, "Whole-row tiles").
    Time-major data (streams
    contiguous): one thread per stream (SCALAR_N), each holding BLOCK_T steps, so
    a warp's loads are one coalesced row per step and the scan is sequential in
    registers -- unless there are fewer streams than a warp has threads: there,
    up to 32 streams x 128 steps over 8 warps (with ``Tuning.tm_few``, still a stream a
    lane, and the lanes left over along time, each with its own consecutive steps;
    ``sub=False``: not that tile, for the fused actions' kernel, which has no such form).
    When the tiles cannot fill the GPU (few streams), time is split into
    segments of whole chunks: two passes over the inputs, one over the outputs,
    and between them one small pass over the segments' maps.
    """
    tune = tune or current_tuning()
    tp = triton.next_power_of_2(max(T, 1))
    np2 = triton.next_power_of_2(max(N, 1))
    vec = max(1, 16 // elem_bytes)
    scalar_n = False
    stages = 1  # the chunk loop's software pipelining (tl.range num_stages); 1: none
    per_sm = tune.programs_per_sm
    if time_contiguous:
        num_warps = 8 if mode in (_table.MODE_GAE, _table.MODE_TDLAMBDA) else 4
        block_t = max(16, min(tp, 32 * vec))
        block_n = max(2, min(np2, 32 * vec * num_warps // block_t))
        light = mode in (_table.MODE_TRACE, _table.MODE_LINREC)  # two loads, one store
        sms = _sm_count(device)
        if (tune.row_tiles and elem_bytes <= 4 and 32 * vec < tp <= ROW_MAX_T and N >= sms
                and (light or tp <= 512 or triton.cdiv(N, block_n) < 4 * sms)):
            # a whole row per program, in one chunk: no carry between chunks and no time
            # split; 16 steps a thread for the light scans (8 for rows of up to 1024 steps
            # where under 4 programs per SM wait on one program's latency), 4-8 for the
            # others
            if light:
                ept = 16 if tp > 1024 or N >= 4 * sms else 8
            else:
                ept = 8 if tp > 1024 else 4
            block_n, block_t = 1, tp
            num_warps = max(1, min(16, tp // (32 * ept)))
        elif np2 == 1:
            # one stream: a one-row tile of 8 warps, VEC steps a thread (1024 float32
            # steps a chunk). Measured on the H100 (docs/notes.md, "One batch-major
            # stream: ..."): 1x1000000 GAE 24.9 -> 15.8 us, traces 30.2 -> 17.9, against
            # the two-row tile it replaces, whose second row was always masked
            block_n, num_warps = 1, 8
            block_t = max(16, min(tp, 32 * vec * num_warps))
        elif (_segments(N, T, block_n, block_t, device, tune, per_sm)[1] > 1
              and triton.cdiv(N, 2) >= 2 * _sm_count(device)):
            # enough streams to fill the GPU without splitting time if a program takes
            # two rows (two warps each): one pass instead of two (1024x4096: GAE 52 -> 34
            # us, V-trace 72 -> 56 us, docs/bench/*-s4-sweep3.md)
            block_n, block_t, num_warps = 2, max(16, min(tp, 64 * vec)), 4
    else:
        num_warps = 2 if N >= 32768 else 1  # the sweep's best (docs/bench/*-s3-tm-sweep.md)
        block_n = 32 * num_warps
        block_t = max(16, min(tp, tune.tm_steps))
        # thread per stream from one warp of streams: with the middle pass, also for
        # many time segments (256x16384 GAE 148 -> 68 us, docs/bench/*-s4-tm-sweep.md)
        scalar_n = N >= 32
        lanes = min(32 // np2, max(1, tp // block_t))  # (no more lanes than steps fill)
        if not scalar_n and sub and lanes > 1 and tune.tm_few is not False:
            # fewer streams than lanes: a stream per lane still, and the lanes left over
            # along time, each with its own tm_steps consecutive steps (sub_lanes).
            # Measured on the H100 (docs/notes.md, "Time-major: the L2 prefetch two chunks
            # ahead, a stream a lane for few streams, ..."): 2-8
            # streams where each time segment is one chunk (8x16384, 2x65536) 0.68-0.84x;
            # 16 streams (2 lanes), and segments of several chunks (8x131072, 4x262144:
            # the loop has no next-chunk loads in flight here), 2.0-2.7x slower
            few_n, few_t = 32 // lanes, lanes * block_t
            seg, S = _segments(N, T, few_n, few_t, device, tune, per_sm)
            if tune.tm_few or (lanes >= 4 and (S == 1 or seg == few_t)):
                scalar_n = True
                block_n, block_t = few_n, few_t
        if (N >= 32 and mode == _table.MODE_TRACE and tp <= 8 * block_t
                and tune.segment_len is None):
            # traces and episodic sums of up to 8 chunks: no time split (each program
            # walks its streams' few chunks with the next one's loads in flight), where
            # the look-back's fixed cost was more (H100: 4096x128 6.5 -> 4.8 us, 512x128
            # 5.3 -> 4.6; the other modes were 1.35-1.7x slower so). Not the few-stream
            # tile, whose loop has no next chunk's loads in flight
            per_sm = 0
        if not scalar_n:
            block_n = max(2, min(np2, 32))
            block_t = max(16, min(tp, 4096 // block_n))
            num_warps = 8 if block_n * block_t >= 4096 else 4
    if tune.tile is not None:
        block_n, block_t, num_warps = tune.tile[:3]
        scalar_n = len(tune.tile) > 3 and tune.tile[3]
        stages = tune.tile[4] if len(tune.tile) > 4 else 1
        per_sm = tune.tile[5] if len(tune.tile) > 5 else per_sm
    if tune.segment_len is not None:
        block_t = max(16, min(block_t, tune.segment_len))
        if scalar_n:  # (a step a lane at least where streams leave lanes along time)
            block_t = max(block_t, 32 * num_warps // block_n)
    seg, S = _segments(N, T, block_n, block_t, device, tune, per_sm)
    return block_n, block_t, seg, S, num_warps, scalar_n, stages


def sub_lanes(block_n: int, num_warps: int, scalar_n: bool) -> int:
    """The scan kernel's SUB: in a time-major tile of one stream a lane with fewer
    streams than lanes (``Tuning.tm_few``), the lanes along time, else 1."""
    return 32 * num_warps // block_n if scalar_n and block_n < 32 * num_warps else 1


def _prefetch(tune: Tuning, scalar_n: bool, S: int, num_warps: int, T: int,
              block_t: int) -> int:
    """The L2 prefetch distance in chunks (the kernel's PREFETCH): the tuning's, else 2
    for time-major programs of one warp that walk all of T in more than 8 chunks.
    Measured on the H100 (docs/notes.md, "Time-major: the L2 prefetch two chunks ahead,
    ..."): 16384x512
    0.70-0.79x; with time segments (1024x4096, 512x4096) 0.93-1.44x, so not there."""
    if tune.prefetch is not None:
        return tune.prefetch
    return 2 if scalar_n and S == 1 and num_warps == 1 and T > 8 * block_t else 0


def use_look_back(N: int, T: int, block_n: int, block_t: int, device,
                  tune: Tuning | None = None) -> bool:
    """Whether a segmented plan runs as one look-back launch (a chunk per program).

    Measured on the H200 (docs/bench/*-s4-lookback.md): up to ~8 programs per SM
    the look-back takes 0.65-1.04x the three launches' device time (4096x128 and
    512x128 time-major, 256x1024, 16x131072 time-major), and saves two launches;
    from ~2,000 programs its serial walk back over many segments makes it 2-3x
    slower (16x131072 batch-major, 1x1M, 1024x4096 and 256x16384 time-major).
    """
    tune = tune or current_tuning()
    if tune.look_back is not None:
        return tune.look_back
    programs = triton.cdiv(N, block_n) * triton.cdiv(T, block_t)
    # (and a program of one stream at most 512 segments, so one float32 stream keeps the
    # three launches from about the length where the two-row tile's 512-step chunks did
    # (1056 programs): 1x1000000, 977 one-row chunks, in three launches measured 0.64x
    # the plan before; docs/notes.md, "One batch-major stream: ...")
    return (programs <= tune.programs_per_sm * _sm_count(device)
            and (block_n > 1 or triton.cdiv(T, block_t) <= 512))


# --------------------------------------------------------------------------- launch


def _relevant(strides, sizes):
    """Strides with those of size-1 axes zeroed (never read: their index is 0)."""
    return tuple(s if n > 1 else 0 for s, n in zip(strides, sizes))


def _reach(strides: dict, sizes3, block_n: int, block_t: int) -> int:
    """A bound on every element offset the kernel forms (masked ones included: a tile's
    rows and a chunk's steps past the end, V_{t+1}, and the chunk after the last that
    PIPE builds): int32 offsets do where it is below 2**31."""
    n1, n2, t = sizes3
    pads = (n1 + block_n, n2 + block_n, t + 2 * block_t + 1)
    return max(sum(p * abs(s) for p, s in zip(pads, st)) for st in strides.values())


def launch(mode, layout, out0, out1, ins: dict, coefs: dict, reverse: bool, fp64: bool,
           tune: Tuning):
    """Launch the scan of ``mode`` into ``out0`` (and ``out1``).

    ``ins``: slot -> tensor (or None) of the data and no-time inputs, already known to
    broadcast; ``coefs``: slot -> (number or None, tensor or None).

    Returns what a cached launch needs to repeat this one without Triton's argument
    binding: ``(args, passed, ws_spec, [(compiled kernel, grid, constexprs)])``, where
    ``passed`` maps each slot to the tensor the kernel received (a copy where the
    layout needed one) or the number.
    """
    device = out0.device
    N, N2, T = layout.N, layout.N2, layout.T
    sizes3 = (layout.N1, N2, T)
    o = layout.view3(out0)
    args = [None] * (STR_POS + 1)
    args[0], args[1] = out0, out1
    strides = {"out": _relevant(o[1:], sizes3)}
    passed = {}
    for slot, t in ins.items():
        if t is None:
            continue
        if slot in _table.NOTIME_SLOTS:
            base, s1, s2 = layout.view3_notime(t)
            strides[slot] = _relevant((s1, s2), sizes3[:2])
        else:
            base, *st = layout.view3(t)
            strides[slot] = _relevant(st, sizes3)
        args[POINTER_POS[slot]] = base
        passed[slot] = base
    lo = [0.0] * 5
    for slot, (value, tensor) in coefs.items():
        if tensor is not None:
            base, *st = layout.view3(tensor)
            strides[slot] = _relevant(st, sizes3)
            args[POINTER_POS[slot]] = base
            passed[slot] = base
        elif value is not None:
            hi, lo[LO_INDEX[slot]] = split(value) if fp64 else (value, 0.0)
            args[SCALAR_POS[slot]] = hi
            passed[slot] = value
    args[LO_POS] = tuple(lo) if fp64 else None
    contiguous_notime = _relevant((N2, 1), sizes3[:2])
    uniform = all(strides[s] == strides["out"] for s in strides if s in _DATA) and all(
        strides[s] == contiguous_notime for s in _table.NOTIME_SLOTS if s in strides)
    if uniform:
        args[STR_POS] = strides["out"]
    else:
        flat = []
        for s in _table.STRIDE_SLOTS:
            flat += strides.get(s, (0, 0) if s in _table.NOTIME_SLOTS else (0, 0, 0))
        args[STR_POS] = tuple(flat)
    x_time = strides.get("x", (0, 0, 0))[2] if T > 1 else 1
    time_contiguous = (x_time if x_time != 0 else strides["out"][2]) == 1 or T == 1
    block_n, block_t, seg, S, num_warps, scalar_n, stages = plan(
        N, T, time_contiguous, device, mode, out0.element_size(), tune)
    sub = sub_lanes(block_n, num_warps, scalar_n)
    consts = dict(MODE=mode, REVERSE=reverse, UNIFORM=uniform, FP64=fp64, SCALAR_N=scalar_n,
                  BLOCK_N=block_n, BLOCK_T=block_t, BLOCK_S=2, STAGES=stages,
                  LOOK_W=tune.look_window, ONE=S == 1 and block_t >= T,
                  PREFETCH=_prefetch(tune, scalar_n, S, num_warps, T, block_t)
                  if device.type == "cuda" and not torch.version.hip and sub == 1
                  else 0,  # (inline PTX)
                  FLIP=False, EVEN=False, PIPE=False, SUB=sub, LOOK_CUT=False,
                  I64=tune.wide_index or _reach(strides, sizes3, block_n, block_t) >= 2**31)
    grid = (triton.cdiv(N, block_n), S)
    ws_spec = None
    wdt = torch.float64 if fp64 else torch.float32
    if S == 1:
        phases = (0,)
    elif use_look_back(N, T, block_n, block_t, device, tune):
        # one chunk per segment, one launch; the workspace starts zeroed (statuses, ticket)
        seg = block_t
        S = triton.cdiv(T, seg)
        grid = (triton.cdiv(N, block_n) * S, 1)
        phases = (4,)
        ws_spec = ((3 * S * N + triton.cdiv(N, block_n) * S + 1,), wdt, True)
        # blocks of segments before a program's own exist: skip the windows a cut discards
        # (the same bits; H100, 16x131072 time-major: 0.88-0.94x; where no blocks exist
        # (4096x128), compiling that code in measured up to 1.9x slower)
        consts["LOOK_CUT"] = S > tune.look_window
    else:
        phases = (1, 3, 2)
        ws_spec = ((2, S, N), wdt, False)
    if ws_spec is not None:
        alloc = torch.zeros if ws_spec[2] else torch.empty
        args[WS_POS] = alloc(ws_spec[0], device=device, dtype=wdt)
    args += [N, N2, T, seg, S, 1]
    launched = []
    for phase in phases:
        c = {**consts, "PHASE": phase}
        if phase in (0, 1, 2) and scalar_n and not c["ONE"] and sub == 1:
            # measured on the H100 (docs/notes.md, "The next chunk's loads first" and
            # "Time-major: lanes along time ..."): the next chunk's loads first,
            # TD(lambda) 0.53-0.83x, traces 0.92-1.0x; with the reverse scans' chunks
            # loaded latest step first (FLIP) on one warp a program, GAE 0.58-0.77x,
            # V-trace 0.75-0.90x, TD(lambda) 0.65-0.75x. On two warps (65536 streams and
            # more) both pay for V-trace only (0.80x; GAE 1.0-1.08x, TD(lambda) 1.10x)
            pipe = tune.pipe
            flip = num_warps == 1 or mode == _table.MODE_VTRACE
            if pipe is None:
                pipe = mode in (_table.MODE_TDLAMBDA, _table.MODE_TRACE) or (
                    flip and mode in (_table.MODE_GAE, _table.MODE_VTRACE))
            c["PIPE"] = pipe
            # (FLIP without PIPE was 3.3x slower: ptxas then sinks each step's loads to
            # its use in the scan's chain, where PIPE's carried loads cannot move)
            c["FLIP"] = reverse and pipe and flip and tune.flip
        elif phase in (0, 1, 2) and sub > 1 and not c["ONE"] and tune.pipe:
            # the few-stream tile (its steps already in scan order): the next chunk's
            # loads first only where forced (pipe=True; not yet measured on a GPU)
            c["PIPE"] = True
        if phase == 4:
            # measured on the H100 (docs/notes.md, "Time-major tiles without bounds"): the
            # look-back's one chunk per program 1.25-1.5x faster at 4096x128 time-major
            # with both; in the loops over chunks (PHASE 0-2) either was up to 1.5x slower;
            # batch-major tiles were not measured with them
            c["FLIP"] = reverse and scalar_n and tune.flip
            c["EVEN"] = scalar_n and tune.even and N % block_n == 0 and T % block_t == 0
        pgrid = grid
        if phase == 3:  # the middle pass: one program per stream block, BLOCK_S maps a step
            pgrid = (grid[0], 1)
            c["BLOCK_S"] = max(2, min(triton.next_power_of_2(S), tune.middle_elems // block_n))
        kernel = scan_kernel[pgrid](*args, **c, num_warps=num_warps)
        launched.append((kernel, pgrid, c))
    return args, passed, ws_spec, launched


# --------------------------------------------------------------------- cached launch


def record(raw, index, launched_call, like_idx, user_out, out_idx):
    """The record (:class:`_record.Recorded`) of a call that just ran through the full
    path (None: not repeatable).

    ``index``: slot -> position in ``raw`` of the user's argument that fed it. A tensor
    the kernel received that is not the user's (a copy) makes the call uncacheable.
    ``like_idx``: the position of the user's tensor the outputs were allocated like
    (None: of the layout's shape). ``user_out``: the outputs are the caller's out=
    tensors (``raw[out_idx]``, ``raw[out_idx + 1]``), which a repeat writes into again.
    """
    args, passed, ws_spec, launched = launched_call
    out0, out1 = args[0], args[1]
    tensors, numbers, pairs, checks = [], [], [], []
    allocs, placed, returns, in_ext, out_ext = [], [], [], [], []
    if user_out:
        for pos, t in ((0, out0), (1, out1)):
            user = raw[out_idx + pos]
            if (t is None) != (user is None) or (t is not None and (
                    type(user) is not torch.Tensor or t.data_ptr() != user.data_ptr())):
                return None
            if t is not None:
                tensors.append((pos, out_idx + pos))
                returns.append((False, out_idx + pos))
        for idx, t in enumerate(raw):
            if type(t) is torch.Tensor and t.numel():
                (out_ext if idx >= out_idx else in_ext).append((idx, extent(t)))
    else:
        for pos, t in ((0, out0), (1, out1)):
            if t is not None:
                placed.append((pos, len(allocs)))
                returns.append((True, len(allocs)))
                allocs.append(_record.Alloc(like_idx, tuple(out0.shape), out0.dtype,
                                            out0.device))
    if ws_spec is not None:
        placed.append((WS_POS, len(allocs)))
        allocs.append(_record.Alloc(None, ws_spec[0], ws_spec[1], out0.device, ws_spec[2]))
    fp64 = args[LO_POS] is not None
    for slot, given in passed.items():
        idx = index.get(slot)
        user = None if idx is None else raw[idx]
        if isinstance(given, torch.Tensor):
            if not isinstance(user, torch.Tensor) or given.data_ptr() != user.data_ptr():
                return None
            tensors.append((POINTER_POS[slot], idx))
        else:
            if user is None:  # an option the caller left out: the template's constant
                continue
            if isinstance(user, torch.Tensor):  # a one-element CPU tensor read as a number
                return None
            if fp64:
                pairs.append((SCALAR_POS[slot], LO_POS, LO_INDEX[slot], idx))
            else:
                numbers.append((SCALAR_POS[slot], idx))
            lo, hi = _table.COEF_RANGE[slot]
            checks.append((idx, lo, math.inf if hi is None else hi))
    return _record.Recorded(
        Replay(scan_kernel, launched, len(args), out0.device), args, tensors=tensors,
        numbers=numbers, pairs=pairs, checks=checks, allocs=allocs, placed=placed,
        returns=returns, in_extents=in_ext, out_extents=out_ext)
