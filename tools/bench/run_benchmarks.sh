#!/usr/bin/env bash
# Every measurement of docs/benchmarks.md in one go, 2 ranks on this host:
#   tools/bench/run_benchmarks.sh [OUT_DIR]   (default /tmp/kolo-bench)
# Builds what it needs, then writes one .txt per table (and the plots,
# CSVs) under OUT_DIR. Takes ~10 minutes on 2 cores. Needs openmpi-bin,
# libopenmpi-dev, python3-torch and python3-matplotlib for the baselines
# and plots; without them those columns show n/a.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/kolo-bench}
np=${NP:-2}
mkdir -p "$out"
bazel build //tools/kolorun:kolorun //tools/bench:kolo_bench \
  //tools/bench:negotiation_bench //tools/bench:shm_backend_bench \
  //tools/bench:core_pingpong
run="bazel-bin/tools/kolorun/kolorun -np $np bazel-bin/tools/bench/kolo_bench"
{ echo "# $(date -u) $(nproc) cores: $(lscpu | sed -n 's/^Model name: *//p')"
  echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  # Where the vCPUs sit moves every shared-memory number (docs/benchmarks.md,
  # round 10).
  bazel-bin/tools/bench/core_pingpong 2>&1 || true; } > "$out/machine.txt"

# Lone-op latency and bandwidth, every collective, 4 B .. 256 MB.
$run --ops allreduce --minbytes 4 --maxbytes 256M --stepfactor 4 \
  --baselines gloo,mpi,torch --plot "$out/allreduce.png" > "$out/allreduce.txt"
$run --ops allgather,broadcast,reducescatter,alltoall --minbytes 4 --maxbytes 256M \
  --stepfactor 16 --baselines gloo,mpi,torch --plot "$out/others.png" > "$out/others.txt"
# Steady-state loop (mean over back-to-back ops).
$run --mode loop --ops allreduce --sizes 4K,64K,1M,16M,64M \
  --baselines gloo,mpi,torch > "$out/loop.txt"
# Fusion workload: 200 x 4 KB per step.
$run --mode fusion --baselines gloo,mpi,torch > "$out/fusion.txt"
# Idle CPU of an initialised job.
$run --idle 10 > "$out/idle.txt"
# The shm backend alone, and the coordinator at scale.
bazel-bin/tools/bench/shm_backend_bench > "$out/shm_backend.txt"
bazel-bin/tools/bench/negotiation_bench --cycles 5 > "$out/negotiation.txt"
{ echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
  bazel-bin/tools/bench/core_pingpong 2>&1 || true; } >> "$out/machine.txt"
echo "results in $out"
