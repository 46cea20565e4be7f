"""Where a GPU fuzz chunk spends its time: one chunk of one estimator under cProfile,
run twice in one process (the first pays the compiles, the second hits the caches).

    python scripts/fuzz_profile.py [estimator] [cases]
"""

import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "core"))
os.environ.setdefault("RL_TRITON_CORE_BACKEND", "triton")

import fuzz_lib  # noqa: E402

name = sys.argv[1] if len(sys.argv) > 1 else "gae"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 150
for attempt in ("cold", "warm"):
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    fuzz_lib.run_chunk(name, 1, n, 3, "cuda")
    prof.disable()
    print(f"{name} {n} cases {attempt}: {time.perf_counter() - t0:.1f} s", flush=True)
    st = pstats.Stats(prof)
    st.sort_stats("cumulative").print_stats(30)
    st.sort_stats("tottime").print_stats(15)
