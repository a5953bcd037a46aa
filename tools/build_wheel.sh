#!/usr/bin/env bash
# Builds the Python package kolo (kolo.torch, Horovod's API) as one wheel,
# for the torch of KOLO_PYTHON (default /usr/bin/python3, Debian's torch):
#
#   [KOLO_PYTHON=python] tools/build_wheel.sh OUTDIR
#
# writes OUTDIR/kolo-VERSION-cp3XX-cp3XX-linux_x86_64.whl: the package's
# Python sources, its extension (kolo/_C, with kolo's runtime, backends and
# LibTorch frontend linked in: nothing to set in LD_LIBRARY_PATH) and the
# launcher (kolorun and kolo_rank_guard, installed into the environment's
# bin/). It is the wheel `pip install --no-build-isolation .` builds
# (setup.py, setuptools' PEP 517 backend), and asks for the torch it was
# built for (torch==X.Y.*; Debian's 1.13.0a0 as >=1.13.0a0,<1.14). Install
# it next to that torch, without a network, e.g. for Debian's:
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
out=$(mkdir -p "$1" && cd "$1" && pwd)
cd "$(dirname "$0")/.."
tools/install_deps.sh
python=${KOLO_PYTHON:-/usr/bin/python3}
"$python" -m pip wheel -q --no-build-isolation --no-deps -w "$out" . >&2
ls "$out"/kolo-*.whl
