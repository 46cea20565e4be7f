#!/usr/bin/env bash
# RLlib 2.60 on the GPU machine (which has torch but no Ray), in one device call:
#   (a)+(b) tests/integrations/rllib -m "not slow": the CPU suite plus the GPU tests
#           (test_gpu.py: PPO and APPO with a GPU learner, GAE / V-trace on cuda:0);
#   (c)     scripts/rllib_connector_bench.py: the GAE piece's time per call, stock and
#           rl_triton, at 4,000 and 100,000 env steps, on cuda and cpu.
# Logs and the table go to $OUT (default /tmp/out). Every part is under `timeout`; the
# bounds add up to 7.5 minutes (60 s install, 240 s tests, 150 s bench; expected well under).
#
# usage, on the development machine, once (downloads the wheels into .whl/, ignored):
#   bash scripts/rllib_gpu.sh prepare
# on the device machine (carry .whl):
#   bash scripts/rllib_gpu.sh [all|tests|gpu|bench]        # default all
#   (tests: (a)+(b) in one pytest run; gpu: (b) alone; bench: (c) alone)
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
what=${1:-all}

# ------------------------------------------------------------------ prepare (here)
# Ray 2.60 for CPython 3.12 on x86-64 and what `import ray.rllib` needs that the device
# image lacks (KINDS.md's list). Ray's wheel is trimmed of ray/jars/ (Java workers) and
# ray/dashboard/client/ (the dashboard's web page), RECORD lines included: 75.6 -> 42.5 MiB (all wheels 48.4 MiB),
# so that everything carried stays under the 64 MiB limit.
WHEELS="ray==2.60.0 gymnasium==1.2.2 farama-notifications==0.0.6 dm-tree==0.1.10
lz4==4.4.5 ormsgpack==1.13.1 jsonschema==4.26.0 referencing==0.37.0 rpds-py==2026.9.1
jsonschema-specifications==2025.9.1 pydantic==2.14.4 pydantic-core==2.50.5
annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
tensorboardX==2.6.5"
if [[ $what == prepare ]]; then
  git check-ignore -q .whl/x.whl || echo /.whl/ >> .git/info/exclude
  mkdir -p .whl
  for spec in $WHEELS; do
    stem=$(echo "${spec/==/-}" | tr 'A-Z-' 'a-z_')  # the wheel file's name-version stem
    ls .whl | tr 'A-Z-' 'a-z_' | grep -q "^${stem}_" && continue  # there (trimmed: ray)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$spec" || exit 1
  done
  python3 - <<'EOF' || exit 1
import glob, os, zipfile

DROP = ("ray/jars/", "ray/dashboard/client/")
(path,) = glob.glob(".whl/ray-2.60.0-cp312-*.whl")
with zipfile.ZipFile(path) as src:
    if not any(n.startswith(DROP) for n in src.namelist()):
        print(f"{path}: already trimmed")
        raise SystemExit
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename.startswith(DROP):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(l for l in lines if not l.startswith(DROP)).encode()
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
os.replace(tmp, path)
print(f"{path}: trimmed to {os.path.getsize(path) / 2**20:.1f} MiB")
EOF
  ls .whl; du -ch .whl/*.whl | tail -1
  exit 0
fi

# ------------------------------------------------------------------ the device run
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 RAY_DISABLE_DOCKER_CPU_WARNING=1
ls .whl/*.whl > /dev/null 2>&1 || { echo "no .whl/*.whl: run 'bash scripts/rllib_gpu.sh prepare' here and carry .whl"; exit 1; }
t0=$SECONDS
timeout ${INSTALL_TIMEOUT:-60} python3 -m pip install -q --no-index --no-deps --no-compile \
  --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > "$OUT/install.log" 2>&1 \
  || { echo "pip install failed:"; tail -20 "$OUT/install.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton, ray, gymnasium; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'triton', triton.__version__, 'ray', ray.__version__, 'gymnasium', gymnasium.__version__)"
  python3 -c "import ray.rllib, ray.rllib.algorithms.ppo, ray.rllib.algorithms.appo; print('ray.rllib imports')"
} 2>&1 | tee "$OUT/env.txt"
echo "== install + imports: $((SECONDS - t0)) s"
rc=0
run_tests() {  # $1: marker expression, $2: log name, $3: time bound (s)
  local t=$SECONDS
  timeout "$3" python3 -m pytest tests/integrations/rllib -q -m "$1" -p no:cacheprovider \
    -rfEs -W ignore::DeprecationWarning > "$OUT/$2.log" 2>&1
  local r=$?
  [[ $r == 124 ]] && echo "!! $2: stopped at the ${3}s bound"
  echo "== $2 (-m \"$1\"): rc=$r, $((SECONDS - t)) s"
  grep -E "^(FAILED|ERROR|SKIPPED)|test_gpu.py|[0-9]+ (passed|failed|error)" "$OUT/$2.log" | tail -15
  [[ $r == 0 ]] || rc=1
}
if [[ $what == all || $what == tests ]]; then
  # (a) and (b) in one pytest process: one Ray start-up; -rfEs names any skipped GPU test
  run_tests "not slow" rllib_tests ${TEST_TIMEOUT:-240}
fi
if [[ $what == gpu ]]; then
  run_tests gpu rllib_gpu_tests ${GPU_TIMEOUT:-180}
fi
if [[ $what == all || $what == bench ]]; then
  t=$SECONDS
  timeout ${BENCH_TIMEOUT:-150} python3 scripts/rllib_connector_bench.py --devices cuda,cpu \
    --out "$OUT/rllib_connector_bench.md" ${BENCH_ARGS:-} > "$OUT/rllib_connector_bench.log" 2>&1
  r=$?
  [[ $r == 124 ]] && echo "!! bench: stopped at the ${BENCH_TIMEOUT:-150}s bound"
  echo "== bench: rc=$r, $((SECONDS - t)) s"
  if [[ -s $OUT/rllib_connector_bench.md ]]; then cat "$OUT/rllib_connector_bench.md"
  else tail -20 "$OUT/rllib_connector_bench.log"; fi
  [[ $r == 0 ]] || rc=1
fi
echo "== total $((SECONDS - t0)) s, rc=$rc; logs in $OUT"
exit $rc
