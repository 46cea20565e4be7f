#!/usr/bin/env bash
# One device call: GPU tests, a kernel table (ours vs the floor only), the benchmark.
# Logs and tables go to $OUT.
# usage: bash scripts/gpu_session.sh [multigpu|fuzz|llm|verl|tests|backward|lookback|quick|bench|full|
#        hostcost|compare|interleave|rllib|peers|owed|all]
#        [bench args...]
# Pass RL_TRITON_COMMIT=<sha> from the development machine: the device's git may be stale.
# full: the benchmark at every shape, after warming the Triton and inductor caches
# with one process per shape (those runs' timings are thrown away)
set -u
# the adapters import as rl_triton_<framework> (integrations/<framework>/, mapped by
# pyproject.toml): a folder of links puts them on the path without an install
pkgs=/tmp/rl_triton_pkgs; mkdir -p $pkgs
for d in integrations/*/; do f=$(basename "$d"); ln -sfn "$PWD/$d" "$pkgs/rl_triton_$f"; done
export PYTHONPATH=$PWD:$pkgs${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export RL_TEST_TIME_LOG=${RL_TEST_TIME_LOG:-$OUT/test_times.txt}
what=${1:-all}; shift || true
# the scan's C extension (its replay repeats recorded calls; RL_TRITON_CORE_C_LAUNCH=1 for
# CUDA calls), built at -O1: 7 s, where setup.py's -O3 build of both extensions took 155 s
# of device time (the GPU runs do not time the CPU kernels). CBUILD=0 skips it.
if [[ ${CBUILD:-1} == 1 ]]; then
  inc=$(python -c "import sysconfig;print(sysconfig.get_paths()['include'])")
  suf=$(python -c "import sysconfig;print(sysconfig.get_config_var('EXT_SUFFIX'))")
  gcc -O1 -shared -fPIC -std=c99 -ffp-contract=off -fno-math-errno -fno-trapping-math \
    -I"$inc" -Irl_triton_core rl_triton_core/scan/_cscan.c -o "rl_triton_core/scan/_cscan$suf" \
    -lpthread -ldl \
    || echo "the C extension did not build: the Python paths run"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" | tee -a "$OUT/gpu.txt"
if [[ $what == multigpu ]]; then  # needs two GPUs (kind nvidia-h200-x2); NVLink multicast off
  NCCL_NVLS_ENABLE=0 timeout ${MULTI_TIMEOUT:-240} python -m pytest tests/multigpu -m multigpu -v \
    -p no:cacheprovider -W ignore > "$OUT/multigpu.log" 2>&1
  grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$OUT/multigpu.log" | tail -40
fi
# fuzz: the GPU fuzz (10,000 cases per estimator) and the determinism test. Processes
# sharing one GPU slow each other ~10x (14 xdist workers on one H200: ~190 s a chunk
# against ~18 s alone), and a chunk's cost is mostly compiles, which need no GPU: so
# scripts/fuzz_precompile.py first compiles every chunk's kernels from CPU tensors in a
# process per core (same seed), then a few workers run the fuzz itself (RL_TEST_GPUS
# spreads them over a multi-GPU host's GPUs)
if [[ $what == fuzz ]]; then
  gpus=$(nvidia-smi -L | wc -l)
  export RL_TEST_SEED=${RL_TEST_SEED:-$(( RANDOM * 32768 + RANDOM ))} OMP_NUM_THREADS=1
  echo "fuzz seed $RL_TEST_SEED" | tee "$OUT/fuzz_seed.txt"
  if [[ ${HUGE:-0} == 1 ]]; then  # the huge-tensor tests (one process, ~120 GB) beside the
    # precompile, which needs no GPU; the fuzz waits for them
    timeout ${HUGE_TIMEOUT:-150} python -m pytest tests/core/test_huge.py -m gpu -v -rf \
      -p no:cacheprovider -W ignore > "$OUT/huge.log" 2>&1 &
    huge=$!
  fi
  cached=$(ls "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" 2>/dev/null | wc -l)
  echo "Triton cache entries: $cached"
  if (( cached < ${PRECOMPILE_SKIP_AT:-3000} )); then
    timeout ${PRECOMPILE_TIMEOUT:-240} python scripts/fuzz_precompile.py > "$OUT/precompile.log" 2>&1
    tail -3 "$OUT/precompile.log"
  fi
  if [[ ${HUGE:-0} == 1 ]]; then wait $huge; echo "huge:"; tail -n 3 "$OUT/huge.log"; fi
  RL_TEST_FAIL_LOG=$OUT/fuzz_failures.txt RL_TEST_GPUS=$gpus timeout ${FUZZ_TIMEOUT:-300} \
    python -m pytest tests/core/test_fuzz.py tests/core/test_determinism.py -m gpu -rf -v \
    -n ${FUZZ_WORKERS:-$(( 4 * gpus ))} \
    -p no:cacheprovider -W ignore --durations=20 > "$OUT/fuzz.log" 2>&1
  grep -E "FAILED|passed|failed|error" "$OUT/fuzz.log" | tail -25
  head -c 3000 "$OUT/fuzz_failures.txt" 2>/dev/null
  if [[ -n ${FUZZ_THEN:-} ]]; then  # more GPU tests after the fuzz, e.g. a few files
    RL_TEST_FAIL_LOG=$OUT/then_failures.txt timeout ${THEN_TIMEOUT:-60} python -m pytest \
      $FUZZ_THEN -m gpu -q -rf -n ${THEN_WORKERS:-3} -p no:cacheprovider -W ignore \
      > "$OUT/then.log" 2>&1
    grep -E "^FAILED|passed|failed|error" "$OUT/then.log" | tail -10
  fi
fi
# llm: the OpenRLHF / TRL adapters' GPU tests (verl's skip: see verl below), the token
# and group GPU tests and the token benchmark; needs the
# cp312 wheels in .llmwhl/ carried (carry=[".llmwhl"]: verl, openrlhf and trl without their
# pins, transformers 5.10.4, numpy 2.2.6, omegaconf, codetiming and their wheels, antlr4
# as a built wheel; 46 MB)
if [[ $what == llm ]]; then
  # python -m pip: the device's bare pip installs for another interpreter (the tests then
  # skip with "needs verl"); numpy too, which the device's Python lacks and transformers needs
  python -m pip install -q --no-index --find-links .llmwhl --no-deps verl==0.9.1 \
    openrlhf==0.11.2 trl==1.12.0 > "$OUT/llm_install.log" 2>&1
  python -m pip install -q --no-index --find-links .llmwhl numpy==2.2.6 transformers==5.10.4 \
    omegaconf==2.4.0 codetiming==1.4.0 >> "$OUT/llm_install.log" 2>&1 || tail -5 "$OUT/llm_install.log"
  python -c "import verl.trainer.ppo.core_algos, openrlhf, trl" || echo "the frameworks did not import"
  timeout ${LLM_TIMEOUT:-240} python -m pytest tests/integrations/verl tests/integrations/openrlhf \
    tests/integrations/trl tests/core/test_tokens.py tests/core/test_groups.py -m gpu -q -n 8 \
    -p no:cacheprovider -W ignore > "$OUT/llm_tests.log" 2>&1
  grep -E "^FAILED|passed|failed|error" "$OUT/llm_tests.log" | tail -15
  timeout ${TOKEN_TIMEOUT:-200} python -m rl_triton_core.bench.tokens --json "$OUT/tokens.json" \
    > "$OUT/tokens.md" 2> "$OUT/tokens.log"
  cat "$OUT/tokens.md"
fi
# verl: verl's GPU tests; verl's core_algos imports ray and tensordict, which do not fit
# beside .llmwhl in one call: carry=[".verlwhl"] (54 MB of cp312 wheels, ray stripped by
# scripts/strip_ray_wheel.py, whose docstring lists them)
if [[ $what == verl ]]; then
  python -m pip install -q --no-index --find-links .verlwhl --no-deps .verlwhl/*.whl \
    > "$OUT/verl_install.log" 2>&1 || tail -5 "$OUT/verl_install.log"
  python -c "import verl.trainer.ppo.core_algos" || echo "verl did not import"
  timeout ${VERL_TIMEOUT:-120} python -m pytest tests/integrations/verl -m gpu -q -rfs -n 4 \
    -p no:cacheprovider -W ignore > "$OUT/verl_tests.log" 2>&1
  grep -E "^FAILED|^SKIPPED|passed|failed|error" "$OUT/verl_tests.log" | tail -10
fi
# owed: one call of the measurements a change to the group and token launch paths owes the
# GPU, most important first, each step bounded by what is left of OWED_BUDGET seconds
# (default 540, inside one 600 s call): the group and token GPU tests, group_advantages'
# device time and full call (scripts/group_time.py), every estimator's host cost
# (host_cost.py --quick), the 512x128 batch-major tiles (the light scans' tile against
# rl-triton's one row a program) and the time-major tiles narrow in streams. The whole GPU
# suite is a call of its own: TEST_FILES=tests TEST_TIMEOUT=400 ... tests
if [[ $what == owed ]]; then
  t0=$SECONDS budget=${OWED_BUDGET:-540}
  left() { local l=$(( budget - (SECONDS - t0) )); (( l > $1 )) && echo "$1" || echo $(( l > 5 ? l : 5 )); }
  timeout $(left 150) python -m pytest tests/core/test_groups.py tests/core/test_token_replay.py \
    tests/core/test_tokens.py tests/core/test_c_launch.py -m "gpu and not slow" -q -rf -n 8 \
    -p no:cacheprovider -W ignore > "$OUT/owed_tests.log" 2>&1
  grep -E "^FAILED|passed|failed|error" "$OUT/owed_tests.log" | tail -12
  timeout $(left 60) python scripts/group_time.py 2>&1 | tee "$OUT/group_time.md"
  timeout $(left 120) python scripts/host_cost.py --quick --out "$OUT/host_cost.json" \
    > "$OUT/host_cost.md" 2>&1; tail -40 "$OUT/host_cost.md"
  timeout $(left 80) python scripts/tm_sweep.py 512x128b \
    eligibility_traces,episodic_cumsum,discounted_returns,lambda_returns,vtrace \
    t1x128w1,t1x128w2,t2x128w1,t2x128w2,t4x128w2,t8x128w4,t8x128w8 2>&1 | tee "$OUT/sweep_512x128b.txt"
  timeout $(left 150) python scripts/tm_sweep.py 4096x128,512x128,16384x512 \
    gae,vtrace,eligibility_traces default,t2x128w1,t4x128w1,t4x128w2,t8x128w2,t8x128w4,t16x128w4,t8x256w4 \
    2>&1 | tee "$OUT/sweep_tm_narrow.txt"
  timeout $(left 100) python scripts/tm_sweep.py 512x4096,1024x4096 gae,eligibility_traces \
    default,t4x128w1,t8x128w4,t8x256w4 2>&1 | tee -a "$OUT/sweep_tm_narrow.txt"
fi
# tests: the core GPU tests (TEST_FILES picks files); each failure's report is written
# to gpu_failures.txt as it happens, so a run stopped by its time limit still names them
if [[ $what == tests || $what == all ]]; then
  gpus=$(nvidia-smi -L | wc -l); workers=$(( $(nproc) - 2 ))
  OMP_NUM_THREADS=1 RL_TEST_GPUS=$gpus RL_TEST_FAIL_LOG=$OUT/gpu_failures.txt \
    timeout ${TEST_TIMEOUT:-540} python -m pytest ${TEST_FILES:-tests/core} \
    -m "gpu and not slow" -q -rf --durations=30 -n $workers -p no:cacheprovider -W ignore > "$OUT/gpu_tests.log" 2>&1
  grep -E "^FAILED|passed|failed|error" "$OUT/gpu_tests.log" | tail -25
  head -c 4000 "$OUT/gpu_failures.txt" 2>/dev/null
fi
if [[ $what == backward || $what == all ]]; then
  timeout ${BACKWARD_TIMEOUT:-150} python scripts/backward_bench.py --out "$OUT/backward.md" > "$OUT/backward.log" 2>&1
  tail -30 "$OUT/backward.md"
fi
if [[ $what == lookback ]]; then  # the core GPU tests with the look-back forced on
  RL_TRITON_CORE_LOOKBACK=1 timeout ${TEST_TIMEOUT:-240} python -m pytest tests/core -m gpu -q -n 8 \
    -p no:cacheprovider -W ignore > "$OUT/lookback_tests.log" 2>&1
  grep -E "^FAILED|passed|failed|error" "$OUT/lookback_tests.log" | tail -10
fi
# hostcost / compare: this tree against an older one in .old/ (its rl_triton_core/ copied
# there, .old ignored and carried): the cached call's host cost, and the benchmark's rows of
# ours (device time, back to back, full call) with compare_bench.py's ratios
if [[ $what == hostcost ]]; then
  for side in old new; do
    path=$PWD commit=${RL_TRITON_COMMIT:-new}
    [[ $side == old ]] && path=$PWD/.old commit=${RL_TRITON_COMMIT_OLD:-old}
    RL_TRITON_COMMIT=$commit PYTHONPATH=$path timeout ${HOST_TIMEOUT:-150} \
      python scripts/host_cost.py --out "$OUT/host_cost_$side.json" ${HOST_ARGS:-} \
      > "$OUT/host_cost_$side.md" 2>&1
    echo "== $side"; tail -22 "$OUT/host_cost_$side.md"
  done
fi
if [[ $what == compare ]]; then
  for side in old new; do
    path=$PWD commit=${RL_TRITON_COMMIT:-new}
    [[ $side == old ]] && path=$PWD/.old commit=${RL_TRITON_COMMIT_OLD:-old}
    PYTHONPATH=$path timeout ${CMP_TIMEOUT:-260} python -m rl_triton_core.bench --no-peers \
      --commit "$commit" \
      --out "/tmp/cmp_$side" --no-progress --target-ms ${CMP_TARGET_MS:-5} \
      --deadline-s $(( ${CMP_TIMEOUT:-260} - 30 )) ${CMP_ARGS:-} > "$OUT/bench_$side.log" 2>&1
    cp /tmp/cmp_$side/benchmarks.json "$OUT/bench_$side.json"
  done
  python scripts/compare_bench.py "$OUT/bench_old.json" "$OUT/bench_new.json" \
    --out "$OUT/compare.md" | tail -12
fi
# interleave: ROUNDS rounds of (old, new) alternating, each a benchmark of IL_SHAPES x
# IL_ESTIMATORS (ours and the floor) and a host_cost.py run; everything in $OUT/interleave.tgz
if [[ $what == interleave ]]; then
  res=/tmp/interleave; mkdir -p $res
  for i in $(seq ${ROUNDS:-3}); do
    for side in old new; do
      path=$PWD commit=${RL_TRITON_COMMIT:-new}
      [[ $side == old ]] && path=$PWD/.old commit=${RL_TRITON_COMMIT_OLD:-old}
      PYTHONPATH=$path timeout ${IL_TIMEOUT:-90} python -m rl_triton_core.bench --no-peers \
        --commit "$commit" --shapes ${IL_SHAPES:-65536x1024} --trunc none --no-progress \
        --estimators ${IL_ESTIMATORS:-gae,vtrace,retrace,episodic_cumsum} \
        --target-ms ${IL_TARGET_MS:-10} --out /tmp/il_${side}_$i > /dev/null 2>&1
      cp /tmp/il_${side}_$i/benchmarks.json $res/bench_${side}_$i.json
      RL_TRITON_COMMIT=$commit PYTHONPATH=$path timeout ${HOST_TIMEOUT:-90} python \
        scripts/host_cost.py --out $res/host_${side}_$i.json ${HOST_ARGS:-} > $res/host_${side}_$i.md 2>&1
    done
  done
  tar czf "$OUT/interleave.tgz" -C $res .
  for i in $(seq ${ROUNDS:-3}); do
    python scripts/compare_bench.py $res/bench_old_$i.json $res/bench_new_$i.json | tail -2
  done
fi
# rllib: RLlib on the GPU (PPO and APPO with a GPU learner, the connector's time); needs the
# Ray wheels in .whl/ (bash scripts/rllib_gpu.sh prepare, here) carried: carry=[".whl"]
if [[ $what == rllib ]]; then
  timeout ${RLLIB_TIMEOUT:-450} bash scripts/rllib_gpu.sh all 2>&1 | tail -30
fi
if [[ $what == quick || $what == all ]]; then
  timeout ${QUICK_TIMEOUT:-200} python -m rl_triton_core.bench --no-peers --out "$OUT/kernels" \
    --estimators gae,lambda_returns,vtrace,retrace,episodic_cumsum ${QUICK_ARGS:-} \
    > "$OUT/kernels.log" 2>&1
  tail -5 "$OUT/kernels.log"
fi
if [[ $what == full ]]; then
  shapes=${FULL_SHAPES:-4096x128,512x128,32768x32,16384x16,256x1024,16384x512,1024x4096,65536x1024,16x131072,1x1000000}
  t0=$SECONDS
  for s in ${shapes//,/ }; do
    timeout ${WARM_TIMEOUT:-150} python -m rl_triton_core.bench --shapes "$s" --no-progress \
      --peers compiled_scan --target-ms 0.05 --compile-budget-s 100 --out "/tmp/warm/$s" \
      > "/tmp/warm_$s.log" 2>&1 &
  done
  wait
  echo "warm-up: $((SECONDS - t0)) s"
  timeout ${BENCH_TIMEOUT:-420} python -m rl_triton_core.bench --shapes "$shapes" --out "$OUT" \
    --deadline-s $(( ${BENCH_TIMEOUT:-420} - 40 )) "$@" > "$OUT/bench.log" 2>&1
  tail -8 "$OUT/bench.log"
  (cd "$OUT" && tar czf plots.tgz *.png && rm -f *.png)
fi
# peers: ours against rl-triton 0.1.3 and PufferLib, batch-major, truncation flags, A = 6,
# the median of PEER_ROUNDS interleaved rounds (default 3); needs a checkout of rl-triton's
# v0.1.3 in .peers/rl-triton (git archive of the tag), carried: carry=[".peers"]. One call
# holds about half the shapes at 3 rounds: PEER_SHAPES picks them (default: all)
if [[ $what == peers ]]; then
  shapes=${PEER_SHAPES:-4096x128,512x128,32768x32,16384x16,256x1024,16384x512,1024x4096,65536x1024,16x131072,1x1000000}
  timeout ${BENCH_TIMEOUT:-540} python -m rl_triton_core.bench --rl-triton-src .peers/rl-triton \
    --peers rl_triton,pufferlib --layouts batch --trunc flags --actions 6 \
    --rounds ${PEER_ROUNDS:-3} --shapes "$shapes" --deadline-s $(( ${BENCH_TIMEOUT:-540} - 60 )) \
    --no-progress --out "$OUT/peers" "$@" > "$OUT/peers.log" 2>&1
  tail -5 "$OUT/peers.log"
  rm -f "$OUT"/peers/*.png
fi
if [[ $what == bench || $what == all ]]; then
  timeout ${BENCH_TIMEOUT:-330} python -m rl_triton_core.bench --out "$OUT" "$@" > "$OUT/bench.log" 2>&1
  tail -5 "$OUT/bench.log"
fi
