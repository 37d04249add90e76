#!/usr/bin/env bash
# Regenerate the GPU results, GPU test logs and executed notebooks on a GPU machine, in two parts that
# each fit one 10-minute device call:  GPUSPEED_GIT=<sha> OUT=/some/dir bash benchmarks/gpu_all.sh A   (then B)
# Everything lands in $OUT/gpu_<part>.tar.gz (one file back); unpack it into results/<gpu>/.
# The notebooks need nbclient + ipykernel: run benchmarks/fetch_notebook_wheels.sh here and carry .whl.
set -u
part=${1:?part A or B}
# the commit stamped into every results file: pass it in (a copied tree's .git may be stale)
: "${GPUSPEED_GIT:?set GPUSPEED_GIT=<sha of the commit being run>}"
export GPUSPEED_GIT
export PYTHONUNBUFFERED=1
R=$OUT/r
mkdir -p "$R"
if ls .whl/*.whl >/dev/null 2>&1; then  # nbclient + ipykernel for the notebooks, carried as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>/dev/null
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
step() { local t=$1 name=$2; shift 2; local t0=$SECONDS; timeout "$t" "$@" > "$R/$name.log" 2>&1;
  echo "$name: rc=$? $((SECONDS - t0))s"; }
if [ "$part" = A ]; then
  step 30 doctor python3 -m gpuspeed doctor
  # the core's and the studies' GPU tests; decode and optimize have their own part (C)
  step 250 gputests python3 -m pytest -q -m gpu -p no:cacheprovider tests --ignore-glob='tests/test_decode*' \
    --ignore-glob='tests/test_optimize*'
  step 150 bench_accuracy python3 benchmarks/bench_accuracy.py --out "$R"
  [ -n "${GPUSPEED_POWER:-}" ] && step 90 matmul_power python3 benchmarks/matmul_power.py --out "$R"
  step 90 profile_planted python3 benchmarks/profile_planted.py --out "$R"
  step 40 bench_demo python3 -m gpuspeed bench --out "$R"
else
  step 200 roofline python3 -m gpuspeed roofline --out "$R"
  step 200 launch python3 -m gpuspeed launch --out "$R"
  if [ -z "${GPUSPEED_NO_NOTEBOOKS:-}" ]; then
    export GPUSPEED_ROOFLINE_RESULTS=$R/roofline.json  # notebook 01 reads the run above instead of re-measuring
    step 60 nb01 python3 benchmarks/run_notebook.py notebooks/01_roofline.ipynb "$R/01_roofline.ipynb"
    step 120 nb03 python3 benchmarks/run_notebook.py notebooks/03_compile_cuda_graphs.ipynb \
      "$R/03_compile_cuda_graphs.ipynb"
  fi
fi
tail -n 3 "$R"/*.log
tar czf "$OUT/gpu_$part.tar.gz" -C "$R" .
