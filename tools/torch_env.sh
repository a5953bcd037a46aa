#!/usr/bin/env bash
# Makes (or updates) the venv with the PyPI torch pinned in a pins file
# (default tools/torch-versions.txt), and prints its interpreter's path:
#
#   KOLO_PYTHON=$(tools/torch_env.sh) bazel build ...
#   tools/torch_env.sh tools/torch-device.txt   # the GPU machine's torch
#   tools/torch_env.sh tools/torch-versions.txt 3.12   # on another Python
#
# The venv is made without any system site packages, so that its torch is
# PyPI's, and lives under $KOLO_TORCH_VENVS (default ~/.cache/kolo/venvs),
# one per pinned torch version. Its interpreter is Debian's /usr/bin/python3
# (whose headers kolo's extension compiles against), or, where the pins file
# has a line "# python: X.Y" or X.Y is given, a Python X.Y with its headers:
# $KOLO_VENV_PYTHON, else /usr/bin/pythonX.Y, else pyenv's (the venv is then
# named torch-VERSION-pyX.Y). pip's own cache makes a second run cheap
# (PyPI's torch for Linux is the CUDA build, a few GB).
set -euo pipefail
cd "$(dirname "$0")/.."
pins=${1:-tools/torch-versions.txt}
version=$(sed -n 's/^torch==//p' "$pins")
if [ -z "$version" ]; then
  echo "torch_env.sh: $pins pins no torch (a line torch==X.Y.Z)" >&2
  exit 2
fi
venvs="${KOLO_TORCH_VENVS:-$HOME/.cache/kolo/venvs}"
py_version=${2:-$(sed -n 's/^# python: *\([0-9.]*\) *$/\1/p' "$pins")}
if [ -z "$py_version" ]; then
  python=/usr/bin/python3
  venv="$venvs/torch-$version"
else
  python=""
  candidates=("/usr/bin/python$py_version"
    "$HOME"/.pyenv/versions/"$py_version"*/bin/"python$py_version")
  [ -n "${KOLO_VENV_PYTHON:-}" ] && candidates=("$KOLO_VENV_PYTHON")
  for candidate in "${candidates[@]}"; do
    if [ -x "$candidate" ] && "$candidate" -c "
import os, sys, sysconfig
sys.exit(not (sys.version.startswith('$py_version.') and os.path.exists(
    os.path.join(sysconfig.get_paths()['include'], 'Python.h'))))" 2>/dev/null; then
      python=$candidate
      break
    fi
  done
  if [ -z "$python" ]; then
    echo "torch_env.sh: $pins needs Python $py_version with its headers" \
      "(Python.h): ${KOLO_VENV_PYTHON:+$KOLO_VENV_PYTHON is not one; }set" \
      "KOLO_VENV_PYTHON to one" >&2
    exit 2
  fi
  venv="$venvs/torch-$version-py$py_version"
fi
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$venvs"
  "$python" -m venv "$venv" >&2
fi
# expecttest where the pins name it: torch's own test suite imports it
# (tests/frontends/python/torch_suite).
packages=(torch pytest numpy)
grep -q '^expecttest==' "$pins" && packages+=(expecttest)
# Quiet when everything is there already.
if ! "$venv/bin/python" -c "
import sys, torch, $(IFS=,; echo "${packages[*]:1}")
sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
  echo "torch_env.sh: installing torch $version into $venv" >&2
  "$venv/bin/pip" install -q -c "$pins" "${packages[@]}" >&2
fi
echo "$venv/bin/python"
