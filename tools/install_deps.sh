#!/usr/bin/env bash
# Installs the Debian packages kolo needs, if any is missing. Idempotent and
# safe to rerun; needs root (or sudo) only when something is missing.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-platforms bazel-skylib bazel-rules-java bazel-rules-proto
  g++ libgloo-dev libabsl-dev libprotobuf-dev protobuf-compiler
  libssl-dev libgtest-dev libgmock-dev
  procps iproute2
  # Sanitizers and fuzzers (tools/sanitize.sh, tools/fuzz.sh)
  clang libclang-rt-14-dev python3
  # The format check of tools/test.sh (tools/format_check.sh)
  clang-format-14
  # LibTorch frontend, its example and the DDP baseline
  libtorch-dev dataset-fashion-mnist python3-torch cmake pkg-config zlib1g-dev
  # Python frontend (kolo.torch): its extension, tests and wheel install
  pybind11-dev python3-dev python3-pytest python3-venv python3-pip
  # The wheel's test on a clean system (tests/packaging/clean_system.sh)
  debootstrap
  # Launching under other engines and over ssh (tests use network namespaces)
  openmpi-bin openssh-server openssh-client
  # kolo_bench baselines and plots
  libopenmpi-dev python3-matplotlib
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install_deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >&2
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
