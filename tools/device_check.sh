#!/usr/bin/env bash
# GPU checks on a machine with an NVIDIA GPU, in under 5 minutes.
#
#   tools/device_check.sh prepare [DIR]   here (Bazel): build and collect the
#                                         bundle DIR (default build/device)
#   tools/device_check.sh run [DIR]       on the GPU machine, from the repo root
#   tools/device_check.sh                 prepare where `bazel` is found, else run
#
# The GPU machine has CMake, ninja, g++, nvcc, PyTorch with CUDA (its LibTorch
# under `python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'`)
# and NCCL, but no Bazel and none of our Debian libraries, and nothing can be
# installed there. So `prepare` builds here, with Bazel:
#   - the GPU test binaries (GPU_TESTS below; they skip with a "no GPU"
#     message where there is none);
#   - libkolo_core.so (//packaging:kolo_core): the runtime and every backend,
#     no torch, exporting kolo's symbols only;
# and collects into DIR (git-ignored, about 20 MiB; see docs/device_check.md):
#   bin/       the test binaries and kolorun
#   lib/       libkolo_core.so.0 and every shared library they need that is
#              neither glibc, libstdc++/libgcc nor CUDA/NCCL (Debian's abseil,
#              protobuf, gloo, hiredis, ibverbs, and the Bazel-built
#              libraries of the test binaries; kolo needs no OpenSSL)
#   include/   kolo's public headers (kolo/, kolo/torch/), abseil's, and the
#              private ones the frontend's sources include (runtime/sync/)
#   src/       the LibTorch frontend's sources (frontends/torch/*.cc)
#   project/   tests/device: a CMake project building the frontend and
#              torch_cuda_check.cc against find_package(Torch), and
#              torch_python_check.py
#   wheel/     kolo's wheel (kolo.torch, the torch.distributed backend) built
#              against the GPU machine's torch, pinned in
#              tools/torch-device.txt (torch 2.11.0 on Python 3.12: a venv of
#              tools/torch_env.sh, Bazel in an output base of its own); lib/
#              also holds what its extension needs
#   MANIFEST   commit, date, what was built and what was missing
# libcudart and libnccl are NOT carried: `run` finds the GPU machine's own
# (torch's lib dir, nvidia-* wheels under site-packages, /usr/local/cuda).
#
# `run` prints the GPU, finds libcudart/libnccl, checks that the LibTorch has
# CUDA by its libraries (libc10_cuda.so and libtorch_cuda.so in torch's lib
# dir: Debian ships c10/cuda headers without them, so headers prove nothing),
# then runs, each under `timeout`:
#   - the GPU test binaries with LD_LIBRARY_PATH = DIR/lib + the CUDA dirs;
#   - meanwhile (in the background) the CMake project, configured with ninja
#     against that machine's LibTorch; then torch_cuda_check;
#   - the wheel, installed with pip --target into DIR/site (no network, no
#     dependencies: that machine's torch is the one it was built for), and
#     torch_python_check.py under kolorun -np 1 with that machine's python3;
# and ends with "device_check: N passed, N failed, N skipped". Where
# nvidia-smi lists a GPU, a test that skips counts as failed (it should have
# found the GPU). Logs go to DIR/logs (and to $DEVICE_CHECK_LOGS if set, e.g.
# the device tool's $OUT).
#
# Symbol clashes with PyTorch (read this before trusting a crash):
#   Debian's protobuf and abseil static archives are not PIC (they hold
#   R_X86_64_TPOFF32 local-exec TLS relocations: arena.o, absl_base, ...), and
#   there is no libgloo.a, so they cannot be linked into libkolo_core.so and
#   hidden. They are carried as shared libraries instead:
#   - abseil: no clash possible; Debian's abseil lives in the inline
#     namespace absl::debian3, and every abseil inline/template instance
#     compiled into libkolo_core.so is local (version script).
#   - OpenSSL: not used by kolo (its HMAC is runtime/net/sha256.h).
#   - libprotobuf.so.32 (3.21) and libgloo.so.0 (0.5): unversioned names in
#     google::protobuf:: and gloo::. PyTorch links its own protobuf and gloo
#     into libtorch_cpu.so. If that library exports the same names, the
#     dynamic linker binds every reference to the first definition in load
#     order, across versions. torch_cuda_check (built on the GPU machine)
#     links libkolo_core.so.0, libgloo.so.0 and libprotobuf.so.32 with
#     --no-as-needed BEFORE LibTorch, so kolo (and gloo/protobuf themselves)
#     always bind to Debian's copies; the residual risk is the other
#     direction: LibTorch code calling an exported protobuf/gloo name of its
#     own would get Debian's. LibTorch uses gloo only in ProcessGroupGloo
#     (never created here) and protobuf in ONNX/caffe2 serialization (not
#     used here, but its generated code registers descriptors when
#     libtorch_cpu.so loads). `run` prints how many names each carried
#     library shares with the LibTorch libraries, with examples, and if
#     torch_cuda_check crashes, runs torch_cuda_check_torch_first (the same
#     program linked the other way round), so a clash can be told from a
#     bug. The GPU test binaries do not load LibTorch at all.
#   Residual lookup risks: the carried binaries need glibc 2.34 and
#   libstdc++ GLIBCXX_3.4.30 (Debian 12's) or later, and an NCCL that has
#   every call kolo makes (ncclCommInitRankConfig, the newest, is 2.14's;
#   built against 2.28's headers). `run` checks every binary with `ldd -r`
#   first and says which library or symbol is missing.
set -uo pipefail

