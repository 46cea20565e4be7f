"""Smoke tests of the benchmark (``python -m rl_triton_core.bench``) at tiny shapes.

On CPU: the harness logic (inputs, reference check, timing with perf_counter, records),
the floor kernel in the Triton interpreter, the peers' math, and the JSON -> markdown
-> PNG pipeline on fake data. The CUDA timing parts run only with a GPU (marked gpu).
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from rl_triton_core.bench import harness as H
from rl_triton_core.bench import peers as P
from rl_triton_core.bench import plots
from rl_triton_core.scan import _cpu_c

HAS_CUDA = torch.cuda.is_available()
INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cuda" if HAS_CUDA else "cpu"

needs_triton = pytest.mark.skipif(
    not HAS_CUDA and not INTERP, reason="the floor kernel needs CUDA or TRITON_INTERPRET=1")


@needs_triton
@pytest.mark.parametrize("n_out", [1, 2])
def test_floor_kernel_reads_every_input_once(n_out):
    g = torch.Generator().manual_seed(0)
    N, T, A = 3, 11, 5
    narrow = [torch.randn(N, T, generator=g), torch.rand(N, T, generator=g) < 0.5,
              torch.randint(0, A, (N, T), generator=g)]
    wide = [torch.randn(N, T, A, generator=g)]
    stream = [torch.randn(N, generator=g), torch.randn(N, A, generator=g)]
    narrow, wide, stream = ([t.to(DEVICE) for t in ts] for ts in (narrow, wide, stream))
    fn = P.make_floor(narrow, wide, stream, n_out, (N, T), torch.float32)
    outs = fn()
    outs = outs if isinstance(outs, tuple) else (outs,)
    expected = narrow[0] + narrow[1].float() + narrow[2].float() + wide[0].sum(-1)
    flat = expected.view(-1)
    flat[:N] += stream[0]
    flat[: N * A] += stream[1].view(-1)
    assert len(outs) == n_out
    for o in outs:
        assert o.shape == (N, T) and o.dtype == torch.float32
        torch.testing.assert_close(o, expected)


def test_floor_refuses_what_it_cannot_mirror():
    x = torch.zeros(4, 3)
    with pytest.raises(P.Skip):
        P.make_floor([x] * 7, [], [], 1, (4, 3), torch.float32)
    with pytest.raises(P.Skip):
        P.make_floor([x.t()], [], [], 1, (3, 4), torch.float32)  # not contiguous


@pytest.mark.parametrize("time_major", [False, True])
def test_peer_math_matches_the_reference(time_major):
    from rl_triton_core import reference as R

    g = torch.Generator().manual_seed(1)
    N, T = 4, 37
    r, v = torch.randn(N, T, generator=g), torch.randn(N, T, generator=g)
    term = torch.rand(N, T, generator=g) < 0.1
    trunc = torch.rand(N, T, generator=g) < 0.1
    boot = torch.randn(N, generator=g)
    adv_ref, tgt_ref = R.gae(r, v, term, trunc, bootstrap_value=boot, time_dim=-1)
    ret_ref = R.lambda_returns(r, v, term, trunc, bootstrap_value=boot, time_dim=-1)
    tm = (lambda x: x.t().contiguous()) if time_major else (lambda x: x)
    back = (lambda x: x.t()) if time_major else (lambda x: x)
    td = 0 if time_major else 1
    args = (tm(r), tm(v), tm(term), tm(trunc), boot, None, 0.99, 0.95)
    for adv, tgt in (P.loop_gae(*args, td), P.scan_gae(*args, time_major)):
        torch.testing.assert_close(back(adv).double(), adv_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(back(tgt).double(), tgt_ref, atol=1e-5, rtol=1e-5)
    ret = P.loop_lambda_returns(*args, td)
    torch.testing.assert_close(back(ret).double(), ret_ref, atol=1e-5, rtol=1e-5)


def test_bytes_and_inputs_per_estimator():
    spec = H.SPECS["gae"]
    assert spec.inputs("flags", "shifted") == (
        ["rewards", "values", "terminated", "truncated"], [], ["bootstrap"])
    assert spec.inputs("none", "explicit") == (
        ["rewards", "values", "terminated", "next_values"], [], [])
    assert H.SPECS["linear_recurrence"].truncs == ("-",)
    rfa = H.SPECS["retrace_from_actions"]
    assert rfa.inputs("none", "shifted")[1] == ["q_actions", "target_probs"]
    assert rfa.skip_reason(65536, 1024, 8) and not rfa.skip_reason(4096, 128, 8)
    assert set(H.available_estimators()) >= {"gae", "lambda_returns", "discounted_returns",
                                               "eligibility_traces", "episodic_cumsum",
                                               "linear_recurrence"}


def _smoke_options(**kw):
    opts = dict(estimators=["gae", "linear_recurrence"], shapes=[(3, 9)], truncs=["flags"],
                peers=["loop", "compiled_scan"], floor=HAS_CUDA or INTERP, device="cpu",
                target_ms=0.3, compile_backend="none", progress=False, commit="test")
    opts.update(kw)
    return H.Options(**opts)


def test_harness_cpu_smoke_run_and_report(tmp_path, monkeypatch):
    if INTERP:  # the kernels in the interpreter: no numba compile, so this stays quick
        monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    result = H.run(_smoke_options())
    recs = result["records"]
    assert result["header"]["commit"] == "test"
    cases = {(r["estimator"], r["layout"], r["trunc"]) for r in recs}
    assert cases == {("gae", "batch", "flags"), ("gae", "time", "flags"),
                     ("linear_recurrence", "batch", "-"), ("linear_recurrence", "time", "-")}
    by = {(r["estimator"], r["layout"], r["impl"]): r for r in recs}
    for (est, layout, impl), r in by.items():
        assert r["ok"] is True, (est, layout, impl, r["note"])
        assert r["full_us"] > 0 and r["b2b_us"] > 0
        assert r["device_us"] is None  # no CUDA graphs on the CPU
        if impl != "floor":
            assert r["max_err"] <= r["tol"]
    impls = {r["impl"] for r in recs if r["estimator"] == "gae"}
    assert {"ours", "loop", "compiled_scan"} <= impls
    assert "loop" not in {r["impl"] for r in recs if r["estimator"] == "linear_recurrence"}
    # bytes: rewards, values (4 B), terminated, truncated (1 B) per element, bootstrap [N],
    # two float32 outputs
    assert by[("gae", "batch", "ours")]["bytes"] == 3 * 9 * (4 + 4 + 1 + 1 + 2 * 4) + 3 * 4
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(result))
    plots.main([str(path)])
    md = (tmp_path / "benchmarks.md").read_text()
    assert "## gae" in md and "## linear_recurrence" in md
    for name in ("time_gae.png", "ratio_to_floor.png", "peers_gae.png"):
        assert (tmp_path / name).stat().st_size > 1000


def test_wrong_output_is_marked_and_not_timed(monkeypatch):
    import rl_triton_core

    if INTERP:
        monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    spec = H.SPECS["linear_recurrence"]
    def wrong(m, d):  # 1 % off, for the library only (the reference uses the same Spec)
        out = spec.call(m, d)
        return out * 1.01 if m is rl_triton_core else out

    bad = H.Spec("linear_recurrence", wrong, spec.data, spec.flags, 1)
    monkeypatch.setitem(H.SPECS, "linear_recurrence", bad)
    result = H.run(_smoke_options(estimators=["linear_recurrence"], peers=[], floor=False,
                                  layouts=["batch"]))
    (rec,) = result["records"]
    assert rec["ok"] is False and rec["note"].startswith("WRONG")
    assert rec["full_us"] is None and rec["max_err"] > rec["tol"]


def test_deadline_and_partial_file(tmp_path, monkeypatch):
    if INTERP:
        monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    partial = tmp_path / "partial.json"
    opts = _smoke_options(estimators=["linear_recurrence"], shapes=[(2, 5), (1, 7)], peers=[],
                          floor=False, layouts=["batch"], partial_path=str(partial))
    result = H.run(opts)
    assert [r["shape"] for r in result["records"]] == ["2x5", "1x7"]
    assert [r["shape"] for r in json.loads(partial.read_text())["records"]] == ["2x5"]
    result = H.run(_smoke_options(deadline_s=1e-9))
    assert result["records"] == [] and "deadline" in result["header"]["incomplete"]


def test_rounds_are_interleaved_and_merged(monkeypatch):
    """--rounds 3: each impl's rows are measured in turn (ours, loop, ours, loop, ...)
    and merged into one row whose times are the medians of the rounds'."""
    if INTERP:
        monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    order = []
    real = H.bench_impl

    def spy(timer, base, impl, make, refs, *, check=True):
        order.append(impl)
        return real(timer, base, impl, make, refs, check=check)

    monkeypatch.setattr(H, "bench_impl", spy)
    result = H.run(_smoke_options(estimators=["gae"], layouts=["batch"], peers=["loop"],
                                  floor=False, rounds=3))
    assert order == ["ours", "loop"] * 3
    assert result["header"]["rounds"] == 3
    assert any("rounds" in m for m in result["header"]["method"])
    assert [r["impl"] for r in result["records"]] == ["ours", "loop"]
    for r in result["records"]:
        assert r["ok"] is True, r["note"]
        for key in ("full_us", "b2b_us"):
            vals = r[f"{key}_rounds"]
            assert len(vals) == 3 and r[key] == sorted(vals)[1]


