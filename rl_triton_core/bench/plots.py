"""The report, made from the benchmark's JSON only: a markdown table and PNG plots.

    python -m rl_triton_core.bench.plots bench_out/benchmarks.json [--out DIR]

remakes ``benchmarks.md`` and the plots (``time_<estimator>.png``, ``ratio_to_floor.png``,
``peers_gae.png``) next to the JSON, or in ``--out``, on any machine (matplotlib, Agg).
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

__all__ = ["write_report", "markdown", "write_plots", "load"]

FLOOR_BIG_US = 10.0  # the targets: <= 1.15x the floor where it takes >= 10 us, else 2x
TARGET_BIG, TARGET_SMALL = 1.15, 2.0


def load(path) -> dict:
    with open(path) as f:
        return json.load(f)


def _index(records):
    idx = {}
    for r in records:
        idx[(r["estimator"], r["shape"], r["layout"], r["trunc"], r["impl"])] = r
    return idx


def _cases(records, estimator):
    """(shape, layout, trunc) of an estimator's rows, in the order they were run."""
    seen = []
    for r in records:
        if r["estimator"] == estimator and r["impl"] == "ours":
            key = (r["shape"], r["layout"], r["trunc"])
            if key not in seen:
                seen.append(key)
    return seen


def _estimators(records):
    out = []
    for r in records:
        if r["estimator"] not in out:
            out.append(r["estimator"])
    return out


def _us(x):
    if x is None:
        return None
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.1f}"


def _ratio(a, b):
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _fmt_ratio(r):
    return None if r is None else f"{r:.2f}x"


def _cell(rec, key, fmt=_us):
    """A value, or why there is none: "n/a", "WRONG" (failed the reference check), "-"."""
    if rec is None:
        return "-"
    if rec.get("ok") is False and (rec.get("note") or "").startswith("WRONG"):
        return "WRONG"
    v = rec.get(key)
    if v is None:
        return "n/a" if rec.get("note") else "-"
    return fmt(v)


def _device_or_none(rec):
    return None if rec is None or not rec.get("ok") else rec.get("device_us")


def _full_or_none(rec):
    return None if rec is None or not rec.get("ok") else rec.get("full_us")


def _b2b_or_none(rec):
    return None if rec is None or not rec.get("ok") else rec.get("b2b_us")


def summary(records, estimator) -> list:
    """The speed targets (FLOOR_BIG_US) for one estimator, as lines of text."""
    idx = _index(records)
    big, small, n_big_ok, n_small_ok, wrong = [], [], 0, 0, 0
    for shape, layout, trunc in _cases(records, estimator):
        ours = idx.get((estimator, shape, layout, trunc, "ours"))
        floor = idx.get((estimator, shape, layout, trunc, "floor"))
        if ours and ours.get("ok") is False:
            wrong += 1
        r = _ratio(_device_or_none(ours), _device_or_none(floor))
        if r is None:
            continue
        if floor["device_us"] >= FLOOR_BIG_US:
            big.append((r, shape, layout, trunc))
            n_big_ok += r <= TARGET_BIG
        else:
            small.append((r, shape, layout, trunc))
            n_small_ok += r <= TARGET_SMALL
    lines = []
    if big:
        w = max(big)
        lines.append(f"device time vs floor, floor >= {FLOOR_BIG_US:g} us: worst {w[0]:.2f}x "
                     f"({w[1]} {w[2]} trunc={w[3]}); {n_big_ok}/{len(big)} rows within "
                     f"{TARGET_BIG}x")
    if small:
        w = max(small)
        lines.append(f"device time vs floor, floor < {FLOOR_BIG_US:g} us: worst {w[0]:.2f}x "
                     f"({w[1]} {w[2]} trunc={w[3]}); {n_small_ok}/{len(small)} rows within "
                     f"{TARGET_SMALL}x")
    for layout in ("batch", "time"):
        for trunc in ("none", "flags", "-"):
            ours = idx.get((estimator, "4096x128", layout, trunc, "ours"))
            floor = idx.get((estimator, "4096x128", layout, trunc, "floor"))
            r = _ratio(_full_or_none(ours), _full_or_none(floor))
            if r is not None:
                lines.append(f"full call at 4096x128 {layout} trunc={trunc}: "
                             f"{ours['full_us']:.1f} us vs floor {floor['full_us']:.1f} us "
                             f"({r:.2f}x; target <= 1x)")
    tm_ratios = []
    for shape, layout, trunc in _cases(records, estimator):
        if layout != "time":
            continue
        tm = _device_or_none(idx.get((estimator, shape, "time", trunc, "ours")))
        bm = _device_or_none(idx.get((estimator, shape, "batch", trunc, "ours")))
        r = _ratio(tm, bm)
        if r is not None:
            tm_ratios.append((r, shape, trunc))
    if tm_ratios:
        w = max(tm_ratios)
        lines.append(f"time-major / batch-major device time: worst {w[0]:.2f}x ({w[1]} "
                     f"trunc={w[2]})")
    if wrong:
        lines.append(f"**{wrong} row(s) failed the reference check (WRONG)**")
    return lines