GPU_TESTS=(
  //tests/ops/nccl:nccl_gpu_test
  //tests/ops/nccl:hierarchical_gpu_test
)
[ -n "${DEVICE_CHECK_TESTS:-}" ] && read -r -a GPU_TESTS <<<"$DEVICE_CHECK_TESTS"
BUDGET_S=${DEVICE_CHECK_BUDGET_S:-300}  # the whole run
TEST_TIMEOUT_S=${DEVICE_CHECK_TEST_TIMEOUT_S:-100}
BUILD_TIMEOUT_S=${DEVICE_CHECK_BUILD_TIMEOUT_S:-200}
# DEVICE_CHECK_JOBS: parallel compile jobs of the frontend build (default:
# ninja's); DEVICE_CHECK_BUILD_DIR: its build directory (default DIR/cmake-build);
# DEVICE_CHECK_LOGS: a directory that receives device_check_logs.tar.gz.

# Libraries the GPU machine has itself: glibc, the GCC runtime, the CUDA
# driver and toolkit, NCCL.
SYSTEM_LIBS='^(linux-vdso\.so|ld-linux|libc\.so|libm\.so|libmvec\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libcudart\.so|libnccl\.so|libnvidia-|libnvrtc|libcublas|libcufft|libcurand|libcusparse|libcusolver|libcudnn|libnvJitLink|libnvToolsExt)'

usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
die() {
  echo "device_check: $*" >&2
  exit 1
}

