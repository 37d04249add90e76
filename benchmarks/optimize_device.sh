#!/usr/bin/env bash
# gpuspeed optimize on the device: GPUSPEED_GIT=<sha> OUT=/some/dir bash benchmarks/optimize_device.sh PART
#   A, B the examples in two halves, each ~7 min on nvidia-h200-x2 (one example per GPU, default settings:
#        300 s per example; every measurement alone under one lock); B merges the optimize.json of A when
#        results/nvidia-h200/optimize.json (unpacked from A) travels with the tree
#   ALL  every example in one call (needs ~13 min on x2: cut at LIMIT, the finished examples are kept)
#   T    the optimize GPU tests
#   R2   round 2 (issue 13), ~5 min on one GPU: the chunking GPU tests, then pairwise_distance and heat_stencil
#        side by side at --time-budget 135 (under the default 300: pairwise_distance may skip its last candidates)
# Everything lands in $OUT/optimize_<part>.tar.gz; unpack it into results/nvidia-h200/.
set -u
part=${1:?part ALL, A, B, T or R2}
: "${GPUSPEED_GIT:?set GPUSPEED_GIT=<sha of the commit being run>}"
export GPUSPEED_GIT PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
R=/tmp/optimize_r
mkdir -p "$R"
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
run() { timeout "${LIMIT:-570}" python3 benchmarks/optimize.py --out "$R" --gpus "$gpus" --parallel "${PAR:-$gpus}" \
  --time-budget "${TB:-300}" --bench-budget "${BB:-0.5}" ${1:+--examples "$1"} 2>&1 | tee "$R/bench_$part.log"; }
case $part in
  ALL) run "" ;;
  A) run black_scholes,polynomial_features,heat_stencil,pairwise_distance,row_stats,image_filter ;;
  B) cp results/nvidia-h200/optimize.json "$R/" 2>/dev/null
     run histogram,mandelbrot,ema_filter,row_normalize_loop,torch_mlp ;;
  R2) timeout 125 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_optimize_gpu.py -k chunk 2>&1 \
        | tee "$R/gpu_tests_optimize_r2.log"
      LIMIT=${LIMIT:-150} TB=${TB:-135} PAR=${PAR:-2} run pairwise_distance,heat_stencil ;;
  T) timeout 560 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_optimize_gpu.py 2>&1 | tee "$R/gpu_tests_optimize.log" ;;
  *) echo "part ALL, A, B, T or R2"; exit 2 ;;
esac
rm -f "$R"/optimize/*/refs.pkl "$R"/optimize/.device.lock*
tar czf "$OUT/optimize_$part.tar.gz" -C "$R" .
ls -la "$OUT"