def test_merge_rounds_keeps_a_failed_round():
    ok = dict.fromkeys(H.FIELDS)
    ok.update(impl="ours", ok=True, full_us=3.0, b2b_us=2.0, device_us=None, bytes=8)
    bad = dict(ok, ok=False, full_us=None, b2b_us=None, note="n/a: boom")
    rec = H.merge_rounds([ok, bad, dict(ok, full_us=5.0, b2b_us=4.0)])
    assert rec["ok"] is False and rec["note"] == "n/a: boom"  # one failed round fails it
    assert rec["full_us"] == 4.0 and rec["full_us_rounds"] == [3.0, None, 5.0]
    assert rec["device_us"] is None and rec["device_us_rounds"] == [None, None, None]


def test_torchrl_peers_match_the_reference(monkeypatch):
    pytest.importorskip("torchrl")
    if INTERP:
        monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    result = H.run(_smoke_options(estimators=["gae", "lambda_returns"],
                                  peers=["torchrl", "torchrl_vec"], floor=False))
    peers = [r for r in result["records"] if r["impl"].startswith("torchrl")]
    assert len(peers) == 8
    for r in peers:
        assert r["ok"] is True, (r["estimator"], r["impl"], r["layout"], r["note"])


def _fake_result():
    recs = []
    for shape, n, t in (("4096x128", 4096, 128), ("512x128", 512, 128)):
        for layout in ("batch", "time"):
            for trunc in ("none", "flags"):
                base = dict(estimator="gae", shape=shape, N=n, T=t, layout=layout, trunc=trunc,
                            bytes=n * t * 18, extra_mem_mb=1.0, out_mb=1.0, tol=1e-3, note=None)
                scale = n * t / 5e5
                recs.append(dict(base, impl="ours", ok=True, device_us=12 * scale,
                                 full_us=20.0, b2b_us=13 * scale, gbps=700.0, max_err=1e-6))
                recs.append(dict(base, impl="floor", ok=True, device_us=11 * scale,
                                 full_us=18.0, b2b_us=12 * scale, gbps=800.0, max_err=None))
                recs.append(dict(base, impl="compiled_scan", ok=True, device_us=60 * scale,
                                 full_us=90.0, b2b_us=61 * scale, max_err=1e-6))
                recs.append(dict(base, impl="torchrl", ok=None, device_us=None, full_us=None,
                                 b2b_us=None, max_err=None, note="n/a: torchrl does not import"))
                recs.append(dict(base, impl="loop", ok=False, device_us=None, full_us=None,
                                 b2b_us=None, max_err=0.5,
                                 note="WRONG: max abs error 0.5 > tolerance 0.001"))
    recs.append(dict(recs[0], estimator="vtrace", ok=False, device_us=None, full_us=None,
                     note="WRONG: max abs error 1 > tolerance 0.001"))
    header = dict(gpu="NVIDIA H200", driver="570", cuda="12.8", torch="2.11", triton="3.6",
                  python="3.12", torchrl=None, commit="abc", date="2026-01-01",
                  method=["fake"], wall_s={"ours": 1.0, "total": 2.0})
    return {"header": header, "records": recs}


