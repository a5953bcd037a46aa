#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs a data-parallel job
# on local workers with built-in defaults (the allreduce example at -np 2).
#
#   tools/demo.sh                      # defaults
#   NP=4 tools/demo.sh --tensors 500   # arguments go to the example
set -euo pipefail
cd "$(dirname "$0")/.."

tools/install_deps.sh
bazel build //tools/kolorun:kolorun //tools/examples:allreduce_demo >&2

exec bazel-bin/tools/kolorun/kolorun -np "${NP:-2}" \
  bazel-bin/tools/examples/allreduce_demo "$@"