# The bundle's absolute path: DIR relative to the current directory, or
# build/device in the repository.
bundle_dir() {  # bundle_dir [DIR]
  case ${1:-} in
    "") echo "$(cd "$(dirname "$0")/.." && pwd)/build/device" ;;
    /*) echo "$1" ;;
    *) echo "$PWD/$1" ;;
  esac
}

# ---------------------------------------------------------------------------
# prepare (here, with Bazel)

prepare() {
  local dir
  dir=$(bundle_dir "${1:-}")
  cd "$(dirname "$0")/.." || die "no repository"
  if [ -e "$dir" ] && [ ! -f "$dir/MANIFEST" ] && [ -n "$(ls -A "$dir")" ]; then
    die "$dir exists and is not a bundle: not overwriting it"
  fi

  local existing=() missing=() t
  for t in "${GPU_TESTS[@]}"; do
    if bazel query "$t" >/dev/null 2>&1; then
      existing+=("$t")
    else
      missing+=("$t")
      echo "device_check: WARNING: $t does not exist (yet): not in the bundle" >&2
    fi
  done
  bazel build --jobs=2 //packaging:kolo_core //tools/kolorun:kolorun \
    "${existing[@]}" || die "bazel build failed"
  local bin
  bin=$(bazel info bazel-bin 2>/dev/null) || die "bazel info failed"

  # kolo's wheel for the GPU machine's torch, built before the old bundle
  # goes. DEVICE_CHECK_WHEEL=0 leaves it out (run then reports it missing).
  local wheel_tmp device_python=""
  wheel_tmp=$(mktemp -d)
  if [ "${DEVICE_CHECK_WHEEL:-1}" = 1 ]; then
    if device_python=$(tools/torch_env.sh tools/torch-device.txt) &&
       KOLO_PYTHON=$device_python KOLO_BAZEL_OUTPUT_BASE="$HOME/.cache/kolo-torch-device-$(pwd | md5sum | cut -c1-8)" \
         tools/build_wheel.sh "$wheel_tmp" >/dev/null; then
      echo "device_check: wheel $(basename "$(ls "$wheel_tmp"/kolo-*.whl)")"
    else
      missing+=(wheel)
      echo "device_check: WARNING: no wheel for tools/torch-device.txt's torch" >&2
    fi
  else
    missing+=(wheel)
  fi

  rm -rf "$dir"
  mkdir -p "$dir"/{bin,lib,include/kolo/torch,src/frontends/torch,project,logs,wheel}
  cp "$wheel_tmp"/kolo-*.whl "$dir/wheel/" 2>/dev/null
  rm -rf "$wheel_tmp"
  install -m 0755 "$bin/packaging/libkolo_core.so" "$dir/lib/libkolo_core.so.0"
  ln -s libkolo_core.so.0 "$dir/lib/libkolo_core.so"
  install -m 0755 "$bin/tools/kolorun/kolorun" "$dir/bin/"
  : >"$dir/tests.txt"
  for t in "${GPU_TESTS[@]}"; do
    echo "${t##*:} $t" >>"$dir/tests.txt"
  done
  local sources=("$bin/packaging/libkolo_core.so" "$bin/tools/kolorun/kolorun")
  for t in "${existing[@]}"; do
    local path=${t#//}
    sources+=("$bin/${path/://}")
    install -m 0755 "$bin/${path/://}" "$dir/bin/" || die "no binary for $t"
  done

  # The wheel carries what its extension needs besides torch (kolo.libs/,
  # tools/self_contained.py): nothing of it goes into lib/.
  local torch_site=""

  # Shared libraries: ldd gives the whole closure, resolved as here (from
  # Bazel's outputs, whose RUNPATHs lead to Bazel's own libraries).
  local f line soname path
  for f in "${sources[@]}"; do
    while read -r line; do
      soname=${line%% *}
      path=$(sed -n 's/.*=> \(\/[^ ]*\) (0x.*/\1/p' <<<"$line")
      grep -qE "$SYSTEM_LIBS" <<<"$soname" && continue
      [[ $soname == libkolo_core.so.0 ]] && continue
      [ -n "$torch_site" ] && [[ $path == "$torch_site"/* ]] && continue
      if [ -z "$path" ]; then
        grep -q 'not found' <<<"$line" && die "$f needs $soname, not found here"
        continue
      fi
      [ -e "$dir/lib/$soname" ] || install -m 0644 "$path" "$dir/lib/$soname"
    done < <(ldd "$f" | sed 's/^[[:space:]]*//')
  done

  install -m 0644 runtime/include/kolo/*.h "$dir/include/kolo/"
  install -m 0644 frontends/torch/include/kolo/torch/*.h "$dir/include/kolo/torch/"
  cp -r /usr/include/absl "$dir/include/absl"
  # The private headers the frontend's sources include (runtime/sync/mutex.h).
  local header
  for header in $(sed -n 's/^#include "\(runtime\/[^"]*\)"/\1/p' frontends/torch/*.cc | sort -u); do
    install -D -m 0644 "$header" "$dir/include/$header"
  done
  install -m 0644 frontends/torch/*.cc "$dir/src/frontends/torch/"
  install -m 0644 tests/device/CMakeLists.txt tests/device/torch_python_check.py \
    "$dir/project/"
  if [ -f tests/device/torch_cuda_check.cc ]; then
    install -m 0644 tests/device/torch_cuda_check.cc "$dir/project/"
  else
    echo "device_check: WARNING: tests/device/torch_cuda_check.cc is missing" >&2
  fi

  # Every library a binary needs must now resolve into the bundle (or be
  # one the GPU machine has itself).
  local stray
  stray=$(for f in "$dir"/bin/* "$dir"/lib/*.so*; do
    LD_LIBRARY_PATH=$dir/lib ldd "$f" | sed 's/^[[:space:]]*//' |
      grep -vE "$SYSTEM_LIBS" | grep '=> /' | grep -v "=> $dir/lib/"
  done | sort -u)
  [ -z "$stray" ] || die "libraries outside the bundle:
$stray"

  {
    echo "commit $(git rev-parse HEAD 2>/dev/null) ($(git status --porcelain 2>/dev/null | wc -l) files changed)"
    echo "prepared $(date -u +%FT%TZ) on $(hostname)"
    echo "tests ${existing[*]:-none}"
    echo "missing ${missing[*]:-none}"
    (cd "$dir" && find bin lib project src wheel -type f -printf '%s %p\n' | sort -k2)
  } >"$dir/MANIFEST"
  local bytes
  bytes=$(du -sb "$dir" | cut -f1)
  echo "device_check: bundle $dir: $((bytes / 1048576)) MiB," \
    "$(ls "$dir/bin" | wc -l) binaries, $(ls "$dir/lib" | wc -l) libraries"
  [ "$bytes" -lt $((60 * 1048576)) ] ||
    echo "device_check: WARNING: over 60 MiB: the device tool carries 64 MiB in all" >&2
  git check-ignore -q "$dir" 2>/dev/null ||
    echo "device_check: WARNING: $dir is not git-ignored" >&2
  [ ${#missing[@]} -eq 0 ] || echo "device_check: missing: ${missing[*]}" >&2
  return 0
}

# ---------------------------------------------------------------------------
# run (on the GPU machine)

passed=0 failed=0 skipped=0
result() {  # result pass|fail|skip NAME WHY
  case $1 in
    pass) passed=$((passed + 1)); echo "PASSED  $2${3:+: $3}" ;;
    fail) failed=$((failed + 1)); echo "FAILED  $2${3:+: $3}" ;;
    skip) skipped=$((skipped + 1)); echo "SKIPPED $2${3:+: $3}" ;;
  esac
}
remaining() { echo $((BUDGET_S - SECONDS)); }
limit() {  # limit WANTED: WANTED, but no later than the budget (less 5 s)
  local r=$(($(remaining) - 5))
  [ "$r" -lt "$1" ] && echo $((r > 1 ? r : 1)) || echo "$1"
}

