#!/usr/bin/env bash
# Builds the Python package kolo (kolo.torch, Horovod's API) as one wheel:
#
#   tools/build_wheel.sh OUTDIR
#
# writes OUTDIR/kolo-VERSION-cp3XX-cp3XX-linux_x86_64.whl: the package's
# Python sources, its extension (kolo/_C, with kolo's runtime, backends and
# LibTorch frontend linked in: nothing to set in LD_LIBRARY_PATH) and the
# launcher (kolorun and kolo_rank_guard, installed into the environment's
# bin/). It needs Debian's python3-torch at run time, which it asks for as
# torch>=1.13.0a0. Install it next to Debian's torch, without a network:
#
#   /usr/bin/python3 -m venv --system-site-packages ENV
#   ENV/bin/pip install --no-index OUTDIR/kolo-*.whl
#
# Installs what is missing first (tools/install_deps.sh).
set -euo pipefail
if [ $# -ne 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
out=$1
cd "$(dirname "$0")/.."
tools/install_deps.sh
bazel build //frontends/python:site //tools/kolorun:kolorun \
  //tools/kolorun:kolo_rank_guard >&2
mkdir -p "$out"
exec /usr/bin/python3 tools/make_wheel.py \
  --site bazel-bin/frontends/python/site \
  --script bazel-bin/tools/kolorun/kolorun \
  --script bazel-bin/tools/kolorun/kolo_rank_guard \
  --out "$out"
