#!/usr/bin/env bash
# Elastic jobs, measured (docs/elastic.md, "Measured"): the elastic mnist
# example (real Fashion-MNIST, the mnist CNN, Adam) on -np NP local workers
# with --min-np 2; the worker started as rank 1 SIGKILLs itself at step 30.
# Prints, per run, the time from the kill to the first training step done
# by the survivors in the next generation (the slowest survivor: detection,
# teardown, kolorun's next generation, the new runtime, restore, sync and
# one step), and the mean cost of state.commit() for that model.
#
#   tools/bench/elastic_bench.sh [NP] [RUNS]      (defaults 4, 3)
set -euo pipefail
np=${1:-4}
runs=${2:-3}
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
bazel build //frontends/python:site //tools/kolorun:kolorun >/dev/null 2>&1
export PYTHONPATH="$repo/bazel-bin/frontends/python/site"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf "%-5s %-4s %-22s %-14s %s\n" run np "kill->resumed (s)" "commit (ms)" "accuracy"
for run in $(seq 1 "$runs"); do
  out=$(bazel-bin/tools/kolorun/kolorun -np "$np" --min-np 2 /usr/bin/python3 \
    frontends/python/examples/elastic_mnist.py --limit-train 8192 \
    --limit-test 1000 --epochs 1 --commit-every 10 --kill-rank 1 \
    --kill-step 30 --kill-file "$tmp/killed.$run" 2>&1) || {
    echo "$out"
    echo "elastic_bench: run $run failed" >&2
    exit 1
  }
  resumed=$(grep -oE 'RESUMED [0-9.]+' <<<"$out" | awk '{print $2}' | sort -n | tail -1)
  commit=$(grep -oE 'COMMIT_MS [0-9.]+' <<<"$out" | awk '{s += $2; n++} END {printf "%.1f", s / n}')
  accuracy=$(grep -oE 'test accuracy [0-9.]+%' <<<"$out" | head -1 | awk '{print $3}')
  printf "%-5s %-4s %-22s %-14s %s\n" "$run" "$np" "$resumed" "$commit" "$accuracy"
done
