#!/usr/bin/env bash
# kolo's wheel on a clean system, as a user installs it (root; outside
# Bazel, like the multi-host tests):
#
#   tests/packaging/clean_system.sh WHEEL TARBALL
#
# WHEEL from tools/build_wheel.sh, TARBALL from tools/install.sh --tarball,
# both for the PyPI torch pinned in tools/torch-versions.txt.
#
# 1. A minimal Debian 12 root (debootstrap --variant=minbase with python3
#    and python3-venv: no compiler, no Bazel, no -dev package, no
#    /usr/local/cuda, no Debian torch), made once and kept under
#    $KOLO_CLEAN_ROOT (default ~/.cache/kolo/clean-root), with the list of
#    its files.
# 2. In a fresh overlay of that root (in a mount namespace of its own, so
#    that nothing outlives the test): a venv, `pip install` of the wheel,
#    which brings PyPI's torch (tools/torch-versions.txt as constraints;
#    pip's cache is shared with this machine's), and numpy
#    (the example reads the data set with it), then
#    `kolorun -np 2 python mnist.py` on a small workload and a DDP script
#    on the kolo backend, each rank copying its /proc/self/maps at the end.
#    The maps may name no file outside the wheel, torch's install and the
#    minimal root, and kolo's gloo, protobuf and abseil must be the wheel's
#    copies (check_loaded.py); with LD_DEBUG=bindings, no gloo, protobuf or
#    abseil name kolo looks up may be served by torch's own copies.
#    Then the C++ tarball: with g++, pkg-config and CMake from Debian's
#    archive (apt's downloads kept in the cache), docs/torch.md's program
#    (tests/frontends/torch/cmake_consumer) is built against the tarball
#    and the venv's LibTorch with pkg-config and with CMake; the first
#    trains at -np 2 under the tarball's kolorun; neither may link anything
#    outside the tarball, the venv and the root.
# 3. The same wheel on this machine, next to Debian's libgloo, libprotobuf,
#    libabsl and /usr/local/cuda's NCCL (LD_LIBRARY_PATH pointing at them
#    too): the same checks.
# 4. auditwheel agrees with the wheel's platform tag (the newest glibc
#    symbol version it uses), and a torch of another minor version next to
#    the wheel fails at import with one line naming both.
# Prints "PASSED packaging/<check>" or "FAILED packaging/<check>" per check.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
[ $# -eq 2 ] || { echo "usage: $0 WHEEL TARBALL" >&2; exit 2; }
wheel=$(readlink -f "$1")
tarball=$(readlink -f "$2")
pins=$(readlink -f tools/torch-versions.txt)
cache=${KOLO_CLEAN_ROOT:-$HOME/.cache/kolo/clean-root}
base=$cache/bookworm-minbase
status=0
pass() { echo "PASSED packaging/$1"; }
fail() { echo "FAILED packaging/$1${2:+: $2}"; status=1; }

# 1. The minimal root, once. A root whose stamp is missing is made anew.
if [ ! -f "$base.done" ]; then
  rm -rf "$base" "$base.files"
  mkdir -p "$cache"
  echo "clean_system: making a minimal Debian 12 root at $base (debootstrap)"
  if ! debootstrap --variant=minbase --include=python3,python3-venv bookworm \
       "$base" http://deb.debian.org/debian > "$cache/debootstrap.log" 2>&1; then
    tail -20 "$cache/debootstrap.log"
    fail clean-root "debootstrap failed ($cache/debootstrap.log)"
    exit 1
  fi
  rm -rf "$base"/var/cache/apt/archives/*.deb
  (cd "$base" && find . -xdev \( -type f -o -type l \) | sed 's|^\.||') > "$base.files"
  touch "$base.done"
fi

work=$(mktemp -d /tmp/kolo-clean-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"/{upper,overlay-work,root,out,host-out}
cp "$base.files" "$work/out/base.files"

# What runs inside the root, as a user would: no network but PyPI's (pip),
# nothing from this machine but the wheel, the test scripts, the data set
# and pip's cache.
cat > "$work/inside.sh" <<'EOF'
set -u
out=/kolo-test/out
result() { echo "$1" >> $out/results; }
# The root is the clean system the issue names.
for tool in gcc cc g++ c++ clang bazel; do
  if command -v $tool >/dev/null; then result "FAILED clean-root: $tool is there"; exit 1; fi
done
if [ -e /usr/local/cuda ] || ls /usr/include/google /usr/include/gloo \
     /usr/lib/python3/dist-packages/torch >/dev/null 2>&1 ||
   dpkg-query -W -f '${Package}\n' | grep -q -- '-dev$'; then
  result "FAILED clean-root: a development package, CUDA or Debian's torch is there"
  exit 1
fi
result "PASSED clean-root"
python3 -m venv /venv || { result "FAILED venv"; exit 1; }
if ! /venv/bin/pip install -q --disable-pip-version-check \
       -c /kolo-test/pins.txt /kolo-test/$(basename /kolo-test/kolo-*.whl) numpy \
       > $out/pip.log 2>&1; then
  tail -20 $out/pip.log; result "FAILED pip-install"; exit 1
fi
result "PASSED pip-install"
site=$(/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
export KOLO_MAPS_DIR=$out/maps-mnist
mkdir -p $KOLO_MAPS_DIR $out/maps-ddp
cd /tmp
if /venv/bin/kolorun -np 2 /venv/bin/python /kolo-test/with_maps.py \
     /kolo-test/mnist.py --epochs 1 --limit-train 1024 --limit-test 500 \
     --min-accuracy 40 > $out/mnist.log 2>&1 &&
   [ "$(grep -c '\] OK rank' $out/mnist.log)" -eq 2 ]; then
  result "PASSED mnist-np2"
else
  tail -30 $out/mnist.log; result "FAILED mnist-np2"
fi
export KOLO_MAPS_DIR=$out/maps-ddp
if /venv/bin/kolorun -np 2 /venv/bin/python /kolo-test/with_maps.py \
     /kolo-test/ddp_train.py > $out/ddp.log 2>&1 &&
   [ "$(grep -c 'DDP OK rank' $out/ddp.log)" -eq 2 ]; then
  result "PASSED ddp-np2"
else
  tail -30 $out/ddp.log; result "FAILED ddp-np2"
fi
LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT=$out/bindings \
  /venv/bin/python -c 'import kolo.torch' 2>/dev/null
cat $out/bindings.* > $out/bindings.log 2>/dev/null
if /venv/bin/python /kolo-test/check_loaded.py --base $out/base.files \
     --allow "$site" --bindings $out/bindings.log \
     $out/maps-mnist/* $out/maps-ddp/* > $out/loaded.log 2>&1; then
  result "PASSED loaded-only-wheel-and-torch"
else
  head -20 $out/loaded.log; result "FAILED loaded-only-wheel-and-torch"
fi
tail -1 $out/loaded.log

# The C++ tarball, with a compiler: only g++ and pkg-config are added.
if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install \
         -y -q --no-install-recommends g++ pkg-config cmake make; } > $out/apt.log 2>&1; then
  tail -20 $out/apt.log; result "FAILED cpp-tarball: apt-get install g++ pkg-config cmake"
  exit 0
fi
mkdir -p /opt/kolo && tar -xzf /kolo-test/kolo-*.tar.gz -C /opt/kolo
prefix=$(echo /opt/kolo/kolo-*)
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
flags=$(pkg-config --define-variable=torch_root=$site/torch --cflags --libs kolo)
if ! g++ -O1 /kolo-test/train.cc $flags -o /tmp/train > $out/cpp-build.log 2>&1; then
  tail -30 $out/cpp-build.log; result "FAILED cpp-tarball-build"
  exit 0
fi
if ! { cmake -S /kolo-test/cmake_consumer -B /tmp/build -DCMAKE_PREFIX_PATH=$prefix \
         -Dkolo_TORCH_ROOT=$site/torch -DCMAKE_BUILD_TYPE=Release &&
       cmake --build /tmp/build -j 2; } > $out/cpp-cmake.log 2>&1; then
  tail -30 $out/cpp-cmake.log; result "FAILED cpp-tarball-build"
  exit 0
fi
result "PASSED cpp-tarball-build"
mkdir -p /tmp/data
for f in /usr/share/datasets/fashion-mnist/*-ubyte.gz; do
  gzip -dc $f > /tmp/data/$(basename $f .gz)
done
if $prefix/bin/kolorun -np 2 /tmp/train /tmp/data 1 /tmp/checkpoint 20 \
     > $out/cpp-train.log 2>&1 &&
   [ "$(grep -cE '^\[[01]\] rank [01] parameters ' $out/cpp-train.log)" -eq 2 ] &&
   grep -qE '^\[0\] test accuracy [0-9.]+% of 10000$' $out/cpp-train.log; then
  result "PASSED cpp-tarball-train-np2"
else
  tail -30 $out/cpp-train.log; result "FAILED cpp-tarball-train-np2"
fi
# What the program links: the tarball's, the venv's torch, the root's own.
stray=""
for program in /tmp/train /tmp/build/train; do
  for lib in $(ldd $program | sed -n 's/.*=> \(\/[^ ]*\) (0x.*/\1/p'); do
    real=$(readlink -f $lib)
    case $real in $prefix/*|$site/*) continue ;; esac
    grep -qxF "$real" $out/base.files || stray="$stray $real"
  done
  if ldd $program | grep -q 'not found'; then stray="$stray ($program: a library not found)"; fi
done
if [ -z "$stray" ]; then result "PASSED cpp-tarball-links-only-its-own"; else
  echo "linked from outside:$stray"; result "FAILED cpp-tarball-links-only-its-own"; fi
EOF

mkdir -p "$work/upper/kolo-test/out" "$work/upper/etc"
cp "$wheel" "$tarball" "$work/upper/kolo-test/"
cp tests/frontends/torch/cmake_consumer/train.cc "$work/upper/kolo-test/"
cp -r tests/frontends/torch/cmake_consumer "$work/upper/kolo-test/"
cp "$pins" "$work/upper/kolo-test/pins.txt"
cp frontends/python/examples/mnist.py tests/packaging/ddp_train.py \
  tests/packaging/with_maps.py tests/packaging/check_loaded.py \
  "$work/inside.sh" "$work/upper/kolo-test/"
cp "$work/out/base.files" "$work/upper/kolo-test/out/"
cp /etc/resolv.conf "$work/upper/etc/resolv.conf"
# This machine's certificate authorities (its network may answer for PyPI
# with a certificate of its own).
mkdir -p "$work/upper/etc/ssl/certs"
cp /etc/ssl/certs/ca-certificates.crt "$work/upper/etc/ssl/certs/"
mkdir -p "$HOME/.cache/pip" "$cache/apt-archives/partial"

# 2. Inside the root, in a mount namespace that takes every mount with it.
echo "clean_system: installing and running the wheel in a fresh copy of $base"
unshare --mount --propagation private /bin/bash -c '
  set -e
  base=$1 work=$2 pipcache=$3 aptcache=$4
  mount -t overlay overlay -o "lowerdir=$base,upperdir=$work/upper,workdir=$work/overlay-work" "$work/root"
  r=$work/root
  mount -t proc proc "$r/proc"
  mount --rbind /dev "$r/dev"
  mount -t tmpfs -o size=2g tmpfs "$r/dev/shm"
  mount -t sysfs sysfs "$r/sys"
  mkdir -p "$r/root/.cache/pip" "$r/usr/share/datasets/fashion-mnist"
  mount --bind "$pipcache" "$r/root/.cache/pip"
  mount --bind "$aptcache" "$r/var/cache/apt/archives"
  mount --bind -o ro /usr/share/datasets/fashion-mnist "$r/usr/share/datasets/fashion-mnist"
  exec chroot "$r" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root \
    /bin/bash /kolo-test/inside.sh
' clean-root "$base" "$work" "$HOME/.cache/pip" "$cache/apt-archives"
results="$work/upper/kolo-test/out/results"
if [ ! -s "$results" ]; then
  fail clean-root "the run in the root left no results"
else
  while read -r verdict name; do
    if [ "$verdict" = PASSED ]; then pass "clean-root/$name"; else
      fail "clean-root/$name"; fi
  done < "$results"
fi

# 3. The same wheel on this machine, next to Debian's gloo, protobuf,
# abseil and /usr/local/cuda's NCCL, with LD_LIBRARY_PATH pointing at them:
# a venv that sees the pinned torch's venv (tools/torch_env.sh) and gets
# the wheel from pip, without an index (pip's check of torch is the root's).
echo "clean_system: the same wheel on this machine, beside Debian's libraries"
if torch_python=$(tools/torch_env.sh "$pins"); then
  torch_site=$("$torch_python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
  host_venv=$work/host-venv
  python_bin=$(readlink -f "$torch_python")
  "$python_bin" -m venv "$host_venv"
  host_site=$("$host_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
  echo "$torch_site" > "$host_site/torch-venv.pth"
  out=$work/host-out
  mkdir -p "$out/maps-mnist" "$out/maps-ddp"
  if "$host_venv/bin/pip" install -q --no-index --no-deps \
       --disable-pip-version-check "$wheel" > "$out/pip.log" 2>&1; then
    pass host/pip-install
  else
    cat "$out/pip.log"; fail host/pip-install
  fi
  tempt=/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
  for job in mnist ddp; do
    if [ $job = mnist ]; then
      args=("$repo/frontends/python/examples/mnist.py" --epochs 1
            --limit-train 1024 --limit-test 500 --min-accuracy 40)
      ok='\] OK rank'
    else
      args=("$repo/tests/packaging/ddp_train.py"); ok='DDP OK rank'
    fi
    if (cd "$out" && env -u PYTHONPATH KOLO_MAPS_DIR="$out/maps-$job" \
          LD_LIBRARY_PATH=$tempt "$host_venv/bin/kolorun" -np 2 \
          "$host_venv/bin/python" "$repo/tests/packaging/with_maps.py" \
          "${args[@]}") > "$out/$job.log" 2>&1 &&
       [ "$(grep -c "$ok" "$out/$job.log")" -eq 2 ]; then
      pass "host/$job-np2"
    else
      tail -30 "$out/$job.log"; fail "host/$job-np2"
    fi
  done
  (cd "$out" && env -u PYTHONPATH LD_LIBRARY_PATH=$tempt LD_BIND_NOW=1 \
     LD_DEBUG=bindings LD_DEBUG_OUTPUT="$out/bindings" \
     "$host_venv/bin/python" -c 'import kolo.torch') 2>/dev/null
  cat "$out"/bindings.* > "$out/bindings.log" 2>/dev/null
  if "$host_venv/bin/python" tests/packaging/check_loaded.py \
       --base "$work/out/base.files" --allow "$host_site" --allow "$torch_site" \
       --bindings "$out/bindings.log" "$out"/maps-mnist/* "$out"/maps-ddp/* \
       > "$out/loaded.log" 2>&1; then
    tail -1 "$out/loaded.log"; pass host/loaded-only-wheel-and-torch
  else
    head -20 "$out/loaded.log"; fail host/loaded-only-wheel-and-torch
  fi
else
  fail host "no venv with the pinned torch (tools/torch_env.sh $pins)"
fi

# 4. auditwheel's own reading of the wheel: the newest symbol versions it
# uses allow exactly the platform tag in its name.
tag=$(basename "$wheel" .whl | sed 's/.*-//')
if tools_bin=$(tools/wheel_tools.sh) &&
   sym_tag=$(mkdir -p "$work/no-libraries" &&
             "$tools_bin/auditwheel" show --json --ldpaths "$work/no-libraries" "$wheel" 2>/dev/null |
             "$tools_bin/python" -c 'import json, sys; print(json.load(sys.stdin)["sym_tag"])') &&
   [ "$sym_tag" = "$tag" ] && [ "${tag#manylinux_}" != "$tag" ]; then
  pass auditwheel-tag
else
  fail auditwheel-tag "the wheel says $tag, auditwheel ${sym_tag:-nothing}"
fi

# And next to a torch of another minor version (Debian's 1.13): pip refuses
# it, and where pip is bypassed, the import names both torches.
other=$work/other-torch
/usr/bin/python3 -m venv --system-site-packages "$other"
if "$other/bin/pip" install -q --no-index --disable-pip-version-check \
     "$wheel" > "$work/other-pip.log" 2>&1; then
  fail other-torch/pip "pip installed a wheel for another torch"
elif grep -q "torch==" "$work/other-pip.log"; then
  pass other-torch/pip
else
  cat "$work/other-pip.log"; fail other-torch/pip "pip failed for another reason"
fi
"$other/bin/pip" install -q --no-index --no-deps --disable-pip-version-check \
  "$wheel" > /dev/null 2>&1
message=$(cd "$work" && env -u PYTHONPATH "$other/bin/python" -c 'import kolo.torch' 2>&1 | tail -1)
built=$(sed -n 's/^torch==//p' "$pins")
if [[ "$message" == ImportError:*"built for torch $built"*"has torch 1.13"* ]]; then
  pass other-torch/import
else
  fail other-torch/import "import said: $message"
fi
exit $status