COLUMNS = ("shape", "layout", "trunc", "ours us", "floor us", "x floor", "ours full us",
           "floor full us", "GB/s", "compiled us", "compiled / ours", "TorchRL us",
           "TorchRL / ours", "TorchRL vec us", "vec / ours", "loop us", "rl-triton us",
           "rl-triton / ours", "PufferLib b2b us", "PufferLib / ours", "max err")


def table(records, estimator) -> list:
    idx = _index(records)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for shape, layout, trunc in _cases(records, estimator):
        ours, floor, comp, trl, vec, loop, rlt, puff = (
            idx.get((estimator, shape, layout, trunc, impl))
            for impl in ("ours", "floor", "compiled_scan", "torchrl", "torchrl_vec", "loop",
                         "rl_triton", "pufferlib"))
        od = _device_or_none(ours)
        of = _full_or_none(ours)
        row = [shape, layout, trunc,
               _cell(ours, "device_us"), _cell(floor, "device_us"),
               _fmt_ratio(_ratio(od, _device_or_none(floor))) or "-",
               _cell(ours, "full_us"), _cell(floor, "full_us"),
               _cell(ours, "gbps", lambda x: f"{x:,.0f}"),
               _cell(comp, "device_us"),
               _fmt_ratio(_ratio(_device_or_none(comp), od)) or "-",
               _cell(trl, "full_us"),
               _fmt_ratio(_ratio(_full_or_none(trl), of)) or "-",
               _cell(vec, "full_us"),
               _fmt_ratio(_ratio(_full_or_none(vec), of)) or "-",
               _cell(loop, "full_us"),
               _cell(rlt, "device_us"),
               _fmt_ratio(_ratio(_device_or_none(rlt), od)) or "-",
               _cell(puff, "b2b_us"),
               _fmt_ratio(_ratio(_b2b_or_none(puff), _b2b_or_none(ours))) or "-",
               _cell(ours, "max_err", lambda x: f"{x:.1e}")]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def notes(records, estimator) -> list:
    """Why a cell is "n/a" or "WRONG": one line per (impl, reason) with the cases."""
    groups = defaultdict(list)
    for r in records:
        if r["estimator"] == estimator and r.get("note"):
            groups[(r["impl"], r["note"])].append(f"{r['shape']} {r['layout']} {r['trunc']}")
    lines = []
    for (impl, note), where in groups.items():
        shown = ", ".join(where[:6]) + (f", ... ({len(where)} rows)" if len(where) > 6 else "")
        lines.append(f"- {impl}: {note} [{shown}]")
    return lines