show_failures() {  # show_failures LOG: its failure lines, then its end
  grep -E '^FAIL|^\[  FAILED  \]|Failure$|rror' "$1" | head -n 20 | cut -c1-300 |
    sed 's/^/  | /'
  echo "  | ... last lines of ${1##*/}:"
  tail -n 15 "$1" | cut -c1-300 | sed 's/^/  | /'
}

# Classifies a finished program from its exit status and log, the way
# tools/test.sh does: skipped when it ran nothing ("SKIP all", or gtest's
# "[  SKIPPED ]" with no "[       OK ]"/"PASS" line).
classify() {  # classify NAME RC LOG
  local name=$1 rc=$2 log=$3
  grep -E '^\[  PASSED  \]|^\[  SKIPPED \] [0-9]+ test|^\[  FAILED  \] [0-9]+ test|: [0-9]+ passed, [0-9]+ failed' \
    "$log" | sed 's/^/        /'
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    show_failures "$log"
    result fail "$name" "timed out"
  elif [ "$rc" -ne 0 ]; then
    show_failures "$log"
    result fail "$name" "exit status $rc"
  elif grep -qE '^SKIP all|^\[  SKIPPED \]' "$log" &&
       ! grep -qE '^\[       OK \]|^PASS ' "$log"; then
    if [ "$have_gpu" = 1 ]; then
      grep -E 'SKIP' "$log" | head -n 5
      result fail "$name" "skipped although nvidia-smi lists a GPU"
    else
      result skip "$name" "$(grep -m1 -oE '(no GPU|SKIP all).*' "$log" | cut -c1-100)"
    fi
  else
    result pass "$name"
  fi
}

