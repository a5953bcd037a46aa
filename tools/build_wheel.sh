#!/usr/bin/env bash
# Builds kolo's self-contained wheels (docs/building.md, "Wheels"):
#
#   tools/build_wheel.sh OUTDIR                       # every supported wheel
#   KOLO_PYTHON=python tools/build_wheel.sh OUTDIR    # one, for its torch
#
# Every supported wheel: PyPI's torch pinned in tools/torch-versions.txt on
# each Python it supports that this machine has (Debian's 3.11, and
# pyenv's or /usr/bin's 3.12, 3.13, 3.14 where they are), and the GPU
# machine's torch (tools/torch-device.txt, Python 3.12); each in its venv
# from tools/torch_env.sh, into OUTDIR/torchX.Y/ (two torches' wheels for
# one Python have the same name). A Python the machine lacks is named and
# skipped.
#
# Each wheel, kolo-VERSION-cp3XX-cp3XX-manylinux_2_NN_x86_64.whl, holds the
# package's Python sources, its extension (kolo/_C: kolo's runtime,
# backends and LibTorch frontend), the launcher (kolorun and
# kolo_rank_guard, installed into the environment's bin/) and, in
# kolo.libs/, its own copies of the libraries they need (gloo, protobuf,
# abseil, ...) under names that cannot clash with another copy; it takes
# torch, NCCL and the CUDA runtime from the torch it is installed next to
# (tools/self_contained.py), and asks pip for that torch (torch==X.Y.*).
# Installs what is missing first (tools/install_deps.sh, the repair tools'
# venv from tools/wheel_tools.sh).
set -euo pipefail
if [ $# -ne 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: [KOLO_PYTHON=python] $0 OUTDIR" >&2
  exit 2
fi
out=$(mkdir -p "$1" && cd "$1" && pwd)
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools_bin=$(tools/wheel_tools.sh)

# wheel PYTHON [DIR]: builds kolo for PYTHON's torch (setup.py; Bazel's
# output base is KOLO_BAZEL_OUTPUT_BASE's where it is set), then makes it
# self-contained into DIR (default OUTDIR).
wheel() {
  local python=$1 dir=${2:-$out} raw
  raw=$(mktemp -d)
  "$python" -m pip wheel -q --no-build-isolation --no-deps -w "$raw" . >&2
  PATH="$tools_bin:$PATH" "$tools_bin/python" tools/self_contained.py wheel \
    "$raw"/kolo-*.whl "$dir"
  rm -rf "$raw"
}

if [ -n "${KOLO_PYTHON:-}" ]; then
  wheel "$KOLO_PYTHON"
  exit 0
fi

# One Bazel output base per interpreter, so that a second run rebuilds
# nothing; the torch-free core's actions come from the disk cache they share.
output_base() {
  echo "$HOME/.cache/kolo/bazel-wheel-$(printf '%s' "$(readlink -f "$1")$PWD" |
    md5sum | cut -c1-8)"
}

# torchX.Y of a pins file.
minor() { echo "torch$(sed -n 's/^torch==\([0-9]*\.[0-9]*\).*/\1/p' "$1")"; }

export KOLO_BAZEL_DISK_CACHE=$HOME/.cache/kolo/bazel-disk-cache
missing=()
debian=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
for py in 3.11 3.12 3.13 3.14; do
  if [ "$py" = "$debian" ]; then
    python=$(tools/torch_env.sh tools/torch-versions.txt)
  elif ! python=$(tools/torch_env.sh tools/torch-versions.txt "$py" 2>/dev/null); then
    missing+=("torch-versions.txt on Python $py")
    continue
  fi
  KOLO_BAZEL_OUTPUT_BASE=$(output_base "$python") wheel "$python" "$out/$(minor tools/torch-versions.txt)"
done
python=$(tools/torch_env.sh tools/torch-device.txt)
KOLO_BAZEL_OUTPUT_BASE=$(output_base "$python") wheel "$python" \
  "$out/$(minor tools/torch-device.txt)"
for m in "${missing[@]}"; do
  echo "build_wheel.sh: not built: $m (no such Python with its headers here)" >&2
done