def markdown(result: dict) -> str:
    h = result["header"]
    records = result["records"]
    out = ["# Benchmarks", ""]
    out.append(f"{h.get('gpu')} (driver {h.get('driver')}, CUDA {h.get('cuda')}), "
               f"torch {h.get('torch')}, triton {h.get('triton')}, python {h.get('python')}, "
               f"TorchRL {h.get('torchrl') or 'absent'}; commit `{h.get('commit')}`; "
               f"{h.get('date')}.")
    ext = [h[k] for k in ("rl_triton", "pufferlib") if h.get(k)]
    if ext:
        out.append("Peers from the rl-triton checkout: " + "; ".join(ext) + ".")
    if h.get("incomplete"):
        out.append(f"**Incomplete run: {h['incomplete']}.**")
    if h.get("wall_s"):
        out.append(f"Run time {h['wall_s'].get('total')} s (per part: "
                   + ", ".join(f"{k} {v}" for k, v in h["wall_s"].items() if k != "total")
                   + ").")
    out += ["", "Method:", ""] + [f"- {m}" for m in h.get("method", [])]
    out += ["", "Columns: `ours us` / `floor us` are device times (CUDA-graph replay); "
            "`x floor` = ours / floor device time (targets: <= 1.15x where the floor takes "
            ">= 10 us, <= 2x elsewhere); `full us` = one Python call after a sync; "
            "`GB/s` = bytes moved / ours device time; `compiled / ours` = compiled-scan "
            "device time / ours; `TorchRL / ours`, `vec / ours` = full-call time / ours "
            "full-call time (their Python loops are host-bound, TorchRL's vectorised GAE "
            "syncs with the host); `loop us` = full call of a CleanRL-style loop; "
            "`rl-triton / ours` = rl-triton 0.1.3's device time / ours; `PufferLib / ours` = "
            "back-to-back time / ours (its kernel is not graph-captured); WRONG = "
            "failed the reference check (not timed); n/a = not run (see the notes).", ""]
    for est in _estimators(records):
        out += [f"## {est}", ""]
        out += [f"- {s}" for s in summary(records, est)]
        out += [""] + table(records, est) + [""]
        n = notes(records, est)
        if n:
            out += ["Notes:", ""] + n + [""]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- plots


def _shape_order(records, estimator):
    shapes = []
    for r in records:
        if r["estimator"] == estimator and r["shape"] not in shapes:
            shapes.append(r["shape"])
    return sorted(shapes, key=lambda s: (math.prod(int(x) for x in s.split("x")), s))


def _prefer_trunc(idx, estimator, shape, layout, impl):
    for trunc in ("flags", "-", "none"):
        r = idx.get((estimator, shape, layout, trunc, impl))
        if r is not None:
            return r
    return None


