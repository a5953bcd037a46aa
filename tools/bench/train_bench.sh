#!/usr/bin/env bash
# Training throughput of the mnist example's CNN (batch 64 per rank, Adam,
# synthetic data) at 1 and 2 ranks with the same threads per rank, with kolo
# (kolorun + DistributedOptimizer, from C++ and from Python: kolo.torch) and
# with PyTorch DDP (gloo), in one run, side by side:
#
#   bazel run //tools/bench:train_bench [-- --steps 30 --warmup 5 --threads 1 --ranks "1 2"]
#
# Scaling efficiency = samples/s at N ranks / (N x samples/s at 1 rank).
set -euo pipefail

steps=30 warmup=5 threads=1 ranks="1 2"
# Debian's python3-torch belongs to Debian's python3 (not, say, a pyenv one).
python=${PYTHON:-/usr/bin/python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    *) echo "usage: $0 [--steps N] [--warmup N] [--threads T] [--ranks \"1 2\"]" >&2
       exit 2 ;;
  esac
done

# The runfiles: `bazel run` starts us in them; bazel-bin/... has them beside.
if [ -d "$0.runfiles/kolo" ]; then cd "$0.runfiles/kolo"; fi
kolorun=tools/kolorun/kolorun
worker=tools/bench/train_bench_worker
ddp=tools/bench/train_bench_ddp.py
pybench=tools/bench/python_bench.py
site=frontends/python/site
for f in "$kolorun" "$worker" "$ddp" "$pybench" "$site/kolo"; do
  [ -e "$f" ] || { echo "$0: $f not found (run through bazel run)" >&2; exit 1; }
done

# "RESULT ... samples_per_s=X ..." -> X
samples() { sed -n 's/.*RESULT .*samples_per_s=\([0-9.]*\).*/\1/p' <<<"$1"; }

declare -A kolo ddp py
for n in $ranks; do
  echo "kolo: $n rank(s) x $threads thread(s)..." >&2
  out=$(OMP_NUM_THREADS=$threads "$kolorun" -np "$n" "$worker" \
    --steps "$steps" --warmup "$warmup" 2>&1) || { echo "$out" >&2; exit 1; }
  kolo[$n]=$(samples "$out")
  echo "kolo.torch: $n rank(s) x $threads thread(s)..." >&2
  out=$(OMP_NUM_THREADS=$threads PYTHONPATH="$PWD/$site" "$kolorun" -np "$n" \
    "$python" "$pybench" train --steps "$steps" --warmup "$warmup" 2>&1) ||
    { echo "$out" >&2; exit 1; }
  py[$n]=$(samples "$out")
  memory=$(sed -n 's/.*RESULT memory \(.*\)/\1/p' <<<"$out")
  echo "DDP:  $n rank(s) x $threads thread(s)..." >&2
  out=$("$python" "$ddp" --ranks "$n" --threads "$threads" --steps "$steps" \
    --warmup "$warmup" 2>&1) || { echo "$out" >&2; exit 1; }
  ddp[$n]=$(samples "$out")
done

first=${ranks%% *}
echo
echo "Training throughput, mnist CNN, batch 64/rank, Adam, $threads thread(s)/rank, $(nproc) cores, $steps steps"
printf '| %5s | %14s | %10s | %14s | %10s | %14s | %10s | %9s | %9s |\n' ranks \
  "kolo samples/s" "kolo eff." "kolo.torch s/s" "py eff." "DDP samples/s" \
  "DDP eff." "kolo/DDP" "py/DDP"
echo '|------:|---------------:|-----------:|---------------:|-----------:|---------------:|-----------:|----------:|----------:|'
for n in $ranks; do
  awk -v n="$n" -v f="$first" -v k="${kolo[$n]}" -v k1="${kolo[$first]}" \
    -v p="${py[$n]}" -v p1="${py[$first]}" \
    -v d="${ddp[$n]}" -v d1="${ddp[$first]}" 'BEGIN {
      printf "| %5d | %14.1f | %9.1f%% | %14.1f | %9.1f%% | %14.1f | %9.1f%% | %9.2f | %9.2f |\n",
        n, k, 100 * k * f / (n * k1), p, 100 * p * f / (n * p1), d,
        100 * d * f / (n * d1), k / d, p / d }'
done
echo "kolo.torch memory, rank 0 at the largest size (MB): $memory"
