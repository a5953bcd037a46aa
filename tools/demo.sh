#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the classic CNN
# on the real Fashion-MNIST data, data-parallel on local workers (kolorun -np
# ${NP:-2}), with kolo averaging the gradients. Built-in defaults make a short
# run (1 epoch on 20000 training images, a couple of minutes on 2 cores);
# arguments go to the example and override them (a flag given twice: the
# last one wins).
#
#   tools/demo.sh                                   # defaults
#   NP=4 tools/demo.sh --epochs 2 --limit-train 0   # all 60000 images
#
# Every rank ends with "OK rank R of N: test accuracy X%".
set -euo pipefail
cd "$(dirname "$0")/.."

tools/install_deps.sh
bazel build //tools/kolorun:kolorun //frontends/torch/examples:mnist >&2

exec bazel-bin/tools/kolorun/kolorun -np "${NP:-2}" \
  bazel-bin/frontends/torch/examples/mnist \
  --epochs 1 --limit-train 20000 --limit-test 2000 "$@"