def write_plots(result: dict, out_dir) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = result["records"]
    h = result["header"]
    idx = _index(records)
    subtitle = f"{h.get('gpu')}, commit {str(h.get('commit'))[:12]}"
    files = []
    styles = {"batch": "-", "time": "--"}
    colors = {"ours": "C0", "floor": "C1", "compiled_scan": "C2", "torchrl": "C3",
              "torchrl_vec": "C4", "loop": "C5", "rl_triton": "C6", "pufferlib": "C7"}

    for est in _estimators(records):
        shapes = _shape_order(records, est)
        fig, ax = plt.subplots(figsize=(9, 4.8))
        for impl in ("ours", "floor", "compiled_scan"):
            for layout in ("batch", "time"):
                ys = [_device_or_none(_prefer_trunc(idx, est, s, layout, impl)) for s in shapes]
                if all(y is None for y in ys):
                    continue
                ax.plot(range(len(shapes)), [math.nan if y is None else y for y in ys],
                        styles[layout], marker="o", color=colors[impl], label=f"{impl} {layout}")
        ax.set_yscale("log")
        ax.set_xticks(range(len(shapes)), shapes, rotation=30, ha="right")
        ax.set_ylabel("device time per call (us)")
        ax.set_title(f"{est}: device time vs shape (N x T; with truncation flags where "
                     f"applicable)\n{subtitle}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"time_{est}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    any_ratio = False
    for ax, layout in zip(axes, ("batch", "time"), strict=True):
        for i, est in enumerate(_estimators(records)):
            shapes = _shape_order(records, est)
            ys = []
            for s in shapes:
                rs = [_ratio(_device_or_none(idx.get((est, s, layout, t, "ours"))),
                             _device_or_none(idx.get((est, s, layout, t, "floor"))))
                      for t in ("none", "flags", "-")]
                rs = [r for r in rs if r is not None]
                ys.append(max(rs) if rs else math.nan)
            if all(math.isnan(y) for y in ys):
                continue
            any_ratio = True
            ax.plot(range(len(shapes)), ys, marker="o", color=f"C{i}", label=est)
            ax.set_xticks(range(len(shapes)), shapes, rotation=30, ha="right")
        ax.axhline(TARGET_BIG, color="k", lw=0.8, ls="--")
        ax.axhline(TARGET_SMALL, color="gray", lw=0.8, ls=":")
        ax.set_title(f"{layout}-major", fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("ours / floor device time (worst over truncation cases)")
    if any_ratio:
        axes[0].legend(fontsize=7)
    fig.suptitle(f"ratio to the floor kernel (dashed 1.15x, dotted 2x)\n{subtitle}", fontsize=9)
    fig.tight_layout()
    path = out_dir / "ratio_to_floor.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    files.append(path)

    if "gae" in _estimators(records):
        shapes = _shape_order(records, "gae")
        fig, ax = plt.subplots(figsize=(9, 4.8))
        drawn = False
        for impl, key in (("compiled_scan", "device_us"), ("torchrl", "full_us"),
                          ("torchrl_vec", "full_us"), ("loop", "full_us"),
                          ("rl_triton", "device_us"), ("pufferlib", "b2b_us")):
            for layout in ("batch", "time"):
                ys = []
                for s in shapes:
                    ours = _prefer_trunc(idx, "gae", s, layout, "ours")
                    peer = _prefer_trunc(idx, "gae", s, layout, impl)
                    o = None if ours is None or not ours.get("ok") else ours.get(key)
                    p = None
                    if peer is not None and peer.get("ok"):
                        p = peer.get(key)
                    r = _ratio(p, o)
                    ys.append(math.nan if r is None else r)
                if all(math.isnan(y) for y in ys):
                    continue
                drawn = True
                what = {"device_us": "device", "b2b_us": "back to back"}.get(key, "full call")
                ax.plot(range(len(shapes)), ys, styles[layout], marker="o", color=colors[impl],
                        label=f"{impl} {layout} ({what})")
        ax.set_yscale("log")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(shapes)), shapes, rotation=30, ha="right")
        ax.set_ylabel("peer time / ours (higher: ours faster)")
        ax.set_title(f"GAE: speed-up over the peers (with truncation flags)\n{subtitle}",
                     fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / "peers_gae.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


def write_report(result: dict, out_dir) -> list:
    """benchmarks.md and the PNGs in ``out_dir``; returns the paths written. Without
    matplotlib the plots are skipped with a message (remake them from the JSON)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / "benchmarks.md"
    md.write_text(markdown(result))
    files = [md]
    try:
        files += write_plots(result, out_dir)
    except ImportError as e:
        print(f"[bench] no plots ({e}); remake them with "
              f"`python -m rl_triton_core.bench.plots {out_dir / 'benchmarks.json'}`")
    return files


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="benchmarks.json written by python -m rl_triton_core.bench")
    ap.add_argument("--out", default=None, help="output folder (default: the JSON's folder)")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else Path(args.json).parent
    for f in write_report(load(args.json), out):
        print(f)


if __name__ == "__main__":
    main()
