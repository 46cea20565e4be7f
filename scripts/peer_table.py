"""The benchmark's peer tables in markdown, from one or more of its JSON files.

    python scripts/peer_table.py peers-a.json peers-b.json [...]

Prints, for the estimators and shapes in the files (shapes in the order given by
``--shapes``, default the benchmark's eleven peer shapes):

- against rl-triton: the peer's time over ours, **full call / back to back / device**
  (above 1 we are faster); ``gae`` is compared with rl-triton's ``gae`` row (which the
  benchmark already times with the ``advantages + values`` a user of it adds);
- against PufferLib: full call / back to back (it is not graph-captured);
- our GAE's own times, for scale;
- the slowest cells: every ratio below ``--flag`` (default 1 / 1.03: ours more than 3%
  slower).
"""

import argparse
import json

SHAPES = ("4096x128,512x128,32768x32,16384x16,256x1024,16384x512,1024x4096,512x4096,"
          "65536x1024,16x131072,1x1000000")
ESTIMATORS = ("gae", "gae_advantages", "lambda_returns", "discounted_returns", "vtrace",
              "retrace_from_actions", "eligibility_traces", "episodic_cumsum")
COLS = ("full_us", "b2b_us", "device_us")


def load(paths):
    recs, headers = {}, []
    for p in paths:
        d = json.load(open(p))
        headers.append(d["header"])
        for r in d["records"]:
            if r.get("ok", True) and r.get("full_us") is not None:
                recs[(r["estimator"], r["impl"], r["shape"])] = r
    return recs, headers


def ratios(recs, est, peer, shape, cols):
    ours, them = recs.get((est, "ours", shape)), recs.get((est, peer, shape))
    if ours is None or them is None:
        return None
    out = []
    for c in cols:
        a, b = ours.get(c), them.get(c)
        out.append(None if not a or not b else b / a)
    return out


def table(recs, shapes, peer, cols, ests, flag, slow):
    lines = ["| estimator | " + " | ".join(shapes) + " |",
             "|---|" + "---:|" * len(shapes)]
    for e in ests:
        cells = []
        for s in shapes:
            r = ratios(recs, e, peer, s, cols)
            if r is None:
                cells.append("no peer")
                continue
            cells.append(" / ".join("n/a" if x is None else f"{x:.2f}" for x in r))
            for c, x in zip(cols, r):
                if x is not None and x < flag:
                    slow.append(f"{peer} {e} {s} {c}: {x:.2f}")
        if any(c != "no peer" for c in cells):
            lines.append(f"| `{e}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--flag", type=float, default=1 / 1.03)
    args = ap.parse_args()
    recs, headers = load(args.files)
    shapes = [s for s in args.shapes.split(",") if any(k[2] == s for k in recs)]
    h = headers[0]
    commits = ", ".join(sorted({x["commit"] for x in headers}))
    print(f"{h['gpu']} (driver {h['driver']}, CUDA {h['cuda']}), torch {h['torch']}, "
          f"triton {h['triton']}, Python {h['python']}; rl_triton_core "
          f"{h['rl_triton_core']} at commit(s) {commits}; "
          f"{h['rl_triton']}; {h['pufferlib']}; "
          f"dates {', '.join(x['date'][:16] for x in headers)}\n")
    slow = []
    print(table(recs, shapes, "rl_triton", COLS, ESTIMATORS, args.flag, slow) + "\n")
    print(table(recs, shapes, "pufferlib", COLS[:2], ("gae", "gae_advantages"), args.flag,
                slow) + "\n")
    lines = ["| | " + " | ".join(shapes) + " |", "|---|" + "---:|" * len(shapes)]
    for c, name in zip(COLS, ("full call", "back to back", "device")):
        vals = [recs.get(("gae", "ours", s), {}).get(c) for s in shapes]
        lines.append(f"| ours, {name} µs | " + " | ".join(
            "n/a" if v is None else f"{v:.1f}" for v in vals) + " |")
    print("\n".join(lines) + "\n")
    print(f"cells below {args.flag:.4f}:", "; ".join(slow) if slow else "none")


if __name__ == "__main__":
    main()
