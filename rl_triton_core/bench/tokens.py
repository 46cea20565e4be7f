"""Benchmark of the token-level estimators (LLM post-training) against the floor
kernel and verl's loop.

    python -m rl_triton_core.bench.tokens [--shapes 256x4096,1024x8192] [--device cuda]

Rows: masked GAE with whitening (verl's ``compute_gae_advantage_return``: skip
semantics, ``masked_whiten`` with its 1e-8 count epsilon), for fp32 and bf16 values
(fp32 rewards, verl's int64 response mask with multi-turn observation spans).

* ``ours``: ``rl_triton_core.masked_gae(..., whiten=True, count_eps=1e-8)``.
* ``floor``: the elementwise floor kernel moving the same bytes as ours: one pass
  reading rewards, values and mask and writing advantages and returns, plus one pass
  reading and writing the advantages (whitening needs statistics of every advantage
  before any is written). ``floor1`` is the first pass alone (every byte once).
* ``verl``: verl 0.9.1's loop over tokens and its ``masked_whiten``, transcribed
  (``tests/integrations/verl`` checks the transcription against verl's own function),
  on the same device.

Full call (host + device), back to back, and CUDA-graph replay (device time), as the
main benchmark times them (``harness.Timer``). Prints a markdown table; ``--json``
writes the rows.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import torch

SHAPES = ((256, 4096), (1024, 8192), (4096, 16384))


def verl_gae(token_level_rewards, values, response_mask, gamma, lam):
    """verl 0.9.1's compute_gae_advantage_return with masked_whiten, transcribed."""
    with torch.no_grad():
        nextvalues = 0
        lastgaelam = 0
        advantages_reversed = []
        gen_len = token_level_rewards.shape[-1]
        for t in reversed(range(gen_len)):
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam_ = delta + gamma * lam * lastgaelam
            nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
            lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values
        advantages = verl_masked_whiten(advantages, response_mask)
    return advantages, returns


def _masked_mean(values, mask):
    return (torch.where(mask.bool(), values, 0.0) * mask).sum() / (mask.sum() + 1e-8)


def verl_masked_whiten(values, mask):
    """verl_F.masked_whiten (unbiased, shift_mean) with its host-side checks."""
    mean = _masked_mean(values, mask)
    var = _masked_mean((values - mean) ** 2, mask)
    mask_sum = mask.sum()
    if mask_sum == 0 or mask_sum == 1:  # verl raises here: a host sync
        raise ValueError("mask sum must be > 1")
    var = var * (mask_sum / (mask_sum - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def inputs(B, T, vdtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    r = torch.randn(B, T, generator=g)
    v = torch.randn(B, T, generator=g)
    lens = torch.randint(T // 4, T + 1, (B,), generator=g)
    t = torch.arange(T)
    m = (t[None, :] < lens[:, None]) & ~(torch.rand(B, T, generator=g) < 0.05)  # observations
    return r.to(device), v.to(vdtype).to(device), m.to(torch.int64).to(device)


def main(argv=None):
    from rl_triton_core import masked_gae
    from rl_triton_core.bench import harness
    from rl_triton_core.bench import peers as P

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(f"{b}x{t}" for b, t in SHAPES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--no-verl", action="store_true", help="skip verl's loop (slow on CPU)")
    ap.add_argument("--target-ms", type=float, default=200.0)
    ap.add_argument("--json", default=None)
    opts = ap.parse_args(argv)
    device = torch.device(opts.device)
    timer = harness.Timer(device, opts.target_ms)
    cuda = device.type == "cuda"
    rows = []
    for shape in opts.shapes.split(","):
        B, T = (int(s) for s in shape.lower().split("x"))
        for dname in opts.dtypes.split(","):
            vdtype = getattr(torch, dname)
            r, v, m = inputs(B, T, vdtype, device)
            odt = torch.promote_types(r.dtype, v.dtype)

            def ours(r=r, v=v, m=m):
                return masked_gae(r, v, m, gamma=1.0, lmbda=0.95, whiten=True, count_eps=1e-8,
                                  time_dim=-1)

            want = verl_gae(r.double(), v.double(), m, 1.0, 0.95)
            got = ours()
            err = max(float((g.double() - w).abs().max()) for g, w in zip(got, want))
            impls = [("ours", ours, err)]
            if cuda:
                f1 = P.make_floor([r, v, m], [], [], 2, (B, T), odt)
                adv = torch.empty(B, T, dtype=odt, device=device)
                f2 = P.make_floor([adv], [], [], 1, (B, T), odt)
                def floor(f1=f1, f2=f2):
                    f2()
                    return f1()
                impls += [("floor", floor, None),
                          ("floor1", f1, None)]
            if not opts.no_verl:
                impls.append(("verl", lambda r=r, v=v, m=m: verl_gae(r, v, m, 1.0, 0.95), None))
            nbytes = sum(t.numel() * t.element_size() for t in (r, v, m)) + 2 * B * T * \
                torch.empty((), dtype=odt).element_size()
            for name, fn, e in impls:
                res = timer.measure(fn, graph=cuda and name != "verl")
                rows.append({"estimator": "masked_gae+whiten", "impl": name, "shape": f"{B}x{T}",
                             "values": dname, "max_err": e, "bytes": nbytes, **res})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            del r, v, m
            if cuda:
                torch.cuda.empty_cache()
    _table(rows, device)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"device": _device_name(device), "torch": torch.__version__,
                       "python": platform.python_version(), "rows": rows}, f, indent=1)


def _device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()


def _table(rows, device):
    print(f"device: {_device_name(device)}, torch {torch.__version__}")
    print("| shape | values | impl | full µs | b2b µs | device µs | / floor (device) | "
          "verl / ours (full) |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    by = {}
    for r in rows:
        by.setdefault((r["shape"], r["values"]), {})[r["impl"]] = r
    for (shape, vd), d in by.items():
        fl = d.get("floor", {}).get("device_us")
        ve = d.get("verl", {}).get("full_us")
        ours_full = d["ours"]["full_us"]
        for name, r in d.items():
            dev = r.get("device_us")
            ratio = f"{dev / fl:.2f}" if dev and fl else ""
            vr = f"{ve / ours_full:.0f}x" if name == "ours" and ve else ""
            print(f"| {shape} | {vd} | {name} | {r['full_us']:.1f} | {r['b2b_us']:.1f} | "
                  f"{'' if dev is None else f'{dev:.1f}'} | {ratio} | {vr} |")


if __name__ == "__main__":
    main()