def test_report_from_fake_json(tmp_path):
    result = _fake_result()
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(result))
    files = plots.write_report(plots.load(path), tmp_path / "report")
    md = (tmp_path / "report" / "benchmarks.md").read_text()
    assert "NVIDIA H200" in md and "commit `abc`" in md
    row = next(line for line in md.splitlines() if line.startswith("| 4096x128 | batch | none"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    cols = dict(zip(plots.COLUMNS, cells, strict=True))
    assert cols["x floor"] == f"{12 / 11:.2f}x"
    assert cols["compiled / ours"] == "5.00x"
    assert cols["TorchRL us"] == "n/a" and cols["loop us"] == "WRONG"
    assert "torchrl: n/a: torchrl does not import" in md
    assert "1 row(s) failed the reference check" in md  # vtrace
    assert any("within 1.15x" in line for line in md.splitlines())
    assert {f.name for f in files} >= {"benchmarks.md", "time_gae.png", "ratio_to_floor.png",
                                       "peers_gae.png"}


def test_cli_options():
    from rl_triton_core.bench import __main__ as cli

    args = cli.parse(["--quick", "--estimators", "gae", "--layouts", "tm", "--no-peers"])
    opts = cli.options(args, smoke=False)
    assert opts.shapes == list(H.QUICK_SHAPES) and opts.layouts == ["time"]
    assert opts.peers == [] and opts.compile_backend == "inductor"
    assert opts.rounds == 1
    assert cli.options(cli.parse(["--rounds", "3"]), smoke=True).rounds == 3
    opts = cli.options(cli.parse(["--shapes", "1x1e6,16x131072"]), smoke=True)
    assert opts.shapes == [(1, 1_000_000), (16, 131072)] and opts.device == "cpu"
    with pytest.raises(SystemExit):
        cli.options(cli.parse(["--estimators", "nope"]), smoke=True)


@pytest.mark.gpu
def test_cuda_timer_measures_device_time():
    x = torch.randn(1 << 20, device="cuda")
    res = H.Timer("cuda", target_ms=5).measure(lambda: x * 2, graph=True)
    assert 0 < res["device_us"] <= res["b2b_us"] * 1.5
    assert res["full_us"] > 0 and math.isclose(res["out_mb"], 4.0)
    assert res["extra_mem_mb"] >= 4.0


# --- the CPU table (rl_triton_core.bench.cpu_peers) ---------------------------------------


@pytest.mark.parametrize("flags", ["bool", "float", "one bool"])
def test_cpu_floor_reads_every_input_and_reuses_its_outputs(flags):
    from rl_triton_core.bench import cpu_peers as C

    g = torch.Generator().manual_seed(0)
    n = 2 * C._BLOCK + 37  # more than one block in each half of the two-thread variant
    shape = (n, 1)
    nums = [torch.randn(shape, generator=g) for _ in range(3 if flags != "float" else 2)]
    if flags == "float":
        fl = [(torch.rand(shape, generator=g) < 0.3).float() for _ in range(2)]
        want = nums[0] + nums[1] + fl[0] + fl[1]
    elif flags == "bool":
        fl = [torch.rand(shape, generator=g) < 0.3 for _ in range(2)]
        want = nums[0] + nums[1] + nums[2] + (fl[0] ^ fl[1]).float()
    else:
        fl = [torch.rand(shape, generator=g) < 0.3]
        want = nums[0] + nums[1] + nums[2] + fl[0].float()
    ins = nums + fl
    threads = torch.get_num_threads()
    variants = C.floor_variants(ins, nums[0])
    c = ({"C 1t", "C 2t", "C fused 1t", "C fused 2t"} if _cpu_c.available()
         else set())  # the C passes, where built
    assert set(variants) == {"numpy 1t", "numpy 2t", "torch 1t", "torch 2t"} | c
    seen = set()
    for name, fn in variants.items():
        o0, o1 = fn()
        assert torch.get_num_threads() == threads, name  # restored
        assert o0.shape == shape and o0.dtype == o1.dtype == torch.float32
        torch.testing.assert_close(o0, want, msg=name)
        torch.testing.assert_close(o1, want / 2, msg=name)
        assert fn()[0] is o0 and fn()[1] is o1  # the same two, every call of a variant
        ptrs = {o0.data_ptr(), o1.data_ptr()}
        assert not ptrs & seen, name  # ... and outputs of its own
        seen |= ptrs
    # each input counts, in both halves and past a block boundary
    for k, x in enumerate(ins):
        for i in (5, C._BLOCK + 1, n // 2 + 3, n - 1):
            before = [fn()[0][i].item() for fn in variants.values()]
            x[i] = ~x[i] if x.dtype == torch.bool else x[i] + 8
            after = [fn()[0][i].item() for fn in variants.values()]
            assert all(a != b for a, b in zip(after, before)), (k, i)


def test_cpu_fresh_row_parser_and_child():
    from rl_triton_core.bench import cpu_peers as C

    out = ("some warning\n" + C.FRESH_TAG
           + json.dumps(dict(case="tm128x4", import_ms=800.0, ms=[30.0] + [5.0] * 11,
                             equal=True, numba=False)) + "\nmore\n")
    row = C.parse_fresh(out)
    assert row["max_ms"] == 30.0 and row["sum_ms"] == 85.0 and row["ok"] and row["equal"]
    assert not C.parse_fresh(out.replace("30.0", "51.0"))["ok"]  # one call over 50 ms
    assert not C.parse_fresh(out.replace("5.0", "6.5"))["ok"]  # 101.5 ms in all
    with pytest.raises(ValueError, match="FRESH-ROW"):
        C.parse_fresh("Traceback ...\n")
    lines = C.fresh_table([dict(row, cache="warm")])
    assert lines[-1].startswith("| [128, 4] time-major, bool flags | warm | no | 800 |")
    assert lines[-1].endswith("| 30.00 | 85.00 | yes | yes |")
    # the child's own code, run here (not fresh: its measurement and its output line)
    ns = {"__name__": "not_main"}
    exec(C._CHILD, ns)
    row = C.parse_fresh(ns["run"]("tm128x4", 3, 1.0))
    assert row["case"] == "tm128x4" and len(row["ms"]) == 3 and row["equal"] is True
    assert isinstance(row["numba"], bool)
    assert C._child_env()["PATH"] and "TRITON_INTERPRET" not in C._child_env()


def test_cpu_peer_table_columns():
    from rl_triton_core.bench import cpu_peers as C

    row = dict(peer="P", shape="[2]", peer_ms=100.0, ours_ms=2.0, floor_ms=1.0,
               floor_variant="numpy 2t", max_err=1e-6)
    lines = C.peer_table([[row, dict(peer="Q", skip="not importable (x)")],
                          [dict(row, ours_ms=4.0, floor_variant="torch 1t"),
                           dict(peer="Q", skip="not importable (x)")]],
                         extra=[dict(row, peer="verl", floor_variant=None)])
    assert lines[0] == C.PEER_HEADER
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[3] == "3.000 (2.000-4.000)" and cells[4] == "38 (25-50)x"
    assert cells[5] == "1.000 (1.000-1.000) (numpy 2t, torch 1t)"
    assert cells[6] == "3.00 (2.00-4.00)x" and cells[7] == "100 (100-100)x"
    assert "n/a: not importable" in lines[3]
    assert lines[4].startswith("| verl | [2] | 100.00 | 2.000 | 50x | 1.000 (-) | 2.00x")
    assert any(line.startswith("Machine: ") and "cores" in line for line in C.machine_lines())


def test_cli_cpu_table_options():
    from rl_triton_core.bench import __main__ as cli

    args = cli.parse(["--cpu-reps", "5", "--no-cpu-table"])
    assert args.cpu_reps == 5 and args.no_cpu_table and args.cpu_rounds == 1


def test_cli_cpu_table_prints_and_writes(tmp_path, monkeypatch, capsys):
    from rl_triton_core.bench import __main__ as cli
    from rl_triton_core.bench import cpu_peers as C

    seen = {}

    def fake(**kw):
        seen.update(kw)
        return ["Machine: test", "| peer | ... |"]

    monkeypatch.setattr(C, "cpu_report", fake)
    cli.cpu_table(cli.parse(["--cpu-reps", "3", "--cpu-cold"]), tmp_path)
    assert seen == dict(reps=3, rounds=1, fresh=True, cold=True)
    assert "Machine: test" in capsys.readouterr().out
    assert (tmp_path / "cpu_table.md").read_text() == "Machine: test\n| peer | ... |\n"


@pytest.mark.gpu
def test_one_process_over_several_shapes_runs_clean(tmp_path):
    """retrace_from_actions at 32768x32, then at 256x1024, in one benchmark process: on
    the H200 (2026-12-05) this faulted with an illegal memory access at the second shape,
    with the trees before and after the structure work alike, while each shape alone ran
    clean (so did 16384x16 or 4096x128 before 256x1024)."""
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "rl_triton_core.bench", "--no-peers", "--estimators",
         "retrace_from_actions", "--shapes", "32768x32,256x1024", "--target-ms", "1",
         "--no-progress", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "illegal memory access" not in res.stderr, \
        res.stderr[-3000:]