# Directories of the libraries that DIR's binaries need and DIR does not
# carry (libcudart, libnccl), put on LD_LIBRARY_PATH so that they win over
# the RUNPATH Bazel wrote (this machine's /usr/local/cuda): torch's and the
# nvidia-* wheels' lib dirs first (the copies LibTorch itself loads, so that
# one process has one of each), then the CUDA toolkit's.
find_cuda_dirs() {  # find_cuda_dirs DIR TORCH_LIB SITE_PACKAGES...
  local dir=$1 torch_lib=$2
  shift 2
  local candidates=() sp d
  for sp in "$@"; do
    for d in "$sp"/nvidia/*/lib "$sp"/nvidia/*/lib64 "$sp"/nvidia/cu*/*/lib; do
      [ -d "$d" ] && candidates+=("$d")
    done
  done
  candidates+=("$torch_lib" /usr/local/cuda/lib64
    /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64)
  local needed soname found=()
  needed=$(for f in "$dir"/bin/* "$dir"/lib/*.so*; do
    readelf -d "$f" 2>/dev/null
  done | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u |
    grep -E '^lib(cudart|nccl|cublas|nvrtc|nvJitLink)')
  for soname in $needed; do
    [ -e "$dir/lib/$soname" ] && continue
    for d in "${candidates[@]}"; do
      if [ -e "$d/$soname" ]; then
        [[ " ${found[*]} " == *" $d "* ]] || found+=("$d")
        break
      fi
    done
  done
  (IFS=:; echo "${found[*]}")
}

# Names the carried libraries share with LibTorch's (see the header).
clash_report() {  # clash_report DIR TORCH_LIB
  local dir=$1 torch_lib=$2 tmp lib n
  tmp=$(mktemp -d)
  for lib in "$torch_lib"/libtorch_cpu.so "$torch_lib"/libtorch.so \
    "$torch_lib"/libc10.so "$torch_lib"/libtorch_cuda.so "$torch_lib"/libc10_cuda.so; do
    [ -e "$lib" ] && nm -D --defined-only "$lib" 2>/dev/null
  done | awk '{print $NF}' | sed 's/@.*//' | sort -u >"$tmp/torch"
  echo "symbols shared with LibTorch ($(wc -l <"$tmp/torch") exported there):"
  for lib in "$dir"/lib/libgloo.so* "$dir"/lib/libprotobuf.so* \
    "$dir"/lib/libhiredis.so* "$dir"/lib/libcrypto.so* "$dir"/lib/libabsl_base.so*; do
    [ -e "$lib" ] || continue
    nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | sort -u |
      comm -12 - "$tmp/torch" >"$tmp/common"
    # std:: template instances (the same libstdc++ code on both sides) are
    # harmless; names of the library's own are what could clash.
    grep -vE '^_Z(T[ISV]|Z|GVZ)?N?K?St' "$tmp/common" >"$tmp/own"
    n=$(wc -l <"$tmp/common")
    echo "  ${lib##*/}: $n, of which $(wc -l <"$tmp/own") not std::"
    head -n 3 "$tmp/own" | c++filt | cut -c1-120 | sed 's/^/      /'
  done
  rm -rf "$tmp"
}

