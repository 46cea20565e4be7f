"""Compare two benchmark runs (``benchmarks.json`` of ``python -m rl_triton_core.bench``),
row by row: ours' device time, back-to-back and full-call time, new over old.

    python scripts/compare_bench.py OLD.json NEW.json [--out table.md]

A ratio above 1 is a slowdown. The summary line counts rows beyond a noise band
(default 5%) either way, by device time.
"""

from __future__ import annotations

import argparse
import json
import statistics


def _rows(path):
    d = json.load(open(path))
    out = {}
    for r in d["records"]:
        if r.get("impl") != "ours" or r.get("device_us") is None:
            continue
        out[(r["estimator"], r["shape"], r["layout"], r["trunc"])] = r
    return d["header"], out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--out", default="")
    p.add_argument("--noise", type=float, default=0.05)
    a = p.parse_args()
    h_old, old = _rows(a.old)
    h_new, new = _rows(a.new)
    lines = [f"old: {h_old.get('commit', '?')[:10]}  new: {h_new.get('commit', '?')[:10]}  "
             f"({h_new.get('gpu')}, torch {h_new.get('torch')}, triton {h_new.get('triton')}, "
             f"{h_new.get('date')})", "",
             "| estimator | shape | layout | trunc | device us old | new | new/old "
             "| b2b us old | new | full us old | new | ok |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios, slower, faster = [], [], []
    for k in sorted(set(old) & set(new)):
        o, n = old[k], new[k]
        r = n["device_us"] / o["device_us"] if o["device_us"] else float("nan")
        ratios.append(r)
        if r > 1 + a.noise:
            slower.append(k)
        elif r < 1 - a.noise:
            faster.append(k)
        lines.append(f"| {' | '.join(k)} | {o['device_us']:.2f} | {n['device_us']:.2f} | "
                     f"{r:.2f} | {o['b2b_us']:.1f} | {n['b2b_us']:.1f} | {o['full_us']:.1f} | "
                     f"{n['full_us']:.1f} | {n.get('ok')} |")
    summary = (f"{len(ratios)} rows; device time new/old: median {statistics.median(ratios):.3f}, "
               f"min {min(ratios):.2f}, max {max(ratios):.2f}; beyond +-{a.noise:.0%}: "
               f"{len(slower)} slower, {len(faster)} faster") if ratios else "no common rows"
    lines += ["", summary]
    if slower:
        lines.append("slower: " + ", ".join("/".join(k) for k in slower))
    text = "\n".join(lines)
    if a.out:
        open(a.out, "w").write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
