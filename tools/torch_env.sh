#!/usr/bin/env bash
# Makes (or updates) the venv with the PyPI torch pinned in
# tools/torch-versions.txt, and prints its interpreter's path:
#
#   KOLO_PYTHON=$(tools/torch_env.sh) bazel build ...
#
# The venv is made from Debian's /usr/bin/python3 (whose headers kolo's
# extension compiles against) without Debian's site packages, so that its
# torch is PyPI's, and lives under $KOLO_TORCH_VENVS (default
# ~/.cache/kolo/venvs), one per pinned torch version. pip's own cache makes
# a second run cheap (PyPI's torch for Linux is the CUDA build, a few GB).
set -euo pipefail
cd "$(dirname "$0")/.."
pins=tools/torch-versions.txt
version=$(sed -n 's/^torch==//p' "$pins")
if [ -z "$version" ]; then
  echo "torch_env.sh: $pins pins no torch (a line torch==X.Y.Z)" >&2
  exit 2
fi
venv="${KOLO_TORCH_VENVS:-$HOME/.cache/kolo/venvs}/torch-$version"
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv "$venv" >&2
fi
# Quiet when everything is there already.
if ! "$venv/bin/python" -c "
import sys, torch, pytest, numpy
sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
  echo "torch_env.sh: installing torch $version into $venv" >&2
  "$venv/bin/pip" install -q -c "$pins" torch pytest numpy >&2
fi
echo "$venv/bin/python"