# The CMake project (project/CMakeLists.txt) against this machine's LibTorch;
# where CMake cannot configure it, the same with g++ directly, so that
# torch_cuda_check still runs (the build step still counts as failed).
build_frontend() {  # build_frontend DIR BUILD_DIR TORCH_PREFIX TORCH_DIR ABI
  local dir=$1 build=$2 prefix=$3 torch_dir=$4 abi=$5
  local args=(-S "$dir/project" -B "$build" -DCMAKE_BUILD_TYPE=Release
    -DKOLO_BUNDLE="$dir")
  command -v ninja >/dev/null && args+=(-G Ninja)
  [ -n "$prefix" ] && [ -d "$prefix" ] && args+=(-DCMAKE_PREFIX_PATH="$prefix")
  [ -d /usr/local/cuda ] && args+=(-DCUDAToolkit_ROOT=/usr/local/cuda)
  # A CUDA LibTorch's config enables CMake's CUDA language: name nvcc even
  # where it is not on PATH. No CUDA code is compiled (90: Hopper).
  local nvcc
  nvcc=$(command -v nvcc || true)
  [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
  [ -n "$nvcc" ] && args+=(-DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90)
  echo "+ cmake ${args[*]}"
  if cmake "${args[@]}" && cmake --build "$build" --parallel ${DEVICE_CHECK_JOBS:-}; then
    return 0
  fi
  echo "=== CMake failed: building with g++ directly instead"
  local inc=() libs
  [ -d "$torch_dir/include" ] && inc=(-isystem "$torch_dir/include"
    -isystem "$torch_dir/include/torch/csrc/api/include")
  [ -d "$torch_dir/include" ] || inc=(-isystem /usr/include/torch/csrc/api/include)
  libs=(-L"$torch_dir/lib" -ltorch -ltorch_cpu -lc10)
  [ -e "$torch_dir/lib/libtorch_cuda.so" ] && libs+=(-ltorch_cuda -lc10_cuda)
  mkdir -p "$build/direct"
  local src pids=()
  for src in "$dir"/src/frontends/torch/*.cc "$dir"/project/torch_cuda_check.cc; do
    g++ -std=c++17 -O2 -D_GLIBCXX_USE_CXX11_ABI="$abi" -I"$dir/include" \
      "${inc[@]}" -c "$src" -o "$build/direct/$(basename "$src" .cc).o" &
    pids+=($!)
  done
  local p ok=1
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  [ "$ok" = 1 ] || return 2
  g++ -o "$build/torch_cuda_check" "$build"/direct/*.o -Wl,--no-as-needed \
    "$dir/lib/libkolo_core.so.0" "$dir/lib/libgloo.so.0" \
    "$dir/lib/libprotobuf.so.32" "$dir"/lib/libabsl_*.so.* "${libs[@]}" \
    -Wl,-rpath,"$torch_dir/lib:$dir/lib" -Wl,-rpath-link,"$dir/lib" || return 2
  return 2
}

run() {
  local dir
  dir=$(bundle_dir "${1:-}")
  cd "$(dirname "$0")/.." || die "no repository"
  [ -d "$dir" ] || die "no bundle at $dir (make it with: tools/device_check.sh prepare $dir)"
  [ -f "$dir/tests.txt" ] && [ -e "$dir/lib/libkolo_core.so.0" ] ||
    die "$dir is not a bundle made by tools/device_check.sh prepare"
  local logs=$dir/logs
  rm -rf "$logs"
  mkdir -p "$logs"
  SECONDS=0
  sed -n '1,4p' "$dir/MANIFEST"

  echo "=== GPU"
  have_gpu=0
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L 2>&1 | tee "$logs/nvidia-smi.log"
    grep -q '^GPU [0-9]' "$logs/nvidia-smi.log" && have_gpu=1
  else
    echo "no nvidia-smi"
  fi

  echo "=== LibTorch"
  local probe torch_dir="" torch_prefix="" abi=1 sps=()
  probe=$(timeout 60 python3 - <<'EOF' 2>"$logs/python.log"
import os, site
try:
    import torch
    print("version", torch.__version__, torch.version.cuda or "cpu")
    print("dir", os.path.dirname(torch.__file__))
    print("prefix", torch.utils.cmake_prefix_path)
    print("abi", int(torch._C._GLIBCXX_USE_CXX11_ABI))
except Exception as e:
    print("error", e)
for p in site.getsitepackages():
    print("site", p)
EOF
  )
  echo "$probe" | grep -E '^(version|dir|error)' | sed 's/^/  /'
  torch_dir=$(sed -n 's/^dir //p' <<<"$probe")
  torch_prefix=$(sed -n 's/^prefix //p' <<<"$probe")
  abi=$(sed -n 's/^abi //p' <<<"$probe")
  mapfile -t sps < <(sed -n 's/^site //p' <<<"$probe")
  local torch_lib=${torch_dir:+$torch_dir/lib} torch_cuda=0
  if [ -n "$torch_lib" ] && [ -e "$torch_lib/libc10_cuda.so" ] &&
     [ -e "$torch_lib/libtorch_cuda.so" ]; then
    torch_cuda=1
    echo "  CUDA: yes (libc10_cuda.so and libtorch_cuda.so in $torch_lib)"
  else
    echo "  CUDA: no (no libc10_cuda.so/libtorch_cuda.so in ${torch_lib:-?})"
  fi

  echo "=== libraries"
  local cuda_dirs ldpath
  cuda_dirs=$(find_cuda_dirs "$dir" "${torch_lib:-/nonexistent}" "${sps[@]}")
  ldpath=$dir/lib${cuda_dirs:+:$cuda_dirs}
  echo "  LD_LIBRARY_PATH=$ldpath"
  # Every binary must load: a missing library or symbol version (libstdc++,
  # NCCL older than ours) shows here, before the test fails on it.
  local f
  for f in "$dir"/bin/* "$dir/lib/libkolo_core.so.0"; do
    LD_LIBRARY_PATH=$ldpath ldd -r "$f" >"$logs/ldd-${f##*/}.log" 2>&1
    grep -E 'not found|undefined symbol' "$logs/ldd-${f##*/}.log" | head -n 5 |
      sed "s|^[[:space:]]*|  ${f##*/}: |"
  done
  cat "$logs"/ldd-*.log | grep -E '^[[:space:]]*lib(cudart|nccl)[^ ]* => ' |
    sed -e 's/^[[:space:]]*/  /' -e 's/ (0x.*//' | sort -u
  [ -n "$torch_lib" ] && [ -d "$torch_lib" ] && timeout 60 bash -c \
    "$(declare -f clash_report); clash_report '$dir' '$torch_lib'" 2>&1 |
    tee "$logs/clashes.log"

  # The frontend builds in the background while the GPU tests run.
  local build=${DEVICE_CHECK_BUILD_DIR:-$dir/cmake-build} build_pid build_rc
  rm -rf "$build"
  (
    timeout -k 5 "$(limit "$BUILD_TIMEOUT_S")" bash -c \
      "$(declare -f build_frontend); build_frontend '$dir' '$build' '$torch_prefix' '$torch_dir' '${abi:-1}'"
  ) >"$logs/build.log" 2>&1 &
  build_pid=$!

  local name target rc
  while read -r name target; do
    echo "=== $name"
    if [ ! -x "$dir/bin/$name" ]; then
      result fail "$name" "not in the bundle ($target was not built by prepare)"
      continue
    fi
    (cd "$logs" && LD_LIBRARY_PATH=$ldpath timeout -k 5 \
      "$(limit "$TEST_TIMEOUT_S")" "$dir/bin/$name") >"$logs/$name.log" 2>&1
    rc=$?
    classify "$name" "$rc" "$logs/$name.log"
  done <"$dir/tests.txt"

  echo "=== frontend build (CMake, LibTorch ${torch_dir:-not found})"
  wait "$build_pid"
  build_rc=$?
  grep -E '^-- (Found Torch|Caffe2: CUDA)|^=== CMake failed' "$logs/build.log" | sed 's/^/  /'
  local check=$build/torch_cuda_check
  if [ "$build_rc" -eq 0 ]; then
    result pass "frontend build"
  else
    show_failures "$logs/build.log"
    result fail "frontend build" "$( [ "$build_rc" -ge 124 ] && echo "timed out" || echo "see logs/build.log")"
  fi

  echo "=== torch_cuda_check"
  if [ ! -x "$check" ]; then
    result fail torch_cuda_check "not built"
  else
    (cd "$logs" && LD_LIBRARY_PATH=$ldpath${torch_lib:+:$torch_lib} timeout -k 5 \
      "$(limit 90)" "$check") >"$logs/torch_cuda_check.log" 2>&1
    rc=$?
    if [ "$torch_cuda" = 0 ] && [ "$have_gpu" = 1 ]; then
      result fail torch_cuda_check "this LibTorch has no CUDA libraries, cannot test CUDA tensors"
    else
      classify torch_cuda_check "$rc" "$logs/torch_cuda_check.log"
    fi
    # Killed by a signal (not by timeout): a protobuf/gloo clash would show
    # as a crash in one link order and not in the other.
    if [ "$rc" -gt 128 ] && [ "$rc" -ne 137 ] && [ -x "${check}_torch_first" ]; then
      echo "=== torch_cuda_check_torch_first (LibTorch first in the lookup order)"
      (cd "$logs" && LD_LIBRARY_PATH=$ldpath${torch_lib:+:$torch_lib} timeout -k 5 \
        "$(limit 90)" "${check}_torch_first") >"$logs/torch_cuda_check_torch_first.log" 2>&1
      classify torch_cuda_check_torch_first "$?" "$logs/torch_cuda_check_torch_first.log"
    fi
  fi

  echo "=== torch_python_check (kolo's wheel, kolo.torch and torch.distributed)"
  local whl
  whl=$(ls "$dir"/wheel/kolo-*.whl 2>/dev/null | head -n 1)
  if [ -z "$whl" ]; then
    result fail torch_python_check "no wheel in the bundle (prepare could not build it)"
  elif ! timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile \
      --upgrade --target "$dir/site" "$whl" >"$logs/wheel_install.log" 2>&1; then
    show_failures "$logs/wheel_install.log"
    result fail torch_python_check "pip could not install ${whl##*/} for this python3"
  else
    # kolorun prefixes each line with its rank: classify reads them bare.
    (cd "$logs" && PYTHONPATH=$dir/site LD_LIBRARY_PATH=$ldpath timeout -k 5 \
      "$(limit 150)" "$dir/bin/kolorun" -np 1 python3 \
      "$dir/project/torch_python_check.py" 2>&1) |
      sed 's/^\[0\] //' >"$logs/torch_python_check.log"
    classify torch_python_check "${PIPESTATUS[0]}" "$logs/torch_python_check.log"
  fi

  if [ -n "${DEVICE_CHECK_LOGS:-}" ] && [ -d "$DEVICE_CHECK_LOGS" ]; then
    tar -C "$dir" -czf "$DEVICE_CHECK_LOGS/device_check_logs.tar.gz" logs 2>/dev/null
  fi
  echo "device_check: $passed passed, $failed failed, $skipped skipped ($SECONDS s)"
  [ "$failed" -eq 0 ]
}

case ${1:-} in
  prepare) shift; prepare "$@" ;;
  run) shift; run "$@" ;;
  "") if command -v bazel >/dev/null; then prepare; else run; fi ;;
  *) usage ;;
esac
